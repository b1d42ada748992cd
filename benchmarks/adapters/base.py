"""What the harness needs to know about a system: its virtualenv, databases and worker command.

Anything a system does inside its own processes (enqueue calls, job definitions, settings)
lives in ``benchmarks/sites/``; an adapter only says how to start and prepare those processes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Adapter:
    name: str  # as given to --systems
    label: str  # as shown in tables
    env: str  # virtualenv under benchmarks/.venvs/
    databases: tuple[str, ...]  # where it keeps its queue: sqlite, postgres, mysql, redis
    packages: tuple[str, ...]  # whose versions the results record
    durability: str  # one line on what a crash can cost
    needs_repo: bool = False  # django-durq runs from the checkout
    source: Path | None = None  # where django_durq is imported from when not the checkout (a build)
    notes: dict[str, str] = field(default_factory=dict)

    def django_database(self, queue_database: str) -> str:
        """The Django database the system's processes use while its queue lives in ``queue_database``."""
        return "sqlite" if queue_database == "redis" else queue_database

    def worker_commands(self, python: Path, concurrency: int) -> list[list[str]]:
        """The command(s) a user runs to work the queue with ``concurrency`` jobs at a time."""
        raise NotImplementedError

    def concurrency_model(self, concurrency: int) -> str:
        raise NotImplementedError

    def prepare_commands(self, python: Path) -> list[list[str]]:
        """Commands that bring a fresh database to the schema the system needs."""
        return [[str(python), "-m", "django", "migrate", "--verbosity", "0"]]
