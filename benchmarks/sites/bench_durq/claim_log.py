"""Times every claim a worker makes, for the scaling and bloat workloads; off unless $BENCH_CLAIMS is set.

Each call of a dialect's ``claim`` (one claim statement on PostgreSQL, the locking read and the
update on MariaDB) appends 20 bytes to $BENCH_CLAIMS with one ``os.write``: the jobs it took,
its wall-clock start and its duration. django-durq's own code is untouched: the method is
wrapped here, in the benchmark site, when Django starts the worker.
"""

import functools
import os
import struct
import time

# jobs claimed, start (epoch s), duration (s); read by benchmarks/core/claims.py
RECORD = struct.Struct("<idd")


def install(path):
    from django_durq.db.mysql import MySQLDialect
    from django_durq.db.postgresql import PostgreSQLDialect
    from django_durq.db.sqlite import SQLiteDialect

    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    for dialect in (PostgreSQLDialect, MySQLDialect, SQLiteDialect):
        dialect.claim = _timed(dialect.claim, fd)
        # A claim that counts its own starts (PostgreSQL's, where no completion shares its
        # transaction) is its own statement: timed alone, not through ``claim``.
        if "claim_counted" in vars(dialect):
            dialect.claim_counted = _timed(dialect.claim_counted, fd)


def _timed(claim, fd):
    @functools.wraps(claim)
    def timed(self, queue, limit, now_ms, worker_id, *rest):
        started = time.time()
        t0 = time.perf_counter()
        jobs = claim(self, queue, limit, now_ms, worker_id, *rest)
        os.write(fd, RECORD.pack(len(jobs), started, time.perf_counter() - t0))
        return jobs

    return timed
