"""Every code sample in ``docs/`` runs here, and the reference pages are checked against the code.

How a sample is treated depends on its fence and its first line (``docs/README.md`` says the same):

- ``python`` blocks run in page order, in one namespace per page, against the test database.

  - ``# settings.py`` first: a settings fragment, run in a namespace that starts like a small
    settings module whose ``DURQ`` is a project's (``EXISTING_DURQ``). Pasted into a settings
    module, a fragment must add to that ``DURQ``, not replace it: every key it had is still
    there afterwards (``DURQ["KEY"] = …``, ``DURQ.update(…)``, ``DURQ = {**DURQ, …}``).
    ``# settings.py: the whole DURQ setting`` first: a complete setting, which may replace it.
    Either way the ``DURQ`` must parse without a problem, its ``DURQ["DATABASE"]`` and
    ``DURQ["LISTEN_DATABASE"]`` (unless None) must be in ``DATABASES``, and each SQLite
    database it defines must draw no ``durq`` warning.
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

The repository's ``README.md`` is run like a page of ``docs/``. Beyond the samples: every
``django_durq.…`` name the docs cite must exist, the README must link every page and name every
command, and the Celery page must map every Celery feature a typical codebase uses.
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
DOC_PAGES = sorted(path for path in DOCS.rglob("*.md") if "_build" not in path.parts and path.name != "README.md")
README = ROOT / "README.md"
# The repository's front page is a page like the others: its samples run and its commands parse.
PAGES = [*DOC_PAGES, README]
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
    return str(page.relative_to(DOCS)) if page.is_relative_to(DOCS) else str(page.relative_to(ROOT))


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


# The DURQ setting a project already has when a fragment is pasted into its settings module.
EXISTING_DURQ = {"QUEUES": {"default": {"concurrency": 4}, "mail": {"concurrency": 2}}, "KEEP_DEAD": 2_592_000}
WHOLE_SETTING = "# settings.py: the whole DURQ setting"


def kept_keys(before: Any, after: Any, where: str = "DURQ") -> Iterator[str]:
    """Keys of ``before`` (recursively, in dicts) that ``after`` no longer has."""
    if not isinstance(before, dict):
        return
    if not isinstance(after, dict):
        yield where
        return
    for key, value in before.items():
        if key not in after:
            yield f"{where}[{key!r}]"
        else:
            yield from kept_keys(value, after[key], f"{where}[{key!r}]")


def run_settings(block: Block) -> dict[str, Any]:
    namespace: dict[str, Any] = {"__name__": "settings", "BASE_DIR": Path("/srv/app")}
    namespace.update(json.loads(json.dumps(SETTINGS_SEED)))
    namespace["DURQ"] = json.loads(json.dumps(EXISTING_DURQ))
    exec(block.compiled(), namespace)
    if block.first_line != WHOLE_SETTING:
        dropped = list(kept_keys(EXISTING_DURQ, namespace["DURQ"]))
        assert not dropped, (
            f"{block.where}: pasted into settings that have a DURQ, this sample drops {dropped}; add to the setting "
            f'(DURQ["KEY"] = …, DURQ.update(…)), or mark a complete setting with the first line {WHOLE_SETTING!r}'
        )
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
        elif header in ("# settings.py", WHOLE_SETTING):
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


def test_settings_fragments_keep_the_setting_they_are_pasted_into() -> None:
    fragment = Block(README, 1, "python", '# settings.py\nDURQ = {"MONITORING": {"PUBLIC": True}}\n')
    with pytest.raises(AssertionError, match=r"drops \[\"DURQ\['QUEUES'\]\", \"DURQ\['KEEP_DEAD'\]\"\]"):
        run_settings(fragment)
    merged = Block(README, 1, "python", '# settings.py\nDURQ["MONITORING"] = {"PUBLIC": True}\n')
    assert run_settings(merged)["DURQ"]["QUEUES"] == EXISTING_DURQ["QUEUES"]
    whole = Block(README, 1, "python", f'{WHOLE_SETTING}\nDURQ = {{"QUEUES": {{"video": {{"concurrency": 2}}}}}}\n')
    assert run_settings(whole)["DURQ"] == {"QUEUES": {"video": {"concurrency": 2}}}


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
    # The samples run with the product's retention, as a reader's project does (the suite's
    # settings delete finished jobs at once).
    settings.DURQ = {key: value for key, value in settings.DURQ.items() if key != "KEEP_FINISHED"}
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
        if block.lang in ("python", "py") and block.first_line in ("# settings.py", WHOLE_SETTING):
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


# --- the docs name what the product has ----------------------------------------------------------------------


def cited_names(text: str) -> set[str]:
    """Every ``django_durq.…`` dotted name the text cites in backticks (a call's parentheses dropped)."""
    return {match.group(1) for match in re.finditer(r"`(django_durq(?:\.\w+)+)(?:\(\)|\(…\))?`", text)}


def resolves(dotted: str) -> bool:
    """Whether ``dotted`` names an object; a deprecated path that still works counts (it warns)."""
    import importlib
    import warnings

    parts = dotted.split(".")
    for split in range(len(parts), 0, -1):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                found: Any = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        try:
            for attribute in parts[split:]:
                found = getattr(found, attribute)
        except AttributeError:
            return False
        return True
    return False


def names_not_in_python() -> set[str]:
    """Dotted names that are no Python object: the package's loggers and its models' permissions."""
    from django.apps import apps

    names: set[str] = set()
    for source in (ROOT / "django_durq").rglob("*.py"):
        names.update(re.findall(r"getLogger\(\"(django_durq[\w.]*)\"\)", source.read_text()))
    for model in apps.get_app_config("django_durq").get_models():
        names.update(f"django_durq.{action}_{model._meta.model_name}" for action in model._meta.default_permissions)
    return names


def test_every_django_durq_name_the_docs_cite_exists() -> None:
    other = names_not_in_python()
    missing = {
        f"{page_id(page)}: {name}"
        for page in PAGES
        for name in cited_names(page.read_text())
        if name not in other and not resolves(name)
    }
    assert not missing, f"the docs cite names the package does not have: {sorted(missing)}"


def durq_subcommands() -> list[str]:
    parser = load_command_class("django_durq", "durq").create_parser("manage.py", "durq")
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sorted(action.choices)


def test_the_readme_names_every_command_and_links_every_page() -> None:
    text = README.read_text()
    commands = [name for name in durq_commands() if name != "durq"] + [f"durq {sub}" for sub in durq_subcommands()]
    unnamed = [command for command in commands if f"`{command}" not in text and f" {command}" not in text]
    assert not unnamed, f"README.md does not name the commands {unnamed}"
    unlinked = [str(page.relative_to(ROOT)) for page in DOC_PAGES if f"({page.relative_to(ROOT)})" not in text]
    assert not unlinked, f"README.md does not link {unlinked}"


# What a typical Celery codebase uses, as it is written there: each must be a row of the table in
# docs/from-celery.md, which says what django-durq has instead, or that it has nothing.
CELERY_FEATURES = [
    "@shared_task",
    "bind=True",
    "delay(",
    "countdown=",
    "eta=",
    "expires=",
    "priority=",
    "queue=",
    "task_routes",
    "max_retries",
    "self.retry(",
    "autoretry_for",
    "acks_late",
    "rate_limit",
    "time_limit",
    "soft_time_limit",
    "chain(",
    "group(",
    "chord(",
    "AsyncResult",
    ".get(timeout=",
    "revoke(",
    "celery beat",
    "crontab(",
    "schedule=timedelta(",
    "task_prerun",
    "task_postrun",
    "task_success",
    "task_failure",
    "worker_concurrency",
    "--max-tasks-per-child",
    "--max-memory-per-child",
    "ignore_result",
]


def test_the_celery_page_maps_every_celery_feature() -> None:
    text = (DOCS / "from-celery.md").read_text()
    table = "\n".join(line.split("|")[1] for line in text.split("\n") if line.startswith("| ") and line.count("|") >= 3)
    unmapped = [feature for feature in CELERY_FEATURES if feature not in table]
    assert not unmapped, f"docs/from-celery.md has no row for {unmapped}"
