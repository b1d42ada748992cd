from __future__ import annotations

from pathlib import Path

from .base import Adapter


class TasksDB(Adapter):
    def worker_commands(self, python: Path, concurrency: int) -> list[list[str]]:
        # db_worker runs one task at a time: concurrency is one process per slot.
        # --verbosity 0: no INFO line per task, as with every other system here.
        return [[str(python), "-m", "django", "db_worker", "--verbosity", "0"] for _ in range(concurrency)]

    def concurrency_model(self, concurrency: int) -> str:
        return f"{concurrency} process{'es' if concurrency > 1 else ''}"


ADAPTER = TasksDB(
    name="tasks-db",
    label="django-tasks-db",
    env="tasks-db",
    databases=("sqlite", "postgres", "mysql"),
    packages=("Django", "django-tasks-db", "psycopg", "mysqlclient"),
    durability="no lease: a crashed worker leaves its task RUNNING",
)
