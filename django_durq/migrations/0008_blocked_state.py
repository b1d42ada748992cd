"""A job that waits for upstream jobs is ``blocked``, a status of its own, instead of due at 9999-12-31.

Three changes to ``durq_job``, on every database:

- the status check constraint allows ``'blocked'``;
- ``unique_active`` keeps a blocked job's dedupe key (a generated column: dropped and added again,
  which rewrites the table on PostgreSQL and MariaDB);
- rows parked at the old sentinel (``waiting``, ``deps_left > 0``) become ``blocked``. Their real
  due time was overwritten by the sentinel, so they take their creation time: the release makes
  a job due at the later of its own due time and the release, that is at its release.

SQLite keeps a check constraint and a generated column in the table's definition, so it rebuilds
the table from the model, as migration 0002's docstring warns: the partial indexes of 0002, 0005
and 0006 are made again afterwards. SQLite and PostgreSQL also get ``durq_job_blocked``, the
blocked rows by queue (their claim and due indexes hold waiting rows only); on MariaDB the full
claim index, which leads with (queue, status), serves the same reads.

Reversing it parks blocked rows at the sentinel again and restores both definitions.
"""

from importlib import import_module

from django.db import migrations, models

# The due time migrations before this one gave a job that waits: 9999-12-31T23:59:59Z.
_SENTINEL_MS = 253_402_300_799_000
_BLOCKED_INDEX = "CREATE INDEX durq_job_blocked ON durq_job (queue) WHERE status = 'blocked'"
_KEYED = ["waiting", "blocked", "running"]
_STATUSES = ["waiting", "blocked", "running", "finished", "dead", "cancelled"]


def _constraint(job, name: str) -> models.BaseConstraint:
    return next(constraint for constraint in job._meta.constraints if constraint.name == name)


def _partial_indexes() -> list[str]:
    """The statements of 0002, 0005 and 0006 that make SQLite's indexes partial on a table Django rebuilt."""
    partial = import_module("django_durq.migrations.0002_partial_indexes")
    flow = import_module("django_durq.migrations.0005_flow_control")
    workflows = import_module("django_durq.migrations.0006_workflows")
    return [
        partial._PARTIAL_UNIQUE,
        *(forward for forward, _ in partial._REPLACE),
        flow._LIMITED_PARTIAL,
        workflows._WORKFLOW_PARTIAL,
    ]


def match_model(apps, schema_editor) -> None:
    """Make the table's status check and ``unique_active`` what the model of ``apps`` declares."""
    job = apps.get_model("django_durq", "Job")
    check = _constraint(job, "durq_job_status_valid")
    unique = _constraint(job, "durq_job_unique_active")
    vendor = schema_editor.connection.vendor
    if vendor == "sqlite":
        # A rebuild from the model; the unique constraint is a partial index here (0002), made below.
        declared = job._meta.constraints
        job._meta.constraints = [constraint for constraint in declared if constraint is not unique]
        try:
            schema_editor.add_constraint(job, check)
        finally:
            job._meta.constraints = declared
        for statement in _partial_indexes():
            schema_editor.execute(statement)
        return
    generated = job._meta.get_field("unique_active")
    schema_editor.remove_constraint(job, check)
    schema_editor.add_constraint(job, check)
    schema_editor.remove_field(job, generated)  # its unique index goes with it
    schema_editor.add_field(job, generated)
    if vendor == "postgresql":
        schema_editor.execute(import_module("django_durq.migrations.0002_partial_indexes")._PARTIAL_UNIQUE)
    else:
        schema_editor.add_constraint(job, unique)


def add_blocked_index(apps, schema_editor) -> None:
    if schema_editor.connection.vendor in ("sqlite", "postgresql"):
        schema_editor.execute(_BLOCKED_INDEX)


def drop_blocked_index(apps, schema_editor) -> None:
    if schema_editor.connection.vendor in ("sqlite", "postgresql"):
        schema_editor.execute("DROP INDEX durq_job_blocked")


def block_parked_rows(apps, schema_editor) -> None:
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(
            "UPDATE durq_job SET status = 'blocked', run_at_ms = CASE WHEN run_at_ms >= %s THEN created_ms ELSE run_at_ms END"
            " WHERE status = 'waiting' AND deps_left > 0",
            [_SENTINEL_MS],
        )


def park_blocked_rows(apps, schema_editor) -> None:
    with schema_editor.connection.cursor() as cursor:
        cursor.execute("UPDATE durq_job SET status = 'waiting', run_at_ms = %s WHERE status = 'blocked'", [_SENTINEL_MS])


class Migration(migrations.Migration):
    dependencies = [("django_durq", "0007_worker_holds_lock")]

    # Not atomic where DDL runs: MariaDB cannot roll DDL back, and Django refuses DDL in a
    # transaction there. Reversed, the first operation restores the table from the model before.
    operations = [
        migrations.RunPython(migrations.RunPython.noop, match_model, atomic=False, elidable=False),
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RemoveConstraint(model_name="job", name="durq_job_status_valid"),
                migrations.AlterField(
                    model_name="job",
                    name="status",
                    field=models.CharField(
                        choices=[
                            ("waiting", "Waiting"),
                            ("blocked", "Blocked"),
                            ("running", "Running"),
                            ("finished", "Finished"),
                            ("dead", "Dead"),
                            ("cancelled", "Cancelled"),
                        ],
                        default="waiting",
                        max_length=10,
                    ),
                ),
                migrations.AlterField(
                    model_name="job",
                    name="unique_active",
                    field=models.GeneratedField(
                        db_persist=True,
                        expression=models.Case(models.When(status__in=_KEYED, then=models.F("unique_key")), default=None),
                        output_field=models.CharField(max_length=255, null=True),
                    ),
                ),
                migrations.AddConstraint(
                    model_name="job",
                    constraint=models.CheckConstraint(
                        condition=models.Q(("status__in", _STATUSES)), name="durq_job_status_valid"
                    ),
                ),
            ],
        ),
        migrations.RunPython(match_model, migrations.RunPython.noop, atomic=False, elidable=False),
        migrations.RunPython(block_parked_rows, park_blocked_rows, elidable=False),
        migrations.RunPython(add_blocked_index, drop_blocked_index, atomic=False, elidable=False),
    ]
