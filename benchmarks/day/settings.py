"""The compressed day's Django settings: what a user would write, one database, nothing tuned.

The harness passes the database in the environment: ``DURQ_DAY_DB`` (sqlite, postgres or mysql),
``DURQ_DAY_NAME`` (a file or a database name), ``DURQ_DAY_PORT`` (PostgreSQL: PgBouncer's port, as
the one ``DATABASE_URL`` of a site behind a pooler; MariaDB: its own server's). With
``DURQ_DAY_DIRECT_PORT`` the workers LISTEN and hold their presence locks on a direct connection
(``DURQ["LISTEN_DATABASE"]``), as docs/postgresql.md describes; without it, nothing says the
database goes through a pooler.
"""

import os
from typing import Any

SECRET_KEY = "durq-compressed-day"
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth", "django_durq"]

VENDOR = os.environ.get("DURQ_DAY_DB", "sqlite")
NAME = os.environ.get("DURQ_DAY_NAME", "day.sqlite3")
DATABASES: dict[str, dict[str, Any]]
if VENDOR == "sqlite":
    # As docs/sqlite.md recommends.
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": NAME,
            "OPTIONS": {
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
                "transaction_mode": "IMMEDIATE",
                "timeout": 20,
            },
        }
    }
elif VENDOR == "postgres":
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": NAME,
            "HOST": "127.0.0.1",
            "PORT": os.environ["DURQ_DAY_PORT"],
            "USER": "postgres",
        }
    }
elif VENDOR == "mysql":
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.mysql",
            "NAME": NAME,
            "HOST": "127.0.0.1",
            "PORT": os.environ["DURQ_DAY_PORT"],
            "USER": "root",
            "OPTIONS": {"charset": "utf8mb4"},
        }
    }
else:
    raise RuntimeError(f"DURQ_DAY_DB={VENDOR!r}: sqlite, postgres or mysql")

DURQ: dict[str, Any] = {
    "QUEUES": {"default": {"concurrency": int(os.environ.get("DURQ_DAY_CONCURRENCY", "12"))}},
    "MODULES": ["benchmarks.day.jobs"],
    # An hour of history in a compressed day: the table reaches its steady size within the run.
    "KEEP_FINISHED": float(os.environ.get("DURQ_DAY_KEEP_FINISHED", "120")),
}
if os.environ.get("DURQ_DAY_DIRECT_PORT"):
    DATABASES["direct"] = {**DATABASES["default"], "PORT": os.environ["DURQ_DAY_DIRECT_PORT"]}
    DURQ["LISTEN_DATABASE"] = "direct"

# A worker at a thousand jobs a second logs takeovers, hand-backs and failures, not every finished job.
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"levels": {"format": "%(asctime)s %(levelname)s %(message)s"}},
    "handlers": {"stderr": {"class": "logging.StreamHandler", "formatter": "levels"}},
    "loggers": {
        "django_durq": {"handlers": ["stderr"], "level": "INFO"},
        "django_durq.jobs": {"handlers": ["stderr"], "level": "WARNING", "propagate": False},
    },
}
