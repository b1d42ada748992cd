"""A newcomer's first hour, scripted: the built package in a fresh virtualenv, docs/quickstart.md step by step.

The steps come from the quickstart itself, so the test fails as soon as one of them stops working:
its ``$`` commands run in order, its ``# settings.py`` blocks are appended to the new project's
settings, its ``# accounts/jobs.py`` blocks become that module, and its other Python blocks run in
``manage.py shell``. Commands that wait for a person (``runserver``, ``createsuperuser``,
``--reload``) are left out, a ``durq_worker`` runs with ``--burst``, and ``durq retry`` of the
page's example id is skipped. Then a failing job ends as a dead letter that the admin shows.
"""

from __future__ import annotations

import shlex
import shutil
import sys
import venv
from pathlib import Path

import pytest

from tests.conftest import db_vendor
from tests.test_docs import blocks
from tests.test_packaging import SOURCES, clean_env, run

ROOT = Path(__file__).resolve().parent.parent
QUICKSTART = ROOT / "docs" / "quickstart.md"

pytestmark = [
    pytest.mark.one_leg,
    pytest.mark.processes,
    pytest.mark.skipif(db_vendor() != "sqlite", reason="the quickstart's project runs on SQLite"),
]

WAITS_FOR_A_PERSON = {"runserver", "createsuperuser"}
CONSOLE_EMAIL_BEFORE_6_1 = 'EMAIL_BACKEND = "django.core.mail.backends.console.EmailBackend"'

FAILING_JOB = """

@job(max_attempts=1)
def import_contacts(ctx, url):
    raise ValueError(f"cannot read {url}")
"""

ENQUEUE_FAILING = "from accounts.jobs import import_contacts; import_contacts.enqueue(url='ftp://nowhere')"

ADMIN_PAGE = """
from django.contrib.auth.models import User
from django.test import Client
from django.test.utils import setup_test_environment

setup_test_environment()
admin = User.objects.create_superuser("admin", "admin@example.com", "admin-password")
client = Client()
client.force_login(admin)
response = client.get("/admin/django_durq/deadletter/")
print("status", response.status_code)
print(response.content.decode())
"""


@pytest.fixture(scope="module")
def python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtualenv with the package's wheel, built from a copy of the sources, and its requirements."""
    source = tmp_path_factory.mktemp("source")
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "_build", "*.egg-info")
    for name in SOURCES:
        origin = ROOT / name
        if origin.is_dir():
            shutil.copytree(origin, source / name, ignore=ignore)
        else:
            shutil.copy2(origin, source / name)
    wheels = tmp_path_factory.mktemp("wheels")
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--quiet"]
    run([*pip, "wheel", "--no-deps", "--wheel-dir", wheels, source], cwd=source)
    home = tmp_path_factory.mktemp("venv")
    venv.EnvBuilder(with_pip=False).create(home)
    python = home / "bin" / "python"
    run([*pip, "--python", python, "install", *wheels.glob("django_durq-*.whl")], cwd=home)
    return python


class Newcomer:
    """Follows the quickstart in ``project`` with the virtualenv's ``python``."""

    def __init__(self, python: Path, project: Path) -> None:
        self.python = python
        self.project = project
        self.outputs: dict[str, str] = {}

    def manage(self, *args: str) -> str:
        return run([self.python, "manage.py", *args], cwd=self.project, env=clean_env(), timeout=120)

    def command_line(self, line: str) -> None:
        words = shlex.split(line[2:], comments=True)
        if words[0] == "pip":
            return  # the wheel under test is installed instead
        if words[0] == "django-admin":
            run([self.python.parent / "django-admin", *words[1:]], cwd=self.project, env=clean_env())
            settings = self.project / "mysite" / "settings.py"
            if words[1] == "startproject" and "MAILERS" not in settings.read_text():
                settings.write_text(settings.read_text() + f"\n{CONSOLE_EMAIL_BEFORE_6_1}\n")  # as the page says
            return
        assert words[:2] == ["python", "manage.py"], f"the quickstart gained a step this test cannot take: {line}"
        args = words[2:]
        if args[0] in WAITS_FOR_A_PERSON or "--reload" in args or args[:2] == ["durq", "retry"]:
            return
        if args[0] == "durq_worker":
            args = [*args, "--burst"]
        self.outputs[" ".join(args)] = self.manage(*args)

    def python_block(self, code: str) -> None:
        header = code.split("\n", 1)[0].strip()
        if header in ("# settings.py", "# settings.py: the whole DURQ setting"):
            settings = self.project / "mysite" / "settings.py"
            settings.write_text(settings.read_text() + "\n" + code)
        elif header.startswith("# ") and header.endswith(".py"):
            module = self.project / header[2:]
            module.write_text((module.read_text() if module.exists() else "") + "\n" + code)
        else:
            self.manage("shell", "--command", code)


def test_the_quickstart_from_an_empty_directory_to_a_dead_letter_in_the_admin(python: Path, tmp_path: Path) -> None:
    assert f"`{CONSOLE_EMAIL_BEFORE_6_1}`" in QUICKSTART.read_text()
    newcomer = Newcomer(python, tmp_path)
    for block in blocks(QUICKSTART):
        if block.lang == "python":
            newcomer.python_block(block.code)
        elif block.lang == "console":
            for line in block.code.splitlines():
                if line.startswith("$ "):
                    newcomer.command_line(line)

    checked = newcomer.outputs["check"]
    assert "identified no issues" in checked and "durq" not in checked, checked
    assert "processes on one host sharing the database file" in newcomer.outputs["check --deploy --tag django_durq"]
    worked = newcomer.outputs["durq_worker --burst"]
    assert "1 jobs in" in worked and "finished" in worked, worked
    assert "Subject: Welcome" in worked and "Hello ada!" in worked, worked
    shown = newcomer.outputs["durq show 1"]  # the welcome mail's job, kept as history by default
    assert shown.startswith("Job 1 (accounts.jobs.") and ": finished\n" in shown and ", after " in shown, shown
    assert "finished" in newcomer.outputs["durq recent"], newcomer.outputs["durq recent"]

    jobs = tmp_path / "accounts" / "jobs.py"
    jobs.write_text(jobs.read_text() + FAILING_JOB)
    newcomer.manage("shell", "--command", ENQUEUE_FAILING)
    worked = newcomer.manage("durq_worker", "--burst")
    assert "dead" in worked and "cannot read ftp://nowhere" in worked, worked
    assert "accounts.jobs.import_contacts" in newcomer.manage("durq", "failed")

    page = newcomer.manage("shell", "--command", ADMIN_PAGE)
    assert "status 200" in page, page
    assert "accounts.jobs.import_contacts" in page and "cannot read ftp://nowhere" in page
