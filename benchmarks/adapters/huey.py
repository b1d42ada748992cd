from __future__ import annotations

from pathlib import Path

from .base import Adapter


class Huey(Adapter):
    def worker_commands(self, python: Path, concurrency: int) -> list[list[str]]:
        # --quiet: no INFO line per task, as with every other system here.
        return [[str(python), "-m", "django", "run_huey", "--workers", str(concurrency), "--worker-type", "thread", "--quiet"]]

    def concurrency_model(self, concurrency: int) -> str:
        return f"1 process, {concurrency} threads"


_DURABILITY = "deletes a task when it takes it: a crash loses the task"

HUEY_SQLITE = Huey(
    name="huey-sqlite",
    label="huey (SQLite)",
    env="huey",
    databases=("sqlite",),
    packages=("Django", "huey"),
    durability=_DURABILITY,
)
HUEY_POSTGRES = Huey(
    name="huey-postgres",
    label="huey (PostgreSQL)",
    env="huey",
    databases=("postgres",),
    packages=("Django", "huey", "peewee", "psycopg2-binary"),
    durability=_DURABILITY,
)
