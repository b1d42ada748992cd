from __future__ import annotations

from pathlib import Path

from .base import Adapter


class Procrastinate(Adapter):
    def worker_commands(self, python: Path, concurrency: int) -> list[list[str]]:
        return [[str(python), "-m", "django", "procrastinate", "worker", "--concurrency", str(concurrency)]]

    def concurrency_model(self, concurrency: int) -> str:
        return f"1 process, asyncio, {concurrency} concurrent jobs (sync tasks in threads)"


ADAPTER = Procrastinate(
    name="procrastinate",
    label="Procrastinate",
    env="procrastinate",
    databases=("postgres",),
    packages=("Django", "procrastinate", "psycopg"),
    durability="heartbeats; stalled jobs are retried by the application",
)
