"""Every code sample in ``docs/`` runs here, and the reference pages are checked against the code.

How a sample is treated depends on its fence and its first line (``docs/README.md`` says the same):

- ``python`` blocks run in page order, in one namespace per page, against the test database.

  - ``# settings.py`` first: a settings fragment, run in a namespace that starts like a small
    settings module. The ``DURQ`` it defines must parse without a problem, its
    ``DURQ["DATABASE"]`` and ``DURQ["LISTEN_DATABASE"]`` (unless None) must be in ``DATABASES``,
    and each SQLite database it defines must draw no ``durq`` warning.
  - ``# app/module.py`` first: that module's code, importable as ``app.module`` by the page's
    later samples; a later block with the same first line continues the same module. Handlers it
    registers are removed after the page.
  - ``# urls.py`` first: a URLconf fragment, run with ``urlpatterns = []``; what it adds must be
    URL patterns.
  - ``# before: …`` first: another library's code shown for comparison; it is only compiled.
- Every other block (``console``, ``ini``, ``yaml``, ``text``, …): each ``manage.py COMMAND …``
  in it is parsed by that command's own argument parser; each ``$ pip install`` must name this
  package and extras it has; a ``$`` line of another program must be one of ``OTHER_PROGRAMS``.
  A block whose first line is ``# before: …`` shows another library's commands and is skipped.
- Quoted system-check and worker output must match what the code prints.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import sys
import tomllib
import types
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from django.core.management import get_commands, load_command_class
from django.db import connection
from django.dispatch import Signal

import django_durq
from django_durq import checks as durq_checks
from django_durq import schedules
from django_durq import signals as durq_signals
from django_durq.conf import KNOWN_KEYS, parse
from django_durq.db.checks import sqlite_setup_warnings
from django_durq.db.mysql import MySQLDialect
from django_durq.db.postgresql import PostgreSQLDialect
from django_durq.db.sqlite import SQLiteDialect
from django_durq.handlers.registry import registry
from django_durq.management.commands.durq_worker import parse_queue_spec

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGES = sorted(path for path in DOCS.rglob("*.md") if "_build" not in path.parts and path.name != "README.md")
SIGNALS = [value for value in vars(durq_signals).values() if isinstance(value, Signal)]
DIALECTS = {"sqlite": SQLiteDialect, "postgresql": PostgreSQLDialect, "mysql": MySQLDialect}
# Programs that docs may show at a ``$`` prompt without this test running them.
OTHER_PROGRAMS = {
    "systemctl",
    "systemd-analyze",
    "journalctl",
    "make",
    "sqlite3",
    "docker",
    "kubectl",
    "git",
    "cd",
    "django-admin",
    "sudo",
}
# Options every management command has; the commands reference need not repeat them.
DJANGO_COMMON_OPTIONS = {
    "--help",
    "--version",
    "--verbosity",
    "--settings",
    "--pythonpath",
    "--traceback",
    "--no-color",
    "--force-color",
    "--skip-checks",
}


@dataclass
class Block:
    page: Path
    line: int  # 1-based line of the opening fence
    lang: str
    code: str

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    @property
    def first_line(self) -> str:
        return self.code.split("\n", 1)[0].strip()

    def compiled(self) -> Any:
        """The block's code, compiled with the page's own file name and line numbers."""
        return compile("\n" * self.line + self.code, str(self.page), "exec")


def blocks(page: Path) -> Iterator[Block]:
    """The fenced code blocks of a Markdown page (MyST directives such as ``{toctree}`` excluded)."""
    lines = page.read_text().split("\n")
    index = 0
    while index < len(lines):
        opening = re.match(r"^\s*(`{3,}|~{3,})\s*([^`\s]*)", lines[index])
        if not opening:
            index += 1
            continue
        fence, lang = opening.group(1), opening.group(2)
        start = index
        body: list[str] = []
        index += 1
        while index < len(lines) and not re.match(rf"^\s*{re.escape(fence[0])}{{{len(fence)},}}\s*$", lines[index]):
            body.append(lines[index])
            index += 1
        index += 1
        if not lang.startswith("{"):
            yield Block(page, start + 1, lang, "\n".join(body) + "\n")


def page_id(page: Path) -> str:
    return str(page.relative_to(DOCS))


# --- running the Python samples ----------------------------------------------------------------

SETTINGS_SEED = {
    "INSTALLED_APPS": [
        "django.contrib.admin",
        "django.contrib.auth",
        "django.contrib.contenttypes",
        "django.contrib.sessions",
        "django.contrib.messages",
        "django.contrib.staticfiles",
    ],
    "DATABASES": {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": "db.sqlite3"}},
}


def run_settings(block: Block) -> dict[str, Any]:
    namespace: dict[str, Any] = {"__name__": "settings", "BASE_DIR": Path("/srv/app")}
    namespace.update(json.loads(json.dumps(SETTINGS_SEED)))
    exec(block.compiled(), namespace)
    if "DURQ" in namespace:
        problems = parse(namespace["DURQ"]).problems
        assert not problems, f"{block.where}: DURQ has problems: {problems}"
        for key in ("DATABASE", "LISTEN_DATABASE"):
            alias = namespace["DURQ"].get(key, "default")
            assert alias is None or alias in namespace["DATABASES"], f"{block.where}: DURQ[{key!r}] {alias!r} is not in DATABASES"
    for alias, database in namespace["DATABASES"].items():
        if database.get("ENGINE") == "django.db.backends.sqlite3" and "OPTIONS" in database:
            warnings = sqlite_setup_warnings(database)
            assert not warnings, f"{block.where}: database {alias!r} draws {warnings}"
    return namespace


def run_urls(block: Block) -> None:
    """A URLconf fragment: ``urlpatterns += [...]`` onto an empty list; every entry must be a URL pattern."""
    from django.urls import URLPattern, URLResolver

    namespace: dict[str, Any] = {"__name__": "urls", "urlpatterns": []}
    exec(block.compiled(), namespace)
    for pattern in namespace["urlpatterns"]:
        assert isinstance(pattern, URLPattern | URLResolver), f"{block.where}: {pattern!r} is not a URL pattern"
        if isinstance(pattern, URLResolver):
            assert pattern.url_patterns, f"{block.where}: {pattern!r} includes nothing"


class PageRun:
    """One page's samples: a shared namespace, the modules it defines, and clean-up afterwards."""

    def __init__(self, page: Path) -> None:
        self.page = page
        self.namespace: dict[str, Any] = {"__name__": f"docs_{page.stem.replace('-', '_')}"}
        self.modules: list[str] = []
        self.jobs_before = {definition.name for definition in registry.all()}
        self.schedules_before = set(schedules._declared)
        self.receivers_before = {signal: list(signal.receivers) for signal in SIGNALS}

    def run(self, block: Block) -> None:
        header = block.first_line
        if header.startswith("# before:"):
            block.compiled()
        elif header == "# settings.py":
            run_settings(block)
        elif header == "# urls.py":
            run_urls(block)
        elif re.fullmatch(r"# [a-z_][a-z0-9_]*(/[a-z_][a-z0-9_]*)*\.py", header):
            self.run_module(block, header[2:-3].replace("/", "."))
        else:
            exec(block.compiled(), self.namespace)

    def run_module(self, block: Block, dotted: str) -> None:
        module = sys.modules.get(dotted) if dotted in self.modules else None
        if module is None:
            top = dotted.split(".")[0]
            if top not in self.modules:
                assert top not in sys.modules, f"{block.where}: sample module {dotted!r} would shadow a real module"
            parts = dotted.split(".")
            for depth in range(1, len(parts) + 1):
                name = ".".join(parts[:depth])
                if name in sys.modules:
                    continue
                new = types.ModuleType(name)
                if depth < len(parts):
                    new.__path__ = []
                sys.modules[name] = new
                self.modules.append(name)
                if depth > 1:
                    setattr(sys.modules[".".join(parts[: depth - 1])], parts[depth - 1], new)
            module = sys.modules[dotted]
        exec(block.compiled(), module.__dict__)

    def close(self) -> None:
        for name in reversed(self.modules):
            sys.modules.pop(name, None)
        for definition in registry.all():
            if definition.name not in self.jobs_before:
                registry.remove(definition.name)
        for name in set(schedules._declared) - self.schedules_before:
            schedules.forget(name)
        for signal, receivers in self.receivers_before.items():
            signal.receivers[:] = receivers
            signal.sender_receivers_cache.clear()


