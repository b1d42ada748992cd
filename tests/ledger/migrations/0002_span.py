from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("ledger", "0001_initial")]

    operations = [
        migrations.CreateModel(
            name="Span",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("job_id", models.BigIntegerField(db_index=True)),
                ("token", models.BigIntegerField()),
                ("attempt", models.IntegerField()),
                ("pid", models.IntegerField()),
                ("queue", models.CharField(max_length=100)),
                ("key", models.CharField(blank=True, default="", max_length=255)),
                ("limit_running", models.IntegerField(null=True)),
                ("limit_rate", models.IntegerField(null=True)),
                ("limit_period_ms", models.BigIntegerField(null=True)),
                ("claim_ms", models.BigIntegerField(null=True)),
                ("start_us", models.BigIntegerField()),
                ("end_us", models.BigIntegerField(null=True)),
                ("outcome", models.CharField(blank=True, default="", max_length=20)),
                ("tag", models.CharField(blank=True, default="", max_length=100)),
            ],
        ),
    ]
