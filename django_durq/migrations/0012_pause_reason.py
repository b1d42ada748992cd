"""Who paused or resumed a queue last, when and why: three nullable columns of ``durq_queue_control``.

Nullable without a default, so every database adds them in place (SQLite's ``ADD COLUMN``): no
table is rebuilt, and ``durq_queue_control`` has no partial index to make again anyway.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("django_durq", "0011_expires")]

    operations = [
        migrations.AddField(
            model_name="queuecontrol",
            name="switched_ms",
            field=models.BigIntegerField(blank=True, help_text="When it was last paused or resumed.", null=True),
        ),
        migrations.AddField(
            model_name="queuecontrol",
            name="switched_by",
            field=models.CharField(blank=True, help_text="Who paused or resumed it last.", max_length=150, null=True),
        ),
        migrations.AddField(
            model_name="queuecontrol",
            name="switch_reason",
            field=models.CharField(blank=True, help_text="Why, in their words.", max_length=500, null=True),
        ),
    ]