def needs_database(block: Block) -> bool:
    return block.lang in ("python", "py") and not block.first_line.startswith(("# before:", "# settings.py"))


def sample_pages() -> Iterator[Any]:
    """Pages as test parameters; those with samples that touch the database get a committed one
    (samples use ``transaction.on_commit``), the others none."""
    for page in PAGES:
        if any(needs_database(block) for block in blocks(page)):
            yield pytest.param(page, id=page_id(page), marks=pytest.mark.django_db(transaction=True))
        else:
            yield pytest.param(page, id=page_id(page))


@pytest.mark.parametrize("page", list(sample_pages()))
def test_python_samples_run(page: Path, settings: Any) -> None:
    run = PageRun(page)
    try:
        for block in blocks(page):
            if block.lang in ("python", "py"):
                run.run(block)
    finally:
        run.close()


# --- commands in console, ini, yaml and text blocks --------------------------------------------


def manage_py_invocations(code: str) -> Iterator[list[str]]:
    """The argument lists following ``manage.py`` in a block, in shell or list (JSON/YAML) form."""
    for line in code.split("\n"):
        if "manage.py" not in line or line.lstrip().startswith("#"):
            continue
        listed = re.search(r'\[\s*(".*")\s*\]', line)  # ["python", "manage.py", …] in YAML or JSON
        tokens = json.loads(f"[{listed.group(1)}]") if listed else shlex.split(line[line.index("manage.py") :], comments=True)
        yield [str(token) for token in tokens[tokens.index("manage.py") + 1 :]]


