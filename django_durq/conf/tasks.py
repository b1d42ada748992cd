"""``TASKS``: which of its backends are durq's, and the modules they list.

Read by the settings (only a DurqBackend reads results, which sets the default retention)
and by the bridge's start-up import of task modules. Imports no tasks framework: a backend
path is only imported to compare its class.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from django.conf import settings
from django.utils.module_loading import import_string

BACKEND_PATH = "django_durq.tasks.backend.DurqBackend"


def durq_backend_configured() -> bool:
    """Whether a ``TASKS`` backend is a DurqBackend (False when no tasks framework is installed)."""
    try:
        return _configured_modules() is not None
    except ImportError:
        return False


def _configured_modules() -> list[str] | None:
    """``OPTIONS["MODULES"]`` of every DurqBackend in ``TASKS``; None when there is none."""
    configured = getattr(settings, "TASKS", None)
    if not isinstance(configured, dict):
        return None
    modules: list[str] | None = None
    for params in configured.values():
        if not isinstance(params, dict) or not _is_durq_backend(params.get("BACKEND")):
            continue
        modules = modules or []
        options = params.get("OPTIONS") or {}
        listed = options.get("MODULES", []) if isinstance(options, dict) else []
        if isinstance(listed, (list, tuple)):
            modules.extend(module for module in listed if isinstance(module, str))
    return modules


def _is_durq_backend(path: Any) -> bool:
    if not isinstance(path, str):
        return False
    if path == BACKEND_PATH:
        import_module("django_durq.tasks.backend")  # says what to install when no tasks framework is
        return True
    try:
        backend = import_string(path)
    except ImportError:
        return False  # not ours; Django reports it when the backend is used
    return any(f"{kind.__module__}.{kind.__qualname__}" == BACKEND_PATH for kind in getattr(backend, "__mro__", ()))
