from django.db import migrations, models


class Migration(migrations.Migration):
    """Count per minute the jobs a worker handed back because it had no handler for their type.

    Only ``durq_queue_stat`` changes: SQLite rebuilds that small table, never ``durq_job``.
    """

    dependencies = [
        ("django_durq", "0009_limit_places"),
    ]

    operations = [
        migrations.AddField(
            model_name="queuestat",
            name="unknown_type",
            field=models.BigIntegerField(
                db_default=0, default=0, help_text="Jobs handed back by a worker that had no handler for their type."
            ),
        ),
    ]
