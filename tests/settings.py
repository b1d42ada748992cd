"""Settings for the test suite: the database comes from DURQ_TEST_DB (sqlite, postgres or mysql).

Server addresses default to the local services and can be pointed elsewhere with
DURQ_PG_HOST/PORT/USER and DURQ_MYSQL_HOST/PORT/USER/PASSWORD. DURQ_TEST_DB_NAME names the
test database, so that several runs can share one server. Worker subprocesses started by the
tests get DURQ_TEST_DB_IN_USE, the name of the test database already created, and use it as is.
"""

import importlib.util
import os
import tempfile
from pathlib import Path
from typing import Any

BASE_DIR = Path(__file__).resolve().parent
SECRET_KEY = "durq-tests-only"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
ALLOWED_HOSTS = ["*"]
ROOT_URLCONF = "tests.urls"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_durq",
    "tests.ledger",
]
MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
STATIC_URL = "/static/"

DB = os.environ.get("DURQ_TEST_DB", "sqlite")
DATABASES: dict[str, dict[str, Any]]
TEST_DB_NAME = os.environ.get("DURQ_TEST_DB_NAME", f"test_durq_{os.environ.get('USER', 'ci')}")
IN_USE = os.environ.get("DURQ_TEST_DB_IN_USE")

if DB == "sqlite":
    sqlite_path = os.environ.get("DURQ_SQLITE_PATH") or os.path.join(tempfile.gettempdir(), f"{TEST_DB_NAME}.sqlite3")
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": IN_USE or sqlite_path,
            "OPTIONS": {
                "init_command": os.environ.get("DURQ_SQLITE_INIT", "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;"),
                "transaction_mode": os.environ.get("DURQ_SQLITE_TRANSACTION_MODE", "IMMEDIATE"),
                "timeout": 20,
            },
            "TEST": {"NAME": sqlite_path},
        }
    }
elif DB == "postgres":
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": IN_USE or "test",
            "HOST": os.environ.get("DURQ_PG_HOST", "127.0.0.1"),
            "PORT": os.environ.get("DURQ_PG_PORT", "5432"),
            "USER": os.environ.get("DURQ_PG_USER", "postgres"),
            "PASSWORD": os.environ.get("DURQ_PG_PASSWORD", ""),
            "OPTIONS": {
                "application_name": "durq-tests",
                # What docs/postgresql.md recommends without a transaction-pooling proxy: parameters
                # bound by the server, repeated statements prepared. One CI leg runs this way.
                **({"server_side_binding": True, "prepare_threshold": 5} if os.environ.get("DURQ_PG_PREPARED") else {}),
            },
            "TEST": {"NAME": TEST_DB_NAME},
        }
    }
    if os.environ.get("DURQ_TEST_PGBOUNCER_PORT"):
        # The queue goes through PgBouncer in transaction mode (tests/db/test_pgbouncer.py), which
        # cannot carry prepared statements or server-side cursors; "direct" reaches the server.
        DATABASES["direct"] = dict(DATABASES["default"])
        DATABASES["default"] = {
            **DATABASES["default"],
            "HOST": "127.0.0.1",
            "PORT": os.environ["DURQ_TEST_PGBOUNCER_PORT"],
            "OPTIONS": {"application_name": "durq-tests"},
            "DISABLE_SERVER_SIDE_CURSORS": True,
        }
elif DB == "mysql":
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.mysql",
            "NAME": IN_USE or "test",
            "HOST": os.environ.get("DURQ_MYSQL_HOST", "127.0.0.1"),
            "PORT": os.environ.get("DURQ_MYSQL_PORT", "3306"),
            "USER": os.environ.get("DURQ_MYSQL_USER", "root"),
            "PASSWORD": os.environ.get("DURQ_MYSQL_PASSWORD", ""),
            "OPTIONS": {"charset": "utf8mb4"},
            "TEST": {"NAME": TEST_DB_NAME, "CHARSET": "utf8mb4", "COLLATION": "utf8mb4_bin"},
        }
    }
else:
    raise RuntimeError(f"DURQ_TEST_DB={DB!r}: use sqlite, postgres or mysql")
