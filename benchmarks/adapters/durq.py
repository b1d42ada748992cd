from __future__ import annotations

from pathlib import Path

from .base import Adapter


class Durq(Adapter):
    def worker_commands(self, python: Path, concurrency: int) -> list[list[str]]:
        return [[str(python), "-m", "django", "durq_worker", "--queue", f"default:{concurrency}", "--verbosity", "0"]]

    def concurrency_model(self, concurrency: int) -> str:
        return f"1 process, {concurrency} threads"


ADAPTER = Durq(
    name="durq",
    label="django-durq",
    env="durq",
    databases=("sqlite", "postgres", "mysql"),
    packages=("Django", "psycopg", "mysqlclient"),
    durability="leases + fencing: a crashed worker's job runs again (at-least-once)",
    needs_repo=True,
)