def check_invocation(args: list[str], where: str, aliases: Collection[str] = ()) -> None:
    """Parse ``args`` as manage.py would; ``aliases`` are databases the page's settings define."""
    assert args, f"{where}: manage.py without a command"
    name, rest = args[0], list(args[1:])
    # The test settings have one database; an alias the page itself configured stands for it.
    for index in range(1, len(rest)):
        if rest[index - 1] == "--database" and rest[index] in aliases:
            rest[index] = "default"
    commands = get_commands()
    assert name in commands, f"{where}: manage.py {name}: no such command"
    command = load_command_class(commands[name], name)
    parser = command.create_parser("manage.py", name)
    options = parser.parse_args(rest)
    if name == "durq_worker":
        for spec in options.queue:
            parse_queue_spec(spec, 1)


def optional_extras() -> set[str]:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return set(data["project"].get("optional-dependencies", {}))


def check_prompt(line: str, where: str) -> None:
    tokens = shlex.split(line[2:], comments=True)
    if not tokens:
        return
    if tokens[:2] == ["pip", "install"]:
        for requirement in tokens[2:]:
            match = re.fullmatch(r"django-durq(?:\[([a-z0-9,]+)\])?", requirement)
            assert match, f"{where}: pip install {requirement}: not this package"
            extras = set(match.group(1).split(",")) if match.group(1) else set()
            assert extras <= optional_extras(), f"{where}: unknown extras {extras - optional_extras()}"
    elif "manage.py" in tokens:
        return  # checked by check_invocation
    else:
        assert tokens[0] in OTHER_PROGRAMS, f"{where}: $ {tokens[0]} is neither manage.py, pip nor a known program"


def other_blocks(pages: list[Path] = PAGES) -> Iterator[Block]:
    for page in pages:
        for block in blocks(page):
            if block.lang not in ("python", "py") and not block.first_line.startswith("# before:"):
                yield block


def page_database_aliases(page: Path) -> set[str]:
    aliases: set[str] = set()
    for block in blocks(page):
        if block.lang in ("python", "py") and block.first_line == "# settings.py":
            aliases.update(run_settings(block)["DATABASES"])
    return aliases


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_commands_parse(page: Path) -> None:
    aliases = page_database_aliases(page)
    for block in other_blocks([page]):
        for args in manage_py_invocations(block.code):
            check_invocation(args, block.where, aliases)
        for line in block.code.split("\n"):
            if line.startswith("$ "):
                check_prompt(line, block.where)


# --- quoted output ---------------------------------------------------------------------------------


def docs_text() -> str:
    return "\n".join(page.read_text() for page in PAGES)


def test_every_database_guarantee_is_quoted_verbatim() -> None:
    text = docs_text()
    for vendor, dialect in DIALECTS.items():
        assert dialect.exclusivity, vendor
        assert f"({vendor}); a job is claimed exclusively across {dialect.exclusivity}" in text, vendor


