"""`make demo`: the whole product on SQLite, in well under a minute.

It migrates the demo site into a fresh `.demo/demo.sqlite3`, queues a small media pipeline
(see `media/jobs.py`) and one workflow (scan, three transcodes at once, publish), and runs real
`durq_worker --burst` processes on it while drawing the queues' progress. A burst worker exits
once nothing is due; jobs due later (a delayed publish, a retry backing off) get another burst
when they come due. It ends with `manage.py durq stats`, the workflow as `manage.py durq
workflow` shows it, and the way into the admin, with a demo superuser whose password is made up
for this run.
"""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
MANAGE = HERE / "manage.py"
STATE = Path(os.environ.get("DURQ_DEMO_DIR", ROOT / ".demo"))  # as testproject/settings.py reads it
MAX_ROUNDS = 8  # a safety net: the workload below needs two to four
ROUND_TIMEOUT_S = 90
IS_TTY = sys.stdout.isatty()
BOLD, DIM, RED, GREEN, RESET = ("\x1b[1m", "\x1b[2m", "\x1b[31m", "\x1b[32m", "\x1b[0m") if IS_TTY else ("",) * 5


def say(text: str = "") -> None:
    print(text, flush=True)


def heading(text: str) -> None:
    say(f"\n{BOLD}== {text}{RESET}")


def manage(*args: str, capture: bool = False) -> str:
    """Run ``manage.py`` as its own process, as an operator would."""
    done = subprocess.run(
        [sys.executable, str(MANAGE), *args], cwd=HERE, env=os.environ, capture_output=capture, text=True, check=True
    )
    return done.stdout if capture else ""


# --- the workload ------------------------------------------------------------------------------


def queue_workload() -> None:
    from datetime import timedelta

    from media import jobs

    from django_durq.models import Job

    heading("Queueing a media pipeline")
    jobs.thumbnail.enqueue_many([{"image_id": image} for image in range(1, 25)])
    say("  24 thumbnails                       queue default   (image 7 fails its first attempt)")
    for video, quality in ((1, "1080p"), (2, "720p"), (3, "1080p"), (4, "480p")):
        jobs.transcode.using(priority=10 if quality == "1080p" else 0).enqueue(video_id=video, quality=quality)
    say("  4 transcodes, 1080p first           queue video     (video 3: encoder busy, Retry in 2 s)")
    jobs.scan_upload.enqueue_many([{"upload_id": upload} for upload in (11, 12, 13)])
    say("  3 upload scans                      queue default   (upload 13 is truncated: it always fails)")
    for video in (1, 2):
        jobs.publish.using(run_in=timedelta(seconds=8)).enqueue(video_id=video)
    say("  2 publishes, delayed by 8 s         queue default")
    feeds = [jobs.rebuild_feed.using(unique="feed:home").enqueue(feed="home") for _ in range(3)]
    deduplicated = sum(job.deduplicated for job in feeds)
    say(f"  rebuild_feed x3 with unique='feed:home': 1 job, {deduplicated} enqueues deduplicated (job #{feeds[0].pk})")
    say(f"  {DIM}{Job.objects.count()} jobs in the queue{RESET}")


def queue_workflow() -> int:
    """Video 5 as a workflow: scan its upload, then three transcodes at once, then publish once all three are done."""
    from media import jobs

    from django_durq import Workflow

    heading("Queueing a workflow: scan -> transcode 1080p, 720p, 480p in parallel -> publish")
    flow = Workflow("publish video 5")
    scan = flow.add(jobs.scan_upload, upload_id=5)
    encodes = [flow.add(jobs.transcode, video_id=5, quality=quality, after=[scan]) for quality in ("1080p", "720p", "480p")]
    flow.add(jobs.publish, video_id=5, after=encodes)
    row = flow.enqueue()  # one transaction: all five jobs and their edges, or nothing
    say(f"  workflow #{row.pk}: 5 jobs; the transcodes wait for the scan, the publish waits for all three")
    return row.pk


