"""The package's layers point only down: a module imports its own layer and the layers below it.

    edges                    admin/, tasks/, management/, apps, checks, views, urls, testing, django_durq itself
    runtime                  worker/ (the only threads and OS signals)
    operations               enqueue/, execution/, ops/, schedules/
    dialects                 db/ (the only SQL and vendor names)
    settings and vocabulary  conf/, handlers/, models
    values                   clock, cron, exceptions, signals

An ``ast`` walk over the source, so nothing is imported: module-level and function-level imports
count; imports under ``if TYPE_CHECKING:`` do not (they name types for annotations, nothing runs).
Where a lower layer needs a higher one, pass a function in (``clock.set_default_clock``,
``handlers.registry.hand_in_enqueue``).

A function-level import of the package stays only with its reason on its line (see REASONS). No
module is past ``MAX_LINES``.
"""

from __future__ import annotations

import ast
import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "django_durq"

# Lowest first. A room is a sub-package, or a module at the top; "" is django_durq/__init__.py.
LAYERS: list[tuple[str, set[str]]] = [
    ("values", {"clock", "cron", "exceptions", "signals"}),
    ("settings and vocabulary", {"conf", "handlers", "models"}),
    ("dialects", {"db"}),
    ("operations", {"enqueue", "execution", "ops", "schedules"}),
    ("runtime", {"worker"}),
    ("edges", {"", "admin", "apps", "backend", "checks", "management", "tasks", "testing", "urls", "views"}),
]

# Why a function-level import of the package may stay; its line must say one of these.
REASONS = {
    "app loading": "Django imports the module before its app registry is ready (importing django_durq, "
    "apps.py, the tasks backend), so it cannot import a model at module level",
    "optional": "what it imports needs what may be absent or unused: another vendor's dialect, Django's tasks framework",
}
# The most lines a module may have; past it, split it along the nouns it owns.
MAX_LINES = 400


@dataclass(frozen=True)
class Import:
    importer: str  # dotted module
    imported: str  # dotted module
    path: str
    line: int
    function: str | None  # the enclosing function, None at module level
    text: str  # the source line


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(root: Path) -> list[Import]:
    """Every import of the package by one of its modules (migrations left out: Django writes them)."""
    files = [p for p in sorted(root.rglob("*.py")) if "migrations" not in p.relative_to(root).parts]
    modules = {module_name(p, root) for p in files}
    found: list[Import] = []
    for path in files:
        found.extend(_Walk(path, root, modules).imports)
    return found


class _Walk:
    """The imports of one module, each with the function it sits in; TYPE_CHECKING blocks skipped."""

    def __init__(self, path: Path, root: Path, modules: set[str]) -> None:
        self.path, self.root, self.modules = path, root, modules
        self.current = module_name(path, root)
        self.is_package = path.name == "__init__.py"
        source = path.read_text()
        self.lines = source.splitlines()
        self.imports: list[Import] = []
        self.visit(ast.parse(source), None)

    def visit(self, node: ast.AST, function: str | None) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child.test):
                for other in child.orelse:
                    self.visit_one(other, function)
                continue
            self.visit_one(child, function)

    def visit_one(self, node: ast.AST, function: str | None) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            self.visit(node, node.name if function is None else f"{function}.{node.name}")
        elif isinstance(node, ast.ClassDef):
            self.visit(node, f"{function}.{node.name}" if function else None)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            package = self.root.name
            for target in _targets(node, self.current, self.is_package, self.modules):
                if target == package or target.startswith(package + "."):
                    rel = self.path.relative_to(self.root.parent).as_posix()
                    self.imports.append(Import(self.current, target, rel, node.lineno, function, self.lines[node.lineno - 1]))
        else:
            self.visit(node, function)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _targets(node: ast.Import | ast.ImportFrom, current: str, is_package: bool, modules: set[str]) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level:
        base = current.split(".") if is_package else current.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        module = ".".join(base + ([node.module] if node.module else []))
    else:
        module = node.module or ""
    # ``from . import wakeup`` imports a module; ``from .conf import get_settings`` a name of one.
    return sorted({f"{module}.{a.name}" if f"{module}.{a.name}" in modules else module for a in node.names})


def layer_of(module: str) -> tuple[int, str]:
    parts = module.split(".")
    room = parts[1] if len(parts) > 1 else ""
    for index, (name, rooms) in enumerate(LAYERS):
        if room in rooms:
            return index, name
    raise LookupError(room)


def upward(found: list[Import]) -> list[str]:
    problems = []
    for imp in found:
        (low, low_name), (high, high_name) = layer_of(imp.importer), layer_of(imp.imported)
        if high > low:
            where = f" (in {imp.function})" if imp.function else ""
            problems.append(
                f"{imp.path}:{imp.line}{where}: {imp.importer} ({low_name}) imports {imp.imported} ({high_name}), "
                f"a layer above its own. Import from your layer or below; where a lower layer needs a higher "
                f"one, pass a function in."
            )
    return problems


