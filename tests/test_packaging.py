"""The package people install: built, checked, installed in a fresh virtualenv, used by a new project.

It builds and installs from PyPI's setuptools and Django, so it runs in one tox leg only
(``DURQ_TEST_PACKAGING=1``, set for py311-dj52-sqlite in tox.ini).
"""

from __future__ import annotations

import email.parser
import os
import re
import shutil
import subprocess
import sys
import tarfile
import venv
import zipfile
from collections.abc import Sequence
from pathlib import Path

import pytest

import django_durq

ROOT = Path(__file__).resolve().parent.parent
VERSION = django_durq.__version__

pytestmark = pytest.mark.skipif(
    os.environ.get("DURQ_TEST_PACKAGING") != "1",
    reason="builds and installs the package: runs in the tox leg that sets DURQ_TEST_PACKAGING=1",
)

# What the built distribution must be made of (MANIFEST.in and pyproject.toml's package data).
SOURCES = ("pyproject.toml", "README.md", "LICENSE", "MANIFEST.in", "tox.ini", "django_durq", "docs", "tests")
IN_BOTH = (
    "django_durq/__init__.py",
    "django_durq/py.typed",
    "django_durq/migrations/0001_initial.py",
    "django_durq/management/commands/durq_worker.py",
)


def clean_env(**extra: str) -> dict[str, str]:
    """The environment of a user's shell: none of this test run's Django, durq or warning settings."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("DURQ_", "DJANGO_", "PYTHON", "VIRTUAL_ENV", "PIP_REQUIRE"))
    }
    env.update(extra)
    return env


def run(args: Sequence[str | Path], cwd: Path, env: dict[str, str] | None = None, timeout: float = 300) -> str:
    done = subprocess.run(
        [str(arg) for arg in args],
        cwd=cwd,
        env=env or clean_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"{' '.join(map(str, args))} exited {done.returncode}:\n{output}"
    return output


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An sdist and a wheel built from the sdist, as ``python -m build`` makes them."""
    source = tmp_path_factory.mktemp("source")
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "_build", "*.egg-info")
    for name in SOURCES:
        origin = ROOT / name
        if origin.is_dir():
            shutil.copytree(origin, source / name, ignore=ignore)
        else:
            shutil.copy2(origin, source / name)
    out = tmp_path_factory.mktemp("dist")
    run([sys.executable, "-m", "build", "--outdir", out, source], cwd=source)
    return out


def wheel_path(dist: Path) -> Path:
    return dist / f"django_durq-{VERSION}-py3-none-any.whl"


def sdist_path(dist: Path) -> Path:
    return dist / f"django_durq-{VERSION}.tar.gz"


def test_wheel_contents(dist: Path) -> None:
    names = set(zipfile.ZipFile(wheel_path(dist)).namelist())
    for name in IN_BOTH:
        assert name in names, name
    assert any(name.startswith("django_durq/templates/") and name.endswith(".html") for name in names)
    assert any(name.startswith("django_durq/static/") for name in names)
    assert f"django_durq-{VERSION}.dist-info/licenses/LICENSE" in names
    assert not any(name.startswith(("tests/", "docs/", "testproject/", "benchmarks/")) for name in names)


def test_metadata(dist: Path) -> None:
    with zipfile.ZipFile(wheel_path(dist)) as wheel:
        metadata = email.parser.Parser().parsestr(wheel.read(f"django_durq-{VERSION}.dist-info/METADATA").decode())
    assert metadata["Name"] == "django-durq"
    assert metadata["Version"] == VERSION
    assert metadata["License-Expression"] == "BSD-3-Clause"
    classifiers = metadata.get_all("Classifier") or []
    for classifier in (
        "Framework :: Django :: 5.2",
        "Framework :: Django :: 6.1",
        "Programming Language :: Python :: 3.11",
        "Programming Language :: Python :: 3.13",
        "Typing :: Typed",
    ):
        assert classifier in classifiers, classifier
    assert set(metadata.get_all("Provides-Extra") or []) >= {"postgres", "mysql"}
    # The base install pulls in no database driver; each extra adds its own.
    requires = metadata.get_all("Requires-Dist") or []
    base = [requirement for requirement in requires if "extra ==" not in requirement]
    assert not any(driver in requirement.lower() for requirement in base for driver in ("psycopg", "mysqlclient"))
    assert any(r.startswith("psycopg") and 'extra == "postgres"' in r for r in requires), requires
    assert any(r.startswith("mysqlclient") and 'extra == "mysql"' in r for r in requires), requires


def test_sdist_contents(dist: Path) -> None:
    prefix = f"django_durq-{VERSION}/"
    with tarfile.open(sdist_path(dist)) as sdist:
        names = {name.removeprefix(prefix) for name in sdist.getnames()}
    for name in (*IN_BOTH, "LICENSE", "README.md", "pyproject.toml", "docs/index.md", "docs/conf.py", "tests/settings.py"):
        assert name in names, name
    assert any(name.startswith("django_durq/templates/") for name in names)
    assert any(name.startswith("django_durq/static/") for name in names)