if DB == "mysql" and os.environ.get("DURQ_TEST_MYSQL_ISOLATION"):
    # Another isolation level than Django's default (READ COMMITTED), as a site may set it.
    DATABASES["default"]["OPTIONS"]["isolation_level"] = os.environ["DURQ_TEST_MYSQL_ISOLATION"]

DURQ = {
    "QUEUES": {
        "default": {"concurrency": 4},
        "fast": {"concurrency": 2},
        "slow": {"concurrency": 1},
        # Flow control across every worker (tests/db/test_flow.py).
        "video": {"concurrency": 4, "max_running": 3},
        "webhooks": {"concurrency": 4, "rate": "10/s"},
    },
    "LEASE": float(os.environ.get("DURQ_TEST_LEASE", "30")),
    "HEARTBEAT_INTERVAL": float(os.environ.get("DURQ_TEST_HEARTBEAT", "5")),
    "POLL_INTERVAL": float(os.environ.get("DURQ_TEST_POLL", "0.25")),
    "SHUTDOWN_GRACE": float(os.environ.get("DURQ_TEST_GRACE", "5")),
    "BACKOFF": {"base": 1, "factor": 2, "max": 60, "jitter": 0.2},
}
if "DURQ_TEST_LISTEN_DATABASE" in os.environ:
    # An alias, or "" for None: no LISTEN, idle workers poll.
    DURQ["LISTEN_DATABASE"] = os.environ["DURQ_TEST_LISTEN_DATABASE"] or None
if os.environ.get("DURQ_TEST_HOOKS_DIR"):
    DURQ["TEST_HOOKS_DIR"] = os.environ["DURQ_TEST_HOOKS_DIR"]
if os.environ.get("DURQ_TEST_PREFETCH"):
    DURQ["PREFETCH"] = float(os.environ["DURQ_TEST_PREFETCH"])
if os.environ.get("DURQ_TEST_SKEW_MS"):
    # This process runs on a "host" whose wall clock is off by that much (tests/faults/test_clock.py).
    from django_durq import clock as _clock

    _skew_ms = int(os.environ["DURQ_TEST_SKEW_MS"])
    _wall_ms = _clock.SystemClock.now_ms
    _clock.SystemClock.now_ms = lambda self: _wall_ms(self) + _skew_ms  # type: ignore[method-assign]

if os.environ.get("DURQ_TEST_OTEL_SPANS"):
    import tests.otel_worker  # noqa: F401 - a worker whose spans a test reads (tests/worker/test_tracing.py)

if os.environ.get("DURQ_TEST_MAX_HANDBACKS"):
    DURQ["MAX_HANDBACKS"] = int(os.environ["DURQ_TEST_MAX_HANDBACKS"])
# "default": no KEEP_FINISHED at all, the product's own default; a number of seconds sets it.
KEEP_FINISHED = os.environ.get("DURQ_TEST_KEEP_FINISHED", "")
if KEEP_FINISHED not in ("", "default"):
    DURQ["KEEP_FINISHED"] = float(KEEP_FINISHED)

# Django's tasks framework (Django >= 6.0, or the django-tasks backport on 5.2) runs on durq.
BUILT_IN_TASKS = importlib.util.find_spec("django.tasks") is not None
if BUILT_IN_TASKS or importlib.util.find_spec("django_tasks"):
    if not BUILT_IN_TASKS:
        INSTALLED_APPS.append("django_tasks")  # the backport is an app: its checks and signals
    TASKS = {"default": {"BACKEND": "django_durq.tasks.backend.DurqBackend", "QUEUES": ["default", "fast", "slow"]}}
    # The suite deletes finished jobs unless asked (DURQ_TEST_KEEP_FINISHED), so most tests also
    # cover that path; the product keeps them by default (an hour, a day with this backend), which
    # the fault catalogue's workers and ops/test_history.py run with. An explicit 0 is durq.E101.
    if KEEP_FINISHED != "default":
        DURQ.setdefault("KEEP_FINISHED", 0)
    SILENCED_SYSTEM_CHECKS = ["durq.E101"]

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"levels": {"format": "%(asctime)s %(levelname)s %(message)s"}},
    "handlers": {"stderr": {"class": "logging.StreamHandler", "formatter": "levels"}},
    "loggers": {"django_durq": {"handlers": ["stderr"], "level": os.environ.get("DURQ_TEST_LOG_LEVEL", "INFO")}},
}
