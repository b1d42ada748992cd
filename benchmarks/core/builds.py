"""A revision of django-durq built beside the working tree, for ``--compare`` and ``--revision``.

``git archive`` writes the revision's ``django_durq/`` and ``pyproject.toml`` to
``benchmarks/.builds/<sha>/``; its processes import it from there through ``PYTHONPATH``, in the
same virtualenv and with the same benchmark site (``benchmarks/sites/``) as the working tree, so
that the package is the only thing that differs between the two sides. A build is kept and
reused: a commit does not change.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path

from .envs import BENCH_DIR, REPO

BUILDS = BENCH_DIR / ".builds"
# What a build holds: the package, and the project file its dependencies are read from.
_ARCHIVED = ("django_durq", "pyproject.toml")
_DONE = ".bench-build"


class BuildError(RuntimeError):
    pass


@dataclass(frozen=True)
class Side:
    """One side of a comparison: where its django_durq is imported from, and how tables name it."""

    label: str  # "0b62311" or "working tree (550a369+dirty)"
    revision: str  # the full commit, or the HEAD of a working tree with "+dirty" when it has changes
    source: Path  # the directory that holds django_durq/


def _git(*args: str) -> str:
    done = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise BuildError(f"git {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout.strip()


def resolve(spec: str) -> str:
    """The full commit ``spec`` names (a sha, a branch, ``main~1``)."""
    return _git("rev-parse", "--verify", "--quiet", f"{spec}^{{commit}}")


def previous_main() -> str:
    """The revision a change is compared against by default: where the working tree left ``main``.

    On a branch, the merge-base of ``HEAD`` and ``main``; on ``main`` itself with uncommitted
    changes to the package, ``HEAD``; on a clean ``main``, its first parent (the change just made).
    """
    head = resolve("HEAD")
    try:
        base = _git("merge-base", "HEAD", "main")
    except BuildError:
        raise BuildError("no branch named main here: give the revision to compare against, --compare REV") from None
    if base != head or _dirty():
        return base
    return resolve("HEAD~1")


def _dirty() -> bool:
    return bool(_git("status", "--porcelain", "--", "django_durq"))


def working_tree() -> Side:
    dirty = "+dirty" if _dirty() else ""
    head = resolve("HEAD")
    return Side(label=f"working tree ({head[:7]}{dirty})", revision=head + dirty, source=REPO)


def build(spec: str) -> Side:
    """``spec`` archived under ``benchmarks/.builds/<sha>/`` (reused when it is there already)."""
    sha = resolve(spec)
    target = BUILDS / sha
    if not (target / _DONE).exists():
        BUILDS.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(prefix=f".{sha[:12]}-", dir=BUILDS))
        try:
            archive = subprocess.run(["git", "-C", str(REPO), "archive", sha, *_ARCHIVED], capture_output=True)
            if archive.returncode != 0:
                raise BuildError(f"git archive {sha[:12]}: {archive.stderr.decode().strip()}")
            subprocess.run(["tar", "-x", "-C", str(scratch)], input=archive.stdout, check=True)
            (scratch / _DONE).write_text(sha + "\n")
            shutil.rmtree(target, ignore_errors=True)
            scratch.rename(target)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    return Side(label=sha[:7], revision=sha, source=target)


def side_for(spec: str) -> Side:
    """A revision (built), or a directory that holds a ``django_durq/`` of its own (a scratch copy, used as it is)."""
    path = Path(spec).expanduser()
    if (path / "django_durq").is_dir():
        path = path.resolve()
        return Side(label=path.name, revision=str(path), source=path)
    return build(spec)


def dependencies(side: Side) -> list[str]:
    """The package's own requirements at that side (Django left out: the virtualenv pins it)."""
    pyproject = side.source / "pyproject.toml"
    if not pyproject.exists():
        return []
    project = tomllib.loads(pyproject.read_text())["project"]
    return sorted(item for item in project.get("dependencies", []) if not item.lower().startswith("django"))
