"""DURQ["MODULES"]: handlers outside jobs.py are registered at start-up, in every process."""

from __future__ import annotations

import sys

import pytest
from django.apps import apps
from django.core.exceptions import ImproperlyConfigured

from django_durq.conf import parse
from django_durq.handlers.registry import registry

HANDLERS = """
from django_durq import job


@job(name="tests.modules.hello")
def hello(ctx, who):
    return f"hello {who}"
"""


@pytest.fixture
def handlers_module(tmp_path, monkeypatch):
    (tmp_path / "durq_extra_handlers").mkdir()
    (tmp_path / "durq_extra_handlers" / "__init__.py").write_text("")
    (tmp_path / "durq_extra_handlers" / "billing.py").write_text(HANDLERS)
    (tmp_path / "durq_extra_handlers" / "broken.py").write_text("import durq_no_such_dependency\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "durq_extra_handlers.billing"
    registry.remove("tests.modules.hello")
    for name in [name for name in sys.modules if name.startswith("durq_extra_handlers")]:
        del sys.modules[name]


@pytest.mark.django_db
def test_start_up_imports_the_listed_modules(settings, handlers_module):
    settings.DURQ = {**settings.DURQ, "MODULES": [handlers_module]}
    assert registry.get("tests.modules.hello") is None
    apps.get_app_config("django_durq").ready()
    assert registry.require("tests.modules.hello").enqueue(who="web").kwargs == {"who": "web"}


def test_a_listed_module_that_does_not_exist_stops_start_up_naming_it(settings, handlers_module):
    settings.DURQ = {**settings.DURQ, "MODULES": ["durq_extra_handlers.bliling"]}
    with pytest.raises(ImproperlyConfigured, match=r"DURQ\[\"MODULES\"\] lists 'durq_extra_handlers.bliling', which cannot"):
        apps.get_app_config("django_durq").ready()


def test_an_import_failing_inside_a_listed_module_is_raised_as_is(settings, handlers_module):
    settings.DURQ = {**settings.DURQ, "MODULES": ["durq_extra_handlers.broken"]}
    with pytest.raises(ModuleNotFoundError, match="durq_no_such_dependency"):
        apps.get_app_config("django_durq").ready()


@pytest.mark.parametrize("value", ["billing.handlers", ["billing handlers"], [""], [3], {"billing": True}, ["billing..x"]])
def test_a_bad_modules_setting_is_a_check_error(value):
    settings = parse({"MODULES": value})
    assert settings.modules == ()
    assert [(p.id, p.hint) for p in settings.problems] == [
        ("durq.E016", 'Write for example DURQ["MODULES"] = ["billing.handlers"].')
    ]
    assert repr(value) in settings.problems[0].message


def test_modules_are_parsed_in_order():
    assert parse({"MODULES": ["billing.handlers", "shop"]}).modules == ("billing.handlers", "shop")
    assert parse({}).modules == ()