def show_schedule() -> None:
    heading("A cron schedule: @job(cron='*/15 * * * *') on media.purge_tmp")
    say(manage("durq_schedules", capture=True).rstrip())
    say(f"  {DIM}Long-running workers enqueue it at each due time, exactly once between them; burst workers run")
    say(f"  no schedules, so here one run is queued by hand:{RESET}")
    say("  " + manage("durq_schedules", "--run-now", "media.purge_tmp", capture=True).strip())


# --- the live display --------------------------------------------------------------------------


def describe(job: Any) -> str:
    """``transcode 2 720p`` for ``media.transcode(video_id=2, quality="720p")``."""
    return f"{job.name.removeprefix('media.')} {' '.join(str(value) for value in job.kwargs.values())}".strip()


def bar(done: int | None, total: int | None, width: int = 20) -> str:
    if not total:
        return " " * width
    filled = round(width * min(done or 0, total) / total)
    return "█" * filled + "░" * (width - filled)


def snapshot() -> list[str]:
    """A few lines: per queue, how many jobs are in each state, and the running ones with progress."""
    from django_durq.clock import now_ms
    from django_durq.models import Job

    now = now_ms()
    lines = []
    for queue in ("default", "video"):
        jobs = list(Job.objects.in_queue(queue).order_by("id"))
        counts = Counter(job.status for job in jobs)
        due = sum(1 for job in jobs if job.status == "waiting" and job.run_at_ms <= now)
        later = counts["waiting"] - due
        done = counts["finished"]
        lines.append(
            f"  {BOLD}{queue:<8}{RESET} {bar(done, len(jobs))} {done:>3}/{len(jobs):<3} finished"
            f"  {counts['running']} running  {due} due  {later} later  {RED}{counts['dead']} dead{RESET}"
        )
        for job in jobs:
            if job.status == "running":
                progress = f"{job.progress_done or 0}/{job.progress_total}" if job.progress_total else ""
                lines.append(f"    {DIM}{describe(job):<24}{RESET} {bar(job.progress_done, job.progress_total, 10)} {progress}")
    return lines


class Display:
    """Redraws the snapshot in place on a terminal; elsewhere prints it every few seconds."""

    def __init__(self) -> None:
        self.drawn = 0
        self.last_print = 0.0

    def update(self, header: str) -> None:
        lines = [header, *snapshot()]
        lines += [""] * (self.drawn - len(lines))  # blank what a longer previous drawing left
        if IS_TTY:
            if self.drawn:
                sys.stdout.write(f"\x1b[{self.drawn}F")
            sys.stdout.write("".join(f"\x1b[2K{line}\n" for line in lines))
            sys.stdout.flush()
            self.drawn = len(lines)
        elif time.monotonic() - self.last_print >= 3:
            self.last_print = time.monotonic()
            say("\n".join(lines))


# --- the worker rounds -------------------------------------------------------------------------

LOG_LINE = re.compile(r"^\S+ \S+ (WARNING|ERROR) durq: (.*)$")


def burst(round_number: int) -> None:
    heading(f"Round {round_number}: python manage.py durq_worker --burst")
    log = STATE / f"worker-{round_number}.log"
    with log.open("w") as sink:
        worker = subprocess.Popen(
            [sys.executable, str(MANAGE), "durq_worker", "--burst"],
            cwd=HERE,
            env=os.environ,
            stdout=subprocess.PIPE,
            stderr=sink,
            text=True,
        )
        display = Display()
        started = time.monotonic()
        while worker.poll() is None and time.monotonic() - started < ROUND_TIMEOUT_S:
            display.update(f"  {DIM}worker pid {worker.pid}, {time.monotonic() - started:4.1f} s{RESET}")
            time.sleep(0.2)
        if worker.poll() is None:
            worker.terminate()  # a graceful stop: running jobs finish or are handed back
        summary = worker.communicate(timeout=60)[0]
        display.update(f"  {DIM}worker exited with status {worker.returncode} after {time.monotonic() - started:.1f} s{RESET}")
    say("  " + summary.strip().replace("\n", "\n  "))
    for line in log.read_text().splitlines():
        match = LOG_LINE.match(line)
        if match:
            colour = RED if match.group(1) == "ERROR" else ""
            say(f"  {colour}{match.group(2)}{RESET}")