def unexplained(found: list[Import]) -> list[str]:
    problems = []
    for imp in found:
        if imp.function is None:
            continue
        comment = imp.text.partition("#")[2]
        if any(re.search(rf"\b{reason}:", comment) for reason in REASONS):
            continue
        problems.append(
            f"{imp.path}:{imp.line} (in {imp.function}): {imp.importer} imports {imp.imported} inside a function "
            f"without saying why. Import it at module level; if Django's app loading demands it here, end the "
            f'line with "# app loading: <why>" (or "# optional: <what may be absent>").'
        )
    return problems


def test_every_module_is_in_a_layer() -> None:
    rooms = {m.split(".")[1] if "." in m else "" for m in {i.importer for i in imports_of(PACKAGE)}}
    rooms |= {p.stem if p.is_file() else p.name for p in PACKAGE.iterdir() if p.suffix == ".py" or (p / "__init__.py").exists()}
    rooms = {"" if r == "__init__" else r for r in rooms} - {"migrations"}
    placed = set().union(*(r for _, r in LAYERS))
    assert not rooms - placed, f"put these rooms in a layer of LAYERS: {sorted(rooms - placed)}"


def test_imports_point_only_down() -> None:
    problems = upward(imports_of(PACKAGE))
    assert not problems, "upward imports:\n" + "\n".join(problems)


def test_function_level_imports_say_why() -> None:
    problems = unexplained(imports_of(PACKAGE))
    assert not problems, "function-level imports:\n" + "\n".join(problems)


def too_long(root: Path) -> list[str]:
    """Modules of the package past ``MAX_LINES`` (migrations left out: Django writes them)."""
    problems = []
    for path in sorted(root.rglob("*.py")):
        if "migrations" in path.relative_to(root).parts:
            continue
        lines = len(path.read_text().splitlines())
        if lines > MAX_LINES:
            rel = path.relative_to(root.parent).as_posix()
            problems.append(f"{rel}: {lines} lines, more than {MAX_LINES}. Split it along the nouns it owns.")
    return problems


def test_no_module_is_past_the_line_limit() -> None:
    problems = too_long(PACKAGE)
    assert not problems, "long modules:\n" + "\n".join(problems)


def test_the_line_limit_finds_a_long_module(tmp_path: Path) -> None:
    root = tmp_path / "django_durq"
    (root / "migrations").mkdir(parents=True)
    (root / "short.py").write_text("x = 1\n" * MAX_LINES)
    (root / "long.py").write_text("x = 1\n" * (MAX_LINES + 1))
    (root / "migrations" / "0001_initial.py").write_text("x = 1\n" * (MAX_LINES + 1))
    assert too_long(root) == [
        f"django_durq/long.py: {MAX_LINES + 1} lines, more than {MAX_LINES}. Split it along the nouns it owns."
    ]


@pytest.fixture
def planted(tmp_path: Path) -> Path:
    """A package laid out like django_durq, with one upward import of each kind the walk must see."""
    root = tmp_path / "django_durq"
    files = {
        "__init__.py": "from .handlers.registry import job\n",
        "clock.py": "",
        "models.py": "from .clock import now_ms\n",
        "handlers/__init__.py": "",
        "handlers/registry.py": textwrap.dedent(
            """
            from typing import TYPE_CHECKING
            from ..enqueue import enqueue_one
            if TYPE_CHECKING:
                from ..worker import pool
            def later():
                from ..worker.pool import Pool
            """
        ),
        "enqueue/__init__.py": "from ..models import now_ms\n",
        "worker/__init__.py": "",
        "worker/pool.py": "from .. import enqueue\n",
    }
    for rel, source in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(source)
    return root


def test_the_walk_finds_a_planted_upward_import(planted: Path) -> None:
    problems = upward(imports_of(planted))
    assert problems == [
        "django_durq/handlers/registry.py:3: django_durq.handlers.registry (settings and vocabulary) imports "
        "django_durq.enqueue (operations), a layer above its own. Import from your layer or below; where a lower "
        "layer needs a higher one, pass a function in.",
        "django_durq/handlers/registry.py:7 (in later): django_durq.handlers.registry (settings and vocabulary) "
        "imports django_durq.worker.pool (runtime), a layer above its own. Import from your layer or below; where "
        "a lower layer needs a higher one, pass a function in.",
    ]
    assert [p.split(":")[:2] for p in unexplained(imports_of(planted))] == [["django_durq/handlers/registry.py", "7 (in later)"]]
