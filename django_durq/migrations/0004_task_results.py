from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_durq", "0003_handbacks"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="result_key",
            field=models.BigIntegerField(blank=True, help_text="Random part of the task's result id.", null=True),
        ),
        migrations.AddField(
            model_name="job",
            name="run_after_us",
            field=models.BigIntegerField(
                blank=True, help_text="The task's run_after in epoch microseconds; NULL when it had none.", null=True
            ),
        ),
    ]
