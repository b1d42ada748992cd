"""Workload 7, ceiling: each database's own commit rate on this machine, for scale.

PostgreSQL: ``pgbench`` with a one-row UPDATE per transaction, 1 and 4 clients. SQLite: a
Python loop of one-row UPDATE transactions in WAL mode with ``synchronous`` NORMAL and FULL
(the SQLite library the systems use). MariaDB: the same loop through mysqlclient, autocommit.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from typing import Any

from ..adapters import SYSTEMS
from ..core import databases, procs
from ..core.session import Session, Skip

NAME = "ceiling"
GLOBAL = True

_SCRIPT = "\\set aid random(1, 100000)\nUPDATE pgbench_accounts SET abalance = abalance + 1 WHERE aid = :aid;\n"


def run_global(session: Session, wanted: list[str]) -> None:
    seconds = 5 if session.options.quick else 10
    for repeat in range(session.options.repeats):
        if "sqlite" in wanted:
            for sync in ("NORMAL", "FULL"):
                _one(session, "sqlite", {"synchronous": sync}, repeat, lambda s=sync: sqlite(session, s, seconds))
        if "postgres" in wanted:
            for clients in (1, 4):
                _one(session, "postgres", {"clients": clients}, repeat, lambda c=clients: pgbench(session, c, seconds))
        if "mysql" in wanted:
            _one(session, "mysql", {"clients": 1}, repeat, lambda: mariadb(session, seconds))


def _one(session: Session, database: str, params: dict[str, Any], repeat: int, measure: Any) -> None:
    load = procs.loadavg()
    try:
        metrics = measure()
    except Skip as skip:
        metrics = {"skipped": str(skip)}
    except (RuntimeError, OSError, subprocess.SubprocessError) as error:
        metrics = {"error": str(error)[-2000:]}
    session.record(NAME, None, database, params, repeat, metrics, load)
    rate = metrics.get("commits_per_s")
    shown = f"{rate:,.0f} commits/s" if rate else metrics.get("skipped") or metrics.get("error", "?")
    session.say(f"  ceiling {database} {params} #{repeat + 1}: {shown}")


def sqlite(session: Session, synchronous: str, seconds: float) -> dict[str, Any]:
    adapter = SYSTEMS["durq"]
    db = databases.create("sqlite", "ceiling")
    try:
        return session.agent(
            adapter, db, "sqlite-ceiling", "--path", db.name, "--synchronous", synchronous, "--seconds", str(seconds)
        )
    finally:
        db.drop()


def mariadb(session: Session, seconds: float) -> dict[str, Any]:
    adapter = SYSTEMS["durq"]
    session.check_database(adapter, "mysql")
    db = databases.create("mysql", "ceiling")
    try:
        return session.agent(adapter, db, "mysql-ceiling", "--database", db.name, "--seconds", str(seconds))
    finally:
        db.drop()


def pgbench(session: Session, clients: int, seconds: float) -> dict[str, Any]:
    if shutil.which("pgbench") is None:
        raise Skip("pgbench is not installed (Debian: postgresql-contrib / postgresql-client)")
    problem = databases.available("postgres")
    if problem:
        raise Skip(problem)
    db = databases.create("postgres", "pgbench")
    pg = databases.PG
    base = ["-h", pg["host"], "-p", pg["port"], "-U", pg["user"]]
    env = {**os.environ, "PGPASSWORD": pg["password"]}
    script = session.work / "pgbench-update.sql"
    script.write_text(_SCRIPT)
    try:
        subprocess.run(["pgbench", *base, "-i", "-q", "-s", "1", db.name], env=env, check=True, capture_output=True)
        done = subprocess.run(
            ["pgbench", *base, "-n", "-f", str(script), "-c", str(clients), "-j", str(min(clients, 2)),
             "-T", str(int(seconds)), db.name],
            env=env, capture_output=True, text=True, check=True,
        )  # fmt: skip
    finally:
        db.drop()
    match = re.search(r"tps = ([\d.]+)", done.stdout)
    if not match:
        raise RuntimeError(f"pgbench printed no tps:\n{done.stdout[-1000:]}")
    return {"commits_per_s": float(match.group(1)), "seconds": seconds}
