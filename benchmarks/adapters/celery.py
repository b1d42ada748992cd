from __future__ import annotations

from pathlib import Path

from .base import Adapter


class Celery(Adapter):
    def worker_commands(self, python: Path, concurrency: int) -> list[list[str]]:
        return [[str(python), "-m", "celery", "-A", "benchsite.celery_app", "worker", "--concurrency", str(concurrency)]]

    def concurrency_model(self, concurrency: int) -> str:
        return f"prefork: 1 parent + {concurrency} child processes"


ADAPTER = Celery(
    name="celery-redis",
    label="Celery + Redis",
    env="celery",
    databases=("redis",),
    packages=("Django", "celery", "kombu", "redis"),
    durability="acknowledged on receipt (default): a crash loses the task; Redis keeps nothing on disk here",
)
