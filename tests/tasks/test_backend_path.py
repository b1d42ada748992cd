"""The TASKS path written before the tasks backend had a room of its own still works, and warns."""

from __future__ import annotations

import importlib
import sys

import pytest
from django.test import override_settings

from django_durq.conf.tasks import durq_backend_configured
from django_durq.tasks.backend import DurqBackend, DurqTask, durq_options

OLD = "django_durq.backend.DurqBackend"


def test_the_old_path_warns_and_names_the_same_backend() -> None:
    sys.modules.pop("django_durq.backend", None)
    with pytest.warns(DeprecationWarning, match="django_durq.tasks.backend.DurqBackend"):
        old = importlib.import_module("django_durq.backend")
    assert (old.DurqBackend, old.DurqTask, old.durq_options) == (DurqBackend, DurqTask, durq_options)


def test_a_tasks_setting_with_the_old_path_is_a_durq_backend() -> None:
    sys.modules.pop("django_durq.backend", None)
    with override_settings(TASKS={"default": {"BACKEND": OLD}}), pytest.warns(DeprecationWarning):
        assert durq_backend_configured()
