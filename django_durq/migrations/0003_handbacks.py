"""Count the hand-backs of started attempts (``DURQ["MAX_HANDBACKS"]`` bounds them).

On SQLite the column is added in place: Django would rebuild the table for a NOT NULL column,
which brings back the full indexes that migration 0002 replaced by partial ones. The column
keeps a database default of 0, so rows inserted by any version of the queue get one.
"""

from django.db import migrations, models

_SQLITE_ADD = 'ALTER TABLE durq_job ADD COLUMN "handbacks" integer unsigned NOT NULL DEFAULT 0'
_SQLITE_DROP = 'ALTER TABLE durq_job DROP COLUMN "handbacks"'


def _field(model) -> models.Field:
    field = models.PositiveIntegerField(default=0, db_default=0)
    field.set_attributes_from_name("handbacks")
    field.model = model
    return field


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor == "sqlite":
        schema_editor.execute(_SQLITE_ADD)
    else:
        job = apps.get_model("django_durq", "Job")
        schema_editor.add_field(job, _field(job))


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor == "sqlite":
        schema_editor.execute(_SQLITE_DROP)
    else:
        job = apps.get_model("django_durq", "Job")
        schema_editor.remove_field(job, _field(job))


class Migration(migrations.Migration):
    dependencies = [("django_durq", "0002_partial_indexes")]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunPython(forwards, backwards, elidable=False)],
            state_operations=[
                migrations.AddField(
                    model_name="job",
                    name="handbacks",
                    field=models.PositiveIntegerField(
                        db_default=0,
                        default=0,
                        help_text="Started attempts handed back at a worker's stop; bounded by MAX_HANDBACKS.",
                    ),
                ),
            ],
        ),
    ]
