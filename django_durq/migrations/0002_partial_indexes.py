"""On SQLite and PostgreSQL, index only the rows each query looks for.

The model declares indexes every supported database can build (MariaDB has no partial
indexes), and that is what migration 0001 made. Where partial indexes exist they are much
cheaper for a queue: a claim moves a row from 'waiting' to 'running' and a completion deletes
it, and every index entry those writes touch is paid for on every job. So on SQLite and
PostgreSQL:

- the claim and due indexes cover only waiting rows, a new lease index only running rows, and
  the index by status and finish time, and a new one by queue, only rows that are finished, dead
  or cancelled (``finished_ms`` is set exactly on those): enqueues and claims add no entry there;
- the dedupe index holds only rows that carry a key (``unique_active`` is NULL for the rest).

The model state is left as declared, so Django sees no change to migrate. A later migration
that rebuilds this table on SQLite would restore the full indexes and must run these steps again.
"""

from django.db import migrations

_REPLACE = [
    ("DROP INDEX durq_job_claim", "CREATE INDEX durq_job_claim ON durq_job (queue, status, priority DESC, run_at_ms, id)"),
    ("DROP INDEX durq_job_due", "CREATE INDEX durq_job_due ON durq_job (queue, status, run_at_ms)"),
    ("DROP INDEX durq_job_status_finished", "CREATE INDEX durq_job_status_finished ON durq_job (status, finished_ms)"),
    (
        "CREATE INDEX durq_job_claim ON durq_job (queue, priority DESC, run_at_ms, id) WHERE status = 'waiting'",
        "DROP INDEX durq_job_claim",
    ),
    ("CREATE INDEX durq_job_due ON durq_job (queue, run_at_ms) WHERE status = 'waiting'", "DROP INDEX durq_job_due"),
    # Queries served by it say "finished_ms IS NOT NULL" (JobQuerySet.dead()) or compare
    # finished_ms, so that both databases can prove the index holds every row they want.
    (
        "CREATE INDEX durq_job_status_finished ON durq_job (status, finished_ms) WHERE finished_ms IS NOT NULL",
        "DROP INDEX durq_job_status_finished",
    ),
    (
        "CREATE INDEX durq_job_lease ON durq_job (queue, lease_expires_ms) WHERE status = 'running'",
        "DROP INDEX durq_job_lease",
    ),
    # Finished, dead and cancelled rows by queue (the admin's queue list seeks through it); a
    # job that is deleted when it finishes never enters it.
    (
        "CREATE INDEX durq_job_done ON durq_job (queue, finished_ms) WHERE finished_ms IS NOT NULL",
        "DROP INDEX durq_job_done",
    ),
]
_PARTIAL_UNIQUE = "CREATE UNIQUE INDEX durq_job_unique_active ON durq_job (unique_active) WHERE unique_active IS NOT NULL"


def _unique_constraint(apps):
    job = apps.get_model("django_durq", "Job")
    constraint = next(c for c in job._meta.constraints if c.name == "durq_job_unique_active")
    return job, constraint


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor not in ("sqlite", "postgresql"):
        return
    job, constraint = _unique_constraint(apps)
    # SQLite rebuilds the table from the model it is given, so that model must no longer carry
    # the constraint (as RemoveConstraint's would); its full indexes come back, replaced below.
    job._meta.constraints = [c for c in job._meta.constraints if c is not constraint]
    schema_editor.remove_constraint(job, constraint)
    schema_editor.execute(_PARTIAL_UNIQUE)
    for forward, _ in _REPLACE:
        schema_editor.execute(forward)


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor not in ("sqlite", "postgresql"):
        return
    for _, backward in reversed(_REPLACE):
        schema_editor.execute(backward)
    schema_editor.execute("DROP INDEX durq_job_unique_active")
    job, constraint = _unique_constraint(apps)
    schema_editor.add_constraint(job, constraint)


class Migration(migrations.Migration):
    dependencies = [("django_durq", "0001_initial")]

    operations = [migrations.RunPython(forwards, backwards, elidable=False)]
