"""Django's tasks framework on durq: ``TASKS = {"default": {"BACKEND": "django_durq.tasks.backend.DurqBackend"}}``.

``backend`` is what Django calls, ``bridge`` is how a worker runs a ``@task``; the other
modules translate between Django's task vocabulary and durq's. ``autodiscover_modules("tasks")``
imports this package too when a DurqBackend is configured: it defines no task and loads nothing.
"""
