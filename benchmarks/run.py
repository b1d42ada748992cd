"""Run the benchmarks: ``python -m benchmarks.run`` (``make bench`` runs everything and publishes).

    python -m benchmarks.run --only drain --systems durq,huey-sqlite
    python -m benchmarks.run --only latency --databases postgres --repeats 5
    python -m benchmarks.run --quick                 # fewer jobs and repeats, for a smoke test
    python -m benchmarks.run --publish               # merge into results/latest.jsonl, render docs
    python -m benchmarks.run --compare               # A/B: the previous main against the working tree
    python -m benchmarks.run --compare 0b62311..550a369 --databases postgres --repeats 7

Results go to ``benchmarks/results/<run id>.jsonl``, one line per measurement.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

from . import compare, render
from .adapters import SYSTEMS
from .core import builds, databases, envs, procs
from .core.session import RESULTS, Options, Session, Skip
from .workloads import ALL, DEFAULT

DATABASES = ("sqlite", "postgres", "mysql", "redis")


def _names(text: str | None, known: list[str] | tuple[str, ...], what: str) -> list[str]:
    if not text:
        return list(known)
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in known]
    if unknown:
        raise SystemExit(f"unknown {what}: {', '.join(unknown)} (known: {', '.join(known)})")
    return names


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__.split("\n")[0])
    parser.add_argument("--only", help=f"workloads, comma-separated (default: {','.join(DEFAULT)}; also: profile)")
    parser.add_argument("--systems", help=f"systems, comma-separated (default: all: {','.join(SYSTEMS)})")
    parser.add_argument("--databases", help="sqlite,postgres,mysql,redis (default: all)")
    parser.add_argument("--repeats", type=int, help="repeats per measurement (default 3; 1 for memory)")
    parser.add_argument("--jobs", type=int, help="jobs per drain and enqueue (default 5000)")
    parser.add_argument("--concurrency", help="drain concurrencies, comma-separated (default 1,4)")
    parser.add_argument("--memory-jobs", type=int, help="jobs for the memory workload (default 100000)")
    parser.add_argument("--scale-rows", type=int, help="finished + dead rows for the scale workload (default 1000000)")
    parser.add_argument("--scaling-jobs", type=int, help="jobs per point of the scaling workload (default 100000)")
    parser.add_argument("--scaling-processes", help="worker processes of the scaling workload's points (default 1,2,4,8,16)")
    parser.add_argument("--bloat-jobs", type=int, help="jobs through the table in the bloat workload (default 1000000)")
    parser.add_argument("--idle-seconds", type=float, help="idle CPU window of the latency workload (default 60)")
    parser.add_argument("--quick", action="store_true", help="smoke test: 1 repeat, small counts, short windows")
    parser.add_argument("--publish", action="store_true", help="merge into results/latest.jsonl and render docs")
    parser.add_argument("--no-render", action="store_true", help="skip the summary table")
    parser.add_argument(
        "--revision",
        metavar="REV",
        help="run django-durq as of revision REV (built under benchmarks/.builds/) or from directory REV "
        "(one that holds django_durq/, a scratch copy) instead of the working tree",
    )
    parser.add_argument(
        "--compare",
        nargs="?",
        const="",
        metavar="REV|A..B",
        help="A/B of django-durq alone: REV (default: the previous main) against the working tree, or revision A "
        "against revision B, drain and latency interleaved over --repeats rounds (default 5); prints a markdown table",
    )
    return parser.parse_args(argv)


def options_from(args: argparse.Namespace) -> Options:
    options = Options()
    if args.quick:
        options.quick = True
        options.repeats = 1
        options.jobs = 2000
        options.idle_seconds = 10
        options.memory_jobs = 20_000
        options.scale_rows = 100_000
        options.scaling_jobs = 5_000
        options.bloat_jobs = 50_000
        options.coexist_seconds = 5
    if args.repeats:
        options.repeats = args.repeats
    if args.jobs:
        options.jobs = args.jobs
    if args.memory_jobs:
        options.memory_jobs = args.memory_jobs
    if args.scale_rows:
        options.scale_rows = args.scale_rows
    if args.scaling_jobs:
        options.scaling_jobs = args.scaling_jobs
    if args.bloat_jobs:
        options.bloat_jobs = args.bloat_jobs
    if args.idle_seconds is not None:
        options.idle_seconds = args.idle_seconds
    if args.scaling_processes:
        options.extra["scaling_processes"] = tuple(int(part) for part in args.scaling_processes.split(","))
    if args.concurrency:
        options.extra["concurrency"] = tuple(int(part) for part in args.concurrency.split(","))
    return options


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.compare is not None:
        return _compare(args)
    workloads = _names(args.only, list(ALL), "workloads") if args.only else list(DEFAULT)
    systems = _names(args.systems, list(SYSTEMS), "systems")
    if args.revision:
        try:
            SYSTEMS["durq"] = compare.adapter_for(builds.side_for(args.revision))
        except builds.BuildError as error:
            raise SystemExit(f"--revision: {error}") from None
    wanted_databases = _names(args.databases, DATABASES, "databases")
    session = Session(options_from(args))
    leftovers = databases.drop_leftovers()
    if leftovers:
        session.say(f"[setup] dropped {len(leftovers)} leftover database(s) of an interrupted run")
    session.say(f"[setup] results: {session.results_path}")
    session.say(f"[setup] interpreter for every system: {session.python}")
    session.record("machine", None, "-", {}, 0, session.machine(), procs.loadavg())
    started = time.monotonic()
    try:
        for name in workloads:
            module = ALL[name]
            session.say(f"== {name}")
            if getattr(module, "GLOBAL", False):
                module.run_global(session, wanted_databases)
                continue
            # An interleaved workload measures every system once per round, so that a drift of the
            # machine over the run (a disk's flush rate) weighs on every system alike.
            rounds = range(session.options.repeats) if getattr(module, "INTERLEAVED", False) else [None]
            failed: set[tuple[str, str]] = set()
            for round_ in rounds:
                for system in systems:
                    adapter = SYSTEMS[system]
                    for database in adapter.databases:
                        if database not in wanted_databases or not module.applies(adapter, database):
                            continue
                        if (system, database) in failed:
                            continue
                        which = "" if round_ is None else f" (round {round_ + 1} of {len(rounds)})"
                        session.say(f"-- {name}: {adapter.label} on {database}{which}")
                        try:
                            session.check_database(adapter, database)
                            if round_ is None:
                                module.run(session, adapter, database)
                            else:
                                module.run(session, adapter, database, round_)
                        except Skip as skip:
                            failed.add((system, database))
                            session.say(f"   skipped: {skip}")
                            session.record(name, adapter, database, {}, 0, {"skipped": str(skip)}, procs.loadavg())
                        except (RuntimeError, subprocess.SubprocessError, OSError) as error:
                            failed.add((system, database))
                            session.say(f"   FAILED: {error}")
                            session.record(name, adapter, database, {}, 0, {"error": str(error)[-3000:]}, procs.loadavg())
    finally:
        session.close()
    session.say(f"[done] {time.monotonic() - started:.0f} s; results in {session.results_path}")
    lines = render.load(session.results_path)
    if not args.no_render:
        print(render.text_summary(lines))
    if args.publish:
        latest = RESULTS / "latest.jsonl"
        merged = render.merge(render.load(latest) if latest.exists() else [], lines)
        render.dump(merged, latest)
        session.say(f"[publish] {latest} ({len(merged)} lines)")
        _render_docs(session, latest)
    return 0


def _compare(args: argparse.Namespace) -> int:
    if args.publish or args.systems:
        raise SystemExit("--compare measures django-durq alone and publishes nothing: drop --publish and --systems")
    workloads = _names(args.only, compare.WORKLOADS, "workloads for --compare") if args.only else list(compare.DEFAULT_WORKLOADS)
    wanted_databases = _names(args.databases, compare.DATABASES, "databases for --compare")
    options = options_from(args)
    rounds = args.repeats or (2 if args.quick else compare.ROUNDS)
    jobs = args.jobs or (options.jobs if args.quick else compare.DRAIN_JOBS)
    session = Session(options)
    databases.drop_leftovers()
    session.say(f"[setup] results: {session.results_path}")
    session.record("machine", None, "-", {}, 0, session.machine(), procs.loadavg())
    try:
        table = compare.run(session, args.compare, wanted_databases, workloads, rounds, jobs)
    except builds.BuildError as error:
        raise SystemExit(f"--compare: {error}") from None
    finally:
        session.close()
    print("\n" + table)
    return 0


def _render_docs(session: Session, latest: Path) -> None:
    try:
        python = session.tools_python()
    except envs.EnvError as error:
        session.say(f"[publish] charts skipped: {error}")
        python = Path(sys.executable)
    done = subprocess.run([str(python), "-m", "benchmarks.render", str(latest)], cwd=envs.REPO, capture_output=True, text=True)
    session.say(done.stdout.strip() or done.stderr.strip()[-2000:])


if __name__ == "__main__":
    sys.exit(main())
