"""docs/architecture.md cannot rot: what it names exists, and it maps every promise and every room.

Every `` `django_durq/…` `` or `` `tests/…` `` path it names is a file or folder of the repository, and
every `` `tests/….py::test_…` `` a test function of that file, every other `` `test_…` `` a test
function somewhere in tests/, and every other name in backticks (`` `_fence` ``, `` `Store.retrying` ``)
a word of the package's source; every promise of docs/guarantees.md (the terms of "What holds on
every database" and the rows of "How each database claims") has a row on the map, and every room of
tests/test_layers.py is named there.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.test_layers import LAYERS

ROOT = Path(__file__).resolve().parent.parent
MAP = ROOT / "docs" / "architecture.md"
GUARANTEES = ROOT / "docs" / "guarantees.md"

# A path in backticks, optionally with a test: `tests/db/test_flow.py::test_rates_parse_to_a_count_per_window`.
NAMED = re.compile(r"`((?:django_durq|tests)/[\w/.]*?)(?:::(\w+))?`")
# Any other name in backticks, a call's parentheses dropped; not a page named by {doc}.
CODE = re.compile(r"(?<!\{doc\})`([A-Za-z_][\w.]*)(?:\(\))?`")
# Words of the text that name no code of the package.
NOT_CODE = {"ast"}


def named(text: str) -> list[tuple[str, str | None]]:
    return [(match.group(1), match.group(2)) for match in NAMED.finditer(text)]


def functions_of(path: Path) -> set[str]:
    """Names of the functions a test file defines, at module level or in a class."""
    tree = ast.parse(path.read_text())
    return {node.name for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}


def words_of(root: Path) -> set[str]:
    return {word for path in root.rglob("*.py") for word in re.findall(r"\w+", path.read_text())}


def promises() -> list[str]:
    """The promises of docs/guarantees.md: its definition terms, and the rows of its per-database table."""
    text = GUARANTEES.read_text()
    every = text.split("## What holds on every database", 1)[1].split("\n## ", 1)[0]
    terms = re.findall(r"\n\n([^\n:][^\n]*)\n: ", every)
    claims = text.split("## How each database claims", 1)[1].split("\n\n", 2)[1]
    rows = [line.split("|")[1].strip() for line in claims.splitlines() if line.startswith("| ") and "---" not in line]
    return [*terms, *(row for row in rows if row)]


def test_every_path_and_test_the_map_names_exists() -> None:
    found = named(MAP.read_text())
    assert len(found) > 50, "the map names the modules and tests that keep each promise"
    missing = [path for path, _ in found if not (ROOT / path).exists()]
    assert not missing, f"docs/architecture.md names paths that do not exist: {sorted(set(missing))}"
    unknown = [f"{path}::{test}" for path, test in found if test and test not in functions_of(ROOT / path)]
    assert not unknown, f"docs/architecture.md names tests that do not exist: {unknown}"


def test_every_test_and_name_of_the_code_the_map_names_exists() -> None:
    text = MAP.read_text()
    tests = {name for path in (ROOT / "tests").rglob("test_*.py") for name in functions_of(path)}
    bare = [name for name in CODE.findall(text) if name.startswith("test_")]
    assert bare, "the map names the tests of tests/test_layers.py"
    missing = [name for name in bare if name not in tests]
    assert not missing, f"docs/architecture.md names tests that do not exist: {missing}"
    source = words_of(ROOT / "django_durq")
    names = [name for name in CODE.findall(text) if not name.startswith("test_") and name not in NOT_CODE]
    unknown = [name for name in names if not all(part in source for part in name.split("."))]
    assert not unknown, f"docs/architecture.md names what the package's source does not have: {unknown}"


def test_every_promise_of_the_guarantees_has_a_row() -> None:
    listed = promises()
    assert "Fenced writes" in listed and "oldest version" in listed, listed
    rows = {line.split("|")[1].strip() for line in MAP.read_text().splitlines() if line.startswith("| ")}
    missing = [promise for promise in listed if not any(row.startswith(promise) for row in rows)]
    assert not missing, f"docs/architecture.md has no row for these promises of docs/guarantees.md: {missing}"


def test_every_room_of_the_layers_is_on_the_map() -> None:
    text = MAP.read_text()
    rooms = sorted(room for _, names in LAYERS for room in names if room)
    unnamed = [room for room in rooms if f"`django_durq/{room}/`" not in text and f"`django_durq/{room}.py`" not in text]
    assert not unnamed, f"docs/architecture.md has no line for the rooms {unnamed}"


def test_the_walk_sees_a_missing_path_and_a_missing_test() -> None:
    text = "`django_durq/nowhere.py` and `tests/test_layers.py::test_that_was_never_written`"
    found = named(text)
    assert found == [("django_durq/nowhere.py", None), ("tests/test_layers.py", "test_that_was_never_written")]
    assert not (ROOT / found[0][0]).exists()
    assert found[1][1] not in functions_of(ROOT / found[1][0])
