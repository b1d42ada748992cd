"""What a worker does, thread by thread, for the anatomy workload; off unless $BENCH_ANATOMY is set.

$BENCH_ANATOMY names a file the worker writes at exit (JSON):

- ``statements``: every statement sent through a Django cursor (the execute wrappers) and, on
  SQLite, every statement the library runs (its trace callback: BEGIN, COMMIT and PRAGMAs too),
  as [wall-clock time, thread name, source, SQL, wall ns in the call, CPU ns of the thread in it];
- ``cpu``: every 10 ms, each thread's CPU time (``pthread_getcpuclockid``), keyed by thread name,
  so that the harness can take the CPU each thread spent between the first job's start and the
  last's.

django-durq's own code is untouched: the wrappers go on each connection Django opens in the
worker process. Statements on connections made outside Django (the PostgreSQL listener, SQLite's
``data_version`` reader) are seen only by the trace callback (SQLite) or the server.
"""

import atexit
import json
import os
import sys
import threading
import time

_statements = []  # appended from many threads: list.append is atomic under the GIL
_cpu = []
SAMPLE_S = 0.01


def install(path):
    if "durq_worker" not in sys.argv:
        return
    from django.db.backends.signals import connection_created

    connection_created.connect(_instrument, weak=False)
    threading.Thread(target=_sample_cpu, name="bench-anatomy", daemon=True).start()
    atexit.register(_dump, path)
    if os.environ.get("BENCH_ANATOMY_PROFILE"):
        _profile_threads(path)


def _profile_threads(path):
    """cProfile the worker from the moment its dispatcher starts, written to ``path``.pstats at exit.

    Python 3.12+ profiles every thread with one profiler, so the figures are per function over all
    threads. Deterministic: every call is counted, so calls per job do not depend on the machine's
    load; the times are inflated by the profiler and serve only to rank.
    """
    import cProfile

    from django_durq.worker.pool import Pool

    profile = cProfile.Profile()
    dispatch = Pool._dispatch

    def profiled(self):
        profile.enable()
        dispatch(self)

    Pool._dispatch = profiled

    def dump():
        profile.disable()
        profile.dump_stats(f"{path}.pstats")

    atexit.register(dump)


def _instrument(sender, connection, **kwargs):
    if _wrapper not in connection.execute_wrappers:
        connection.execute_wrappers.append(_wrapper)
    if not getattr(connection, "_bench_anatomy", False):
        # Transaction control goes to the driver without a cursor: a round trip each on MariaDB
        # (SET autocommit, COMMIT) and for PostgreSQL's COMMIT (psycopg sends BEGIN itself).
        connection._bench_anatomy = True
        connection._commit = _control(connection._commit, lambda: "[COMMIT]")
        connection._rollback = _control(connection._rollback, lambda: "[ROLLBACK]")
        connection._set_autocommit = _control(connection._set_autocommit, lambda on: f"[AUTOCOMMIT {'ON' if on else 'OFF'}]")
    if connection.vendor == "sqlite":
        connection.connection.set_trace_callback(_traced)


def _wrapper(execute, sql, params, many, context):
    started = time.time()
    wall = time.perf_counter_ns()
    cpu = time.thread_time_ns()
    try:
        return execute(sql, params, many, context)
    finally:
        name = threading.current_thread().name
        _statements.append([started, name, "django", sql, time.perf_counter_ns() - wall, time.thread_time_ns() - cpu])


def _control(method, label):
    def recorded(*args):
        started = time.time()
        wall = time.perf_counter_ns()
        cpu = time.thread_time_ns()
        try:
            return method(*args)
        finally:
            name = threading.current_thread().name
            _statements.append(
                [started, name, "driver", label(*args), time.perf_counter_ns() - wall, time.thread_time_ns() - cpu]
            )

    return recorded


def _traced(sql):
    _statements.append([time.time(), threading.current_thread().name, "sqlite", sql, 0, 0])


def _sample_cpu():
    clocks = {}
    while True:
        now = time.time()
        sample = {}
        for thread in threading.enumerate():
            ident = thread.ident
            if ident is None:
                continue
            clock = clocks.get(ident)
            if clock is None:
                try:
                    clock = clocks[ident] = time.pthread_getcpuclockid(ident)
                except OSError:
                    continue
            try:
                sample[f"{thread.name}#{ident}"] = time.clock_gettime_ns(clock)
            except OSError:
                pass  # the thread ended
        sample["process"] = time.process_time_ns()
        _cpu.append([now, sample])
        time.sleep(SAMPLE_S)


def _dump(path):
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as handle:
        json.dump({"statements": list(_statements), "cpu": list(_cpu)}, handle)
    os.replace(tmp, path)