def next_due_in_s() -> float | None:
    from django.db.models import Min

    from django_durq.clock import now_ms
    from django_durq.models import Job

    if not Job.objects.active().exists():
        return None
    # A job of a workflow that still waits for others is blocked: due when they end, not at its due time.
    due = Job.objects.waiting().aggregate(first=Min("run_at_ms"))["first"]
    return max(0.0, (due - now_ms()) / 1000) if due is not None else 0.0


def run_rounds() -> None:
    for round_number in range(1, MAX_ROUNDS + 1):
        burst(round_number)
        wait_s = next_due_in_s()
        if wait_s is None:
            return
        if wait_s > 0:
            say(f"\n  Left for later: a retry backing off, or a delayed job; the next is due in {wait_s:.1f} s.")
            time.sleep(wait_s + 0.1)
        else:
            say("\n  A retry came due after its queue's pool had finished: another burst.")
    say(f"  {RED}stopping after {MAX_ROUNDS} rounds; the admin shows what is left{RESET}")


# --- the end -----------------------------------------------------------------------------------


def show_results(workflow_id: int) -> None:
    from django_durq.models import Job

    heading("python manage.py durq stats")
    manage("durq", "stats")
    heading("python manage.py durq failed")
    manage("durq", "failed")
    heading(f"python manage.py durq workflow {workflow_id}")
    manage("durq", "workflow", str(workflow_id))
    published = Job.objects.filter(workflow_id=workflow_id, name="media.publish").first()
    if published is not None and published.result is not None:
        say(f"\n  {GREEN}published last, after every transcode: {published.result}{RESET}")


def demo_superuser() -> str:
    from django.contrib.auth import get_user_model

    password = secrets.token_urlsafe(12)
    user, _ = get_user_model().objects.get_or_create(username="demo", defaults={"email": "demo@example.com"})
    user.is_staff = user.is_superuser = True
    user.set_password(password)
    user.save()
    return password


def show_admin(password: str, workflow_id: int) -> None:
    python = Path(sys.executable)
    heading("The admin")
    say(f"  {python.relative_to(ROOT) if python.is_relative_to(ROOT) else python} {MANAGE.relative_to(ROOT)} runserver")
    say("  then open http://127.0.0.1:8000/admin/ and log in as")
    say(f"    user {BOLD}demo{RESET}   password {BOLD}{password}{RESET}   (made up for this run)")
    say("  Dead letters: http://127.0.0.1:8000/admin/django_durq/deadletter/")
    say("  Queues:       http://127.0.0.1:8000/admin/django_durq/queue/")
    say("  All jobs:     http://127.0.0.1:8000/admin/django_durq/job/")
    say(f"  Workflow:     http://127.0.0.1:8000/admin/django_durq/workflow/{workflow_id}/change/  (its graph)")


def fresh_state() -> None:
    STATE.mkdir(parents=True, exist_ok=True)
    for path in [*STATE.glob("demo.sqlite3*"), *STATE.glob("worker-*.log")]:
        path.unlink()


def main() -> None:
    started = time.monotonic()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")
    os.environ["PYTHONUNBUFFERED"] = "1"
    sys.path.insert(0, str(HERE))
    fresh_state()
    manage("migrate", "--verbosity", "0", "--skip-checks")

    import django

    django.setup()
    import django_durq

    heading("django-durq demo on SQLite")
    say(f"  A job is claimed exclusively across {django_durq.exclusivity()}.")
    queue_workload()
    workflow_id = queue_workflow()
    show_schedule()
    run_rounds()
    show_results(workflow_id)
    show_admin(demo_superuser(), workflow_id)
    say(f"\n{GREEN}Demo finished in {time.monotonic() - started:.0f} s.{RESET}")


if __name__ == "__main__":
    main()
