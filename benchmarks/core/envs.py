"""One virtualenv per system under ``benchmarks/.venvs/``, built from PyPI with pinned versions.

Every system runs on the same interpreter (Django 6 needs Python 3.12 or newer), found by
:func:`find_python`. django-durq itself is not installed: its virtualenv gets the checkout on
``PYTHONPATH``, so a rerun always measures the working tree.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent.parent
REPO = BENCH_DIR.parent
VENVS = BENCH_DIR / ".venvs"
SITES = BENCH_DIR / "sites"

DJANGO = "Django==6.1.3"
PSYCOPG = "psycopg[binary]==3.3.9"
MYSQLCLIENT = "mysqlclient==2.3.2"

# name -> (requirements, optional requirements whose failure only disables a database)
REQUIREMENTS: dict[str, tuple[list[str], list[str]]] = {
    "durq": ([DJANGO, PSYCOPG], [MYSQLCLIENT]),
    "tasks-db": ([DJANGO, "django-tasks-db==0.13.0", PSYCOPG], [MYSQLCLIENT]),
    "procrastinate": ([DJANGO, "procrastinate[django]==3.10.0", PSYCOPG], []),
    "huey": ([DJANGO, "huey==3.5.4", "peewee==4.5.3", "psycopg2-binary==2.9.13"], []),
    "celery": ([DJANGO, "celery[redis]==5.7.0", "redis==8.1.0"], []),
    "tools": (["matplotlib==3.11.2", "py-spy==0.4.3"], []),
}


class EnvError(RuntimeError):
    pass


def _version_of(python: str) -> tuple[int, int] | None:
    try:
        out = subprocess.run(
            [python, "-c", "import sys; print(sys.version_info[0], sys.version_info[1])"],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout.split()
        return int(out[0]), int(out[1])
    except (OSError, ValueError, IndexError, subprocess.SubprocessError):
        return None


def find_python() -> str:
    """The newest Python 3.12+ on this machine: $BENCH_PYTHON, pyenv's, then PATH, then this one."""
    explicit = os.environ.get("BENCH_PYTHON")
    if explicit:
        version = _version_of(explicit)
        if version is None or version < (3, 12):
            raise EnvError(f"BENCH_PYTHON={explicit} is not a Python 3.12 or newer")
        return explicit
    candidates: list[str] = []
    pyenv_root = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    candidates += sorted(glob.glob(os.path.join(pyenv_root, "versions", "3.1[2-9]*", "bin", "python3")))
    for name in ("python3.14", "python3.13", "python3.12", "python3"):
        found = shutil.which(name)
        if found:
            candidates.append(found)
    candidates.append(sys.executable)
    best: tuple[tuple[int, int], str] | None = None
    for candidate in candidates:
        version = _version_of(candidate)
        # Prefer the newest release line; among equals keep the first found (pyenv's).
        if version is not None and version >= (3, 12) and (best is None or version > best[0]):
            best = (version, candidate)
    if best is None:
        raise EnvError("no Python 3.12 or newer found; set BENCH_PYTHON to one (Django 6 needs it)")
    return best[1]


def venv_python(name: str) -> Path:
    return VENVS / name / "bin" / "python"


def durq_dependencies() -> list[str]:
    """django-durq's own requirements from pyproject.toml, Django left to the pinned version."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return [item for item in project.get("dependencies", []) if not item.lower().startswith("django")]


def ensure(name: str, python: str, log: Callable[[str], None] = print) -> Path:
    """Create or refresh the virtualenv ``name``; returns its interpreter."""
    required, optional = REQUIREMENTS[name]
    if name == "durq":
        required = required + durq_dependencies()
    stamp_text = json.dumps({"python": python, "required": required, "optional": optional})
    digest = hashlib.sha256(stamp_text.encode()).hexdigest()[:16]
    target = VENVS / name
    stamp = target / ".bench-stamp"
    if stamp.exists() and stamp.read_text().strip() == digest and venv_python(name).exists():
        return venv_python(name)
    log(f"[env] building {target} ({', '.join(required + optional)})")
    if target.exists():
        shutil.rmtree(target)
    subprocess.run([python, "-m", "venv", str(target)], check=True)
    pip = [str(venv_python(name)), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    done = subprocess.run([*pip, *required], capture_output=True, text=True)
    if done.returncode != 0:
        raise EnvError(f"pip install for {name} failed:\n{_pip_errors(done.stderr)}")
    for extra in optional:
        done = subprocess.run([*pip, extra], capture_output=True, text=True)
        if done.returncode != 0:
            log(f"[env] {name}: optional {extra} did not install; its database is skipped\n{_pip_errors(done.stderr)}")
    stamp.write_text(digest + "\n")
    return venv_python(name)


def _pip_errors(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if "is ignored: it is neither a file nor a directory" not in line]
    return "\n".join(lines[-20:])


def installed_versions(name: str, packages: list[str]) -> dict[str, str]:
    """Installed versions of ``packages`` in the virtualenv ``name`` (missing ones left out)."""
    code = (
        "import json, sys\n"
        "from importlib import metadata\n"
        "found = {}\n"
        "for name in sys.argv[1:]:\n"
        "    try:\n"
        "        found[name] = metadata.version(name)\n"
        "    except metadata.PackageNotFoundError:\n"
        "        pass\n"
        "found['python'] = '.'.join(map(str, sys.version_info[:3]))\n"
        "import sqlite3; found['sqlite'] = sqlite3.sqlite_version\n"
        "print(json.dumps(found))\n"
    )
    out = subprocess.run([str(venv_python(name)), "-c", code, *packages], capture_output=True, text=True).stdout
    try:
        return dict(json.loads(out))
    except ValueError:
        return {}


def has_module(name: str, module: str) -> bool:
    done = subprocess.run([str(venv_python(name)), "-c", f"import {module}"], capture_output=True)
    return done.returncode == 0


def durq_version() -> str:
    text = (REPO / "django_durq" / "__init__.py").read_text()
    match = re.search(r'__version__ = "([^"]+)"', text)
    return match.group(1) if match else "?"


def git_revision() -> str:
    done = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "django_durq"], capture_output=True, text=True)
    revision = done.stdout.strip() or "?"
    return revision + ("+dirty" if dirty.stdout.strip() else "")
