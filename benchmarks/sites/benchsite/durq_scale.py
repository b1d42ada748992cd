"""django-durq at scale: bulk rows straight in SQL, the cost of one claim, admin page render times."""

import json
import statistics
import time

from django.db import connection

# Column values for the bulk rows; anything else takes the model default or NULL.
# "{n}" is the row number of the generating series, "{now}" the current epoch ms.
_COMMON = {
    "name": "'bench.noop'",
    "queue": "'default'",
    "priority": "0",
    "arguments": '\'{"args": [], "kwargs": {"i": 0}}\'',
    "max_attempts": "5",
    "lease_ms": "60000",
    "claimed_by": "'bench-fill'",
    "stop_requested": "FALSE",
    "claim_token": "1",
    "errors": "'[]'",
}
_DEAD_ERRORS = json.dumps(
    [{"attempt": 5, "at_ms": 0, "worker": "bench-fill", "kind": "exception", "type": "ValueError", "message": "boom"}]
)
_KINDS = {
    "finished": {
        "status": "'finished'",
        "attempts": "1",
        "run_at_ms": "{now} - 86400000 + {n}",
        "created_ms": "{now} - 86400000 + {n}",
        "started_ms": "{now} - 86400000 + {n}",
        "finished_ms": "{now} - 86400000 + {n}",
    },
    "dead": {
        "status": "'dead'",
        "attempts": "5",
        "run_at_ms": "{now} - 86400000 + {n}",
        "created_ms": "{now} - 86400000 + {n}",
        "started_ms": "{now} - 86400000 + {n}",
        "finished_ms": "{now} - 86400000 + {n}",
        "errors": "'" + _DEAD_ERRORS + "'",
    },
    "delayed": {
        "status": "'waiting'",
        "attempts": "0",
        "claim_token": "0",
        "claimed_by": "''",
        "run_at_ms": "{now} + 86400000 + {n}",
        "created_ms": "{now}",
    },
}


def _columns():
    from django_durq.models import Job

    columns = []
    for field in Job._meta.concrete_fields:
        if field.primary_key or getattr(field, "generated", False):
            continue
        columns.append(field)
    return columns


def _literal(field):
    if field.has_default() and not callable(field.default):
        value = field.get_db_prep_value(field.default, connection)
        if isinstance(value, bool):
            return "TRUE" if value else "FALSE"
        if isinstance(value, (int, float)):
            return str(value)
        return "'" + str(value).replace("'", "''") + "'"
    if field.null:
        return "NULL"
    raise RuntimeError(f"durq_job.{field.column} needs a value in benchsite/durq_scale.py")


def _insert(kind, count, now):
    if count <= 0:
        return
    values = {**_COMMON, **_KINDS[kind]}
    vendor = connection.vendor
    n = "seq" if vendor == "mysql" else "n"
    names = []
    expressions = []
    for field in _columns():
        names.append(connection.ops.quote_name(field.column))
        expression = values.get(field.column)
        expressions.append(expression.replace("{n}", n).replace("{now}", str(now)) if expression else _literal(field))
    select = ", ".join(expressions)
    table = connection.ops.quote_name("durq_job")
    if vendor == "sqlite":
        sql = (
            f"INSERT INTO {table} ({', '.join(names)}) WITH RECURSIVE seq(n) AS "
            f"(SELECT 1 UNION ALL SELECT n + 1 FROM seq WHERE n < {int(count)}) SELECT {select} FROM seq"
        )
    elif vendor == "postgresql":
        sql = f"INSERT INTO {table} ({', '.join(names)}) SELECT {select} FROM generate_series(1, {int(count)}) AS seq(n)"
    else:
        sql = f"INSERT INTO {table} ({', '.join(names)}) SELECT {select} FROM seq_1_to_{int(count)}"
    with connection.cursor() as cursor:
        cursor.execute(sql)


def fill(finished, dead, delayed):
    from django.db import transaction

    now = int(time.time() * 1000)
    started = time.perf_counter()
    for kind, count in (("finished", finished), ("dead", dead), ("delayed", delayed)):
        with transaction.atomic():
            _insert(kind, count, now)
    with connection.cursor() as cursor:
        if connection.vendor == "mysql":
            cursor.execute("ANALYZE TABLE durq_job")
            cursor.fetchall()
        else:
            cursor.execute("ANALYZE")
    return {"rows": finished + dead + delayed, "seconds": time.perf_counter() - started}


def claim_cost(n, batch):
    """Median time of one claim of ``batch`` jobs, of one fenced completion, and of the idle probe."""
    from django_durq.clock import now_ms

    try:
        from django_durq.db.store import Store
    except ImportError:
        from django_durq.store import Store  # a revision from before the rooms (#32)

    store = Store("default")
    claims, completes, probes = [], [], []
    for _ in range(n):
        t0 = time.perf_counter()
        store.due_times("default")
        t1 = time.perf_counter()
        jobs = store.claim("default", batch, now_ms(), "bench-claim")
        t2 = time.perf_counter()
        store.dialect.complete([(job.id, job.claim_token) for job in jobs])
        t3 = time.perf_counter()
        probes.append(t1 - t0)
        claims.append(t2 - t1)
        completes.append(t3 - t2)
        if not jobs:
            break
    return {
        "claims": len(claims),
        "batch": batch,
        "claim_ms": statistics.median(claims) * 1000,
        "complete_ms": statistics.median(completes) * 1000,
        "probe_ms": statistics.median(probes) * 1000,
    }


def admin_render(repeats):
    """Median render time of the job changelist and the dead-letter page, when the admin has them."""
    from django.contrib import admin
    from django.contrib.auth import get_user_model
    from django.test import Client
    from django.urls import reverse

    from django_durq import models

    user, _ = get_user_model().objects.get_or_create(username="bench", defaults={"is_staff": True, "is_superuser": True})
    client = Client()
    client.force_login(user)
    pages = {}
    for label, model in (("changelist", models.Job), ("dead_letters", getattr(models, "DeadLetter", None))):
        if model is None or not admin.site.is_registered(model):
            pages[label] = None
            continue
        url = reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_changelist")
        client.get(url)
        times = []
        status = None
        for _ in range(repeats):
            t0 = time.perf_counter()
            response = client.get(url)
            times.append(time.perf_counter() - t0)
            status = response.status_code
        pages[label] = {"ms": statistics.median(times) * 1000, "status": status}
    return pages