def test_quoted_check_output_matches_this_database(db: None) -> None:
    messages = [m for m in durq_checks.check_exclusivity() if m.id == "durq.I001"]
    assert len(messages) == 1
    quoted = f"?: (durq.I001) {messages[0].msg}"
    assert quoted in docs_text(), f"the docs do not quote what `manage.py check` prints here:\n{quoted}"
    assert django_durq.exclusivity() == DIALECTS[connection.vendor].exclusivity


def test_quoted_output_lines_match_their_formats() -> None:
    from django_durq.worker import supervisor

    source = Path(supervisor.__file__).read_text()
    started = re.search(r'"(durq: worker %s started;[^"]*)"\s*,', source)
    assert started, "the worker's start-up log line moved; update this test and the docs"
    pattern = re.escape(started.group(1)).replace("%s", "(.+?)").replace("%r", "(.+?)") + "$"
    seen = 0
    for block in other_blocks():
        for line in block.code.split("\n"):
            if "durq: worker" in line and "started;" in line:
                seen += 1
                match = re.search(pattern, line)
                assert match, f"{block.where}: not the worker's start-up line format:\n{line}"
                vendor, exclusivity = match.group(4), match.group(5)
                assert DIALECTS[vendor].exclusivity == exclusivity, f"{block.where}: {vendor} does not say that"
            if "(durq.I001)" in line:
                match = re.search(
                    r"\?: \(durq\.I001\) durq: the queue lives in database '\w+' \((\w+)\); "
                    r"a job is claimed exclusively across (.+)$",
                    line,
                )
                assert match, f"{block.where}: not the durq.I001 format:\n{line}"
                assert DIALECTS[match.group(1)].exclusivity == match.group(2), block.where
    assert seen


# --- reference pages against the code ----------------------------------------------------------


def test_settings_reference_covers_every_key() -> None:
    text = (DOCS / "reference" / "settings.md").read_text()
    missing = [key for key in sorted(KNOWN_KEYS) if f"`{key}`" not in text]
    assert not missing, f"docs/reference/settings.md does not describe {missing}"


def test_checks_reference_matches_the_code() -> None:
    documented = set(re.findall(r"durq\.[EWI]\d{3}", (DOCS / "reference" / "checks.md").read_text()))
    in_code = set(re.findall(r"durq\.[EWI]\d{3}", durq_checks.__doc__ or ""))
    assert in_code, "the table of checks in django_durq/checks.py is gone"
    # Every id the package can emit, wherever it is defined (the tasks backend has its own).
    for source in (ROOT / "django_durq").rglob("*.py"):
        in_code.update(re.findall(r"[\"'](durq\.[EWI]\d{3})[\"']", source.read_text()))
    assert documented == in_code, (
        f"docs/reference/checks.md lacks {sorted(in_code - documented)}, has unknown {sorted(documented - in_code)}"
    )


def durq_commands() -> dict[str, Any]:
    return {name: app for name, app in get_commands().items() if app == "django_durq"}


def undocumented_options(parser: argparse.ArgumentParser, command: str, text: str) -> Iterator[str]:
    """Options (and subcommands, recursively) of ``parser`` that ``text`` does not mention."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub, subparser in action.choices.items():
                if f"`{command} {sub}" not in text:
                    yield f"{command} {sub}"
                yield from undocumented_options(subparser, f"{command} {sub}", text)
        for option in action.option_strings:
            documented = re.search(rf"`[^`\n]*{re.escape(option)}(?![\w-])", text)
            if option.startswith("--") and option not in DJANGO_COMMON_OPTIONS and not documented:
                yield f"{command} {option}"


def test_commands_reference_covers_every_option() -> None:
    text = (DOCS / "reference" / "commands.md").read_text()
    for name, app in durq_commands().items():
        assert f"## `{name}`" in text, f"docs/reference/commands.md has no section for {name}"
        parser = load_command_class(app, name).create_parser("manage.py", name)
        missing = list(undocumented_options(parser, name, text))
        assert not missing, f"docs/reference/commands.md does not describe {missing}"


def test_job_reference_covers_every_field() -> None:
    from django_durq.models import Job

    text = (DOCS / "reference" / "job.md").read_text()
    missing = [field.name for field in Job._meta.concrete_fields if f"`{field.name}`" not in text]
    assert not missing, f"docs/reference/job.md does not describe {missing}"
