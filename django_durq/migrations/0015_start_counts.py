"""A row of the start log holds the starts of one claim on one scope (``durq_start.starts``).

Every row written before holds one start, which the database's default gives it; a worker of an
earlier version that still writes one row per start writes the same.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("django_durq", "0014_worker_beat")]

    operations = [
        migrations.AddField(
            model_name="jobstart",
            name="starts",
            field=models.PositiveIntegerField(db_default=1, default=1, help_text="How many jobs started at started_ms."),
        ),
    ]
