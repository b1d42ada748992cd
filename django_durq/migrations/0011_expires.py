"""A job's expiry: ``expires_ms``, when a job that no worker has started is dropped.

The column is nullable and has no default, so every database adds it without rewriting the table
(SQLite with ``ALTER TABLE … ADD COLUMN``: the partial indexes of 0002, 0005, 0006 and 0008 stay).

The maintenance sweep (``db/expiry.py``) looks for waiting jobs whose expiry has passed. Its index
holds exactly those rows and no other, so an enqueue without an expiry, and a claim or a
completion of any job, writes no entry to it:

- SQLite and PostgreSQL: a partial index over ``expires_ms`` of waiting rows that have one;
- MariaDB, which has no partial indexes: an index over a virtual column that is ``expires_ms`` on
  a waiting row and NULL otherwise (``expires_waiting``), outside Django's model state like the
  partial indexes of 0002. A row whose indexed value stays NULL changes no index entry.

A later migration that rebuilds ``durq_job`` on SQLite must make ``_EXPIRES_PARTIAL`` again (see
0008's ``_partial_indexes``).
"""

from django.db import migrations, models

_EXPIRES_PARTIAL = "CREATE INDEX durq_job_expires ON durq_job (expires_ms) WHERE status = 'waiting' AND expires_ms IS NOT NULL"
_EXPIRES_VIRTUAL = (
    "ALTER TABLE durq_job ADD COLUMN expires_waiting BIGINT AS (CASE WHEN status = 'waiting' THEN expires_ms END) VIRTUAL,"
    " ADD INDEX durq_job_expires (expires_waiting)"
)


def add_expires_index(apps, schema_editor) -> None:
    if schema_editor.connection.vendor in ("sqlite", "postgresql"):
        schema_editor.execute(_EXPIRES_PARTIAL)
    else:
        schema_editor.execute(_EXPIRES_VIRTUAL)


def drop_expires_index(apps, schema_editor) -> None:
    if schema_editor.connection.vendor in ("sqlite", "postgresql"):
        schema_editor.execute("DROP INDEX durq_job_expires")
    else:
        schema_editor.execute("ALTER TABLE durq_job DROP INDEX durq_job_expires, DROP COLUMN expires_waiting")


class Migration(migrations.Migration):
    dependencies = [("django_durq", "0010_unknown_type_stat")]

    operations = [
        migrations.AddField(
            model_name="job",
            name="expires_ms",
            field=models.BigIntegerField(blank=True, help_text="Not started by then: cancelled, never run.", null=True),
        ),
        # Not atomic: MariaDB cannot roll DDL back, and Django refuses DDL in a transaction there.
        migrations.RunPython(add_expires_index, drop_expires_index, atomic=False, elidable=False),
    ]
