"""Settings shared by every system, chosen by environment variables set by the harness.

BENCH_SYSTEM   durq, tasks-db, procrastinate, huey-sqlite, huey-postgres or celery-redis
BENCH_DB       sqlite, postgres or mysql (the Django database; Celery's broker is BENCH_REDIS_URL)
BENCH_DB_NAME  the database name, or the SQLite file
BENCH_TICKS    the file each job appends its (number, start time) record to
BENCH_DURQ_PG_DEFAULTS  1: django-durq on PostgreSQL with Django's default connection options
BENCH_DURQ_DURABLE_CLAIMS  1: DURQ["DURABLE_CLAIMS"] = True (every claim waits for its WAL flush)

Each system is configured as its own documentation recommends for production, otherwise with
its defaults: nothing here is tuned for a benchmark.
"""

import os

SYSTEM = os.environ.get("BENCH_SYSTEM", "durq")
DB = os.environ.get("BENCH_DB", "sqlite")
DB_NAME = os.environ.get("BENCH_DB_NAME", "/tmp/bench.sqlite3")

SECRET_KEY = "benchmarks-only"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
ALLOWED_HOSTS = ["*"]
ROOT_URLCONF = "benchsite.urls"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
STATIC_URL = "/static/"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "bench_app",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
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

if DB == "sqlite":
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": DB_NAME,
            # What Django's documentation and django-durq's checks recommend for a busy site.
            "OPTIONS": {
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
                "transaction_mode": "IMMEDIATE",
            },
        }
    }
elif DB == "postgres":
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": DB_NAME,
            "HOST": os.environ.get("DURQ_PG_HOST", "127.0.0.1"),
            "PORT": os.environ.get("DURQ_PG_PORT", "5432"),
            "USER": os.environ.get("DURQ_PG_USER", "postgres"),
            "PASSWORD": os.environ.get("DURQ_PG_PASSWORD", ""),
        }
    }
    if SYSTEM == "durq" and os.environ.get("BENCH_DURQ_PG_DEFAULTS") != "1":
        # What django-durq's docs/postgresql.md recommends where no transaction-pooling proxy
        # sits between the workers and the server (Django's default leaves both off;
        # BENCH_DURQ_PG_DEFAULTS=1 measures with Django's defaults).
        DATABASES["default"]["OPTIONS"] = {"server_side_binding": True, "prepare_threshold": 5}
elif DB == "mysql":
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.mysql",
            "NAME": DB_NAME,
            "HOST": os.environ.get("DURQ_MYSQL_HOST", "127.0.0.1"),
            "PORT": os.environ.get("DURQ_MYSQL_PORT", "3306"),
            "USER": os.environ.get("DURQ_MYSQL_USER", "root"),
            "PASSWORD": os.environ.get("DURQ_MYSQL_PASSWORD", ""),
            "OPTIONS": {"charset": "utf8mb4"},
        }
    }
else:
    raise RuntimeError(f"BENCH_DB={DB!r}: use sqlite, postgres or mysql")
# Persistent connections, as Django recommends for production: a worker that calls
# close_old_connections() after each task (django-tasks-db) would otherwise reconnect for every task.
DATABASES["default"]["CONN_MAX_AGE"] = 600

if SYSTEM == "durq":
    INSTALLED_APPS += ["django_durq", "bench_durq"]
    DURQ = {"QUEUES": {"default": {"concurrency": 4}}}
    # The limits workload: a cap and a rate on the queue, set high enough never to hold a job back.
    if os.environ.get("BENCH_DURQ_MAX_RUNNING"):
        DURQ["QUEUES"]["default"]["max_running"] = int(os.environ["BENCH_DURQ_MAX_RUNNING"])
    if os.environ.get("BENCH_DURQ_RATE"):
        DURQ["QUEUES"]["default"]["rate"] = os.environ["BENCH_DURQ_RATE"]
    if os.environ.get("BENCH_DURQ_DURABLE_CLAIMS") == "1":  # every claim waits for its WAL flush
        DURQ["DURABLE_CLAIMS"] = True
    if os.environ.get("BENCH_DURQ_KEEP_FINISHED"):  # finished jobs kept for that many seconds
        DURQ["KEEP_FINISHED"] = float(os.environ["BENCH_DURQ_KEEP_FINISHED"])
elif SYSTEM == "tasks-db":
    INSTALLED_APPS += ["django_tasks_db", "bench_tasksdb"]
    TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend"}}
elif SYSTEM == "procrastinate":
    INSTALLED_APPS += ["procrastinate.contrib.django", "bench_procrastinate"]
elif SYSTEM in ("huey-sqlite", "huey-postgres"):
    INSTALLED_APPS += ["huey.contrib.djhuey", "bench_huey"]
    if SYSTEM == "huey-sqlite":
        # The same file as the Django database, as the web app's coexistence test needs.
        HUEY = {"huey_class": "huey.SqliteHuey", "name": "bench", "filename": DB_NAME, "immediate": False}
    else:
        HUEY = {
            "huey_class": "huey.contrib.sql_huey.SqlHuey",
            "name": "bench",
            "database": os.environ.get("BENCH_DB_URL", ""),
            "immediate": False,
        }
elif SYSTEM == "celery-redis":
    INSTALLED_APPS += ["bench_celery"]
    CELERY_BROKER_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
    CELERY_TASK_IGNORE_RESULT = True
    CELERY_WORKER_HIJACK_ROOT_LOGGER = False
else:
    raise RuntimeError(f"BENCH_SYSTEM={SYSTEM!r} is not known")

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"stderr": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["stderr"], "level": "WARNING"},
}