def test_twine_check(dist: Path) -> None:
    output = run([sys.executable, "-m", "twine", "check", "--strict", wheel_path(dist), sdist_path(dist)], cwd=dist)
    assert output.count("PASSED") == 2, output


SETTINGS_TAIL = """
INSTALLED_APPS += ["django_durq", "shop"]
DATABASES["default"]["OPTIONS"] = {
    "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    "transaction_mode": "IMMEDIATE",
    "timeout": 20,
}
"""

JOBS = """
from django_durq import job


@job(name="shop.hello")
def hello(ctx, who):
    return f"hello {who}"
"""


@pytest.fixture(scope="module")
def installed(dist: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtualenv with only the wheel (and what it requires) installed; its python."""
    home = tmp_path_factory.mktemp("venv")
    venv.EnvBuilder(with_pip=False).create(home)  # this run's pip installs into it: faster than ensurepip
    python = home / "bin" / "python"
    pip = [sys.executable, "-m", "pip", "--python", python, "install", "--quiet", "--disable-pip-version-check"]
    run([*pip, wheel_path(dist)], cwd=home)
    return python


def test_the_base_install_has_no_database_driver(installed: Path) -> None:
    probe = "import importlib.util as u; print([m for m in ('psycopg', 'psycopg2', 'MySQLdb') if u.find_spec(m)])"
    assert run([installed, "-c", probe], cwd=installed.parent).strip() == "[]"


def test_a_new_project_checks_migrates_and_runs_a_job(installed: Path, tmp_path: Path) -> None:
    django_admin = installed.parent / "django-admin"
    run([django_admin, "startproject", "mysite", tmp_path], cwd=tmp_path)
    settings = tmp_path / "mysite" / "settings.py"
    settings.write_text(settings.read_text() + SETTINGS_TAIL)
    (tmp_path / "shop").mkdir()
    (tmp_path / "shop" / "__init__.py").write_text("")
    (tmp_path / "shop" / "jobs.py").write_text(JOBS)
    manage = [installed, "manage.py"]

    assert "identified no issues" in run([*manage, "check", "--fail-level", "WARNING"], cwd=tmp_path)
    checked = run([*manage, "check", "--deploy", "--tag", "django_durq"], cwd=tmp_path)
    assert "(durq.I001)" in checked and "processes on one host sharing the database file" in checked
    run([*manage, "migrate", "--verbosity", "0"], cwd=tmp_path)
    assert "[X] 0001_initial" in run([*manage, "showmigrations", "django_durq"], cwd=tmp_path)

    run([*manage, "shell", "-c", "from shop.jobs import hello; hello.enqueue('world')"], cwd=tmp_path)
    output = run([*manage, "durq_worker", "--burst"], cwd=tmp_path, timeout=120)
    assert "1 jobs in" in output and "finished" in output, output


@pytest.mark.parametrize(
    ("engine", "django_says"),
    [
        ("django.db.backends.postgresql", "Error loading psycopg2 or psycopg module"),
        ("django.db.backends.mysql", "Error loading MySQLdb module"),
    ],
)
def test_a_missing_driver_gives_djangos_own_error(installed: Path, tmp_path: Path, engine: str, django_says: str) -> None:
    run([installed.parent / "django-admin", "startproject", "mysite", tmp_path], cwd=tmp_path)
    settings = tmp_path / "mysite" / "settings.py"
    settings.write_text(
        settings.read_text() + f'\nINSTALLED_APPS += ["django_durq"]\nDATABASES = {{"default": {{"ENGINE": "{engine}"}}}}\n'
    )
    done = subprocess.run(
        [installed, "manage.py", "check"], cwd=tmp_path, env=clean_env(), capture_output=True, text=True, timeout=120
    )
    assert done.returncode != 0
    # The error that ends the traceback is Django's own, naming the driver to install.
    final = done.stderr[done.stderr.rindex("\nTraceback") if "\nTraceback" in done.stderr else 0 :]
    assert f"django.core.exceptions.ImproperlyConfigured: {django_says}" in final, done.stderr
    assert "Durq" not in final.strip().splitlines()[-1], done.stderr


def test_the_demo_runs(tmp_path: Path) -> None:
    """`make demo`, the README's first command, runs its pipeline to the end (in a scratch directory)."""
    env = clean_env(DURQ_DEMO_DIR=str(tmp_path), PATH=os.environ["PATH"])
    output = run([sys.executable, ROOT / "testproject" / "demo.py"], cwd=ROOT, env=env, timeout=180)
    assert "rebuild_feed x3 with unique='feed:home': 1 job, 2 enqueues deduplicated" in output, output
    assert "media.scan_upload) attempt 3/3 failed" in output and "-> dead letter" in output, output
    assert "QUEUE" in output and "WAITING" in output, output  # the stats table
    assert "Workflow 1 (publish video 5): finished, 5 jobs (5 finished)" in output, output
    assert '"renditions":["1080p","720p","480p"]' in output, output  # published once all three were done
    assert re.search(r"user demo\s+password \S{16}", output), output
    assert "Demo finished" in output, output
