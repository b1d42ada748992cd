"""Deprecated: the ``django.tasks`` backend is ``django_durq.tasks.backend.DurqBackend``.

``TASKS = {"default": {"BACKEND": "django_durq.backend.DurqBackend"}}`` keeps working and raises a
``DeprecationWarning`` once per process; write ``"django_durq.tasks.backend.DurqBackend"`` instead,
and import ``DurqTask`` and ``durq_options`` from ``django_durq.tasks.backend``.
"""

import warnings

from .tasks.backend import DurqBackend, DurqTask, DurqTaskContext, TaskCancelled, durq_options

warnings.warn(
    'django_durq.backend is deprecated: write "django_durq.tasks.backend.DurqBackend" in TASKS, '
    "and import DurqTask and durq_options from django_durq.tasks.backend",
    DeprecationWarning,
    stacklevel=2,
)

__all__ = ["DurqBackend", "DurqTask", "DurqTaskContext", "TaskCancelled", "durq_options"]
