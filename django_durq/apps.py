from django.apps import AppConfig
from django.utils.module_loading import autodiscover_modules


class DurqConfig(AppConfig):
    name = "django_durq"
    verbose_name = "Job queue"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import checks  # noqa: F401 - registers the system checks

        # Import every installed app's jobs.py so that @job handlers are registered.
        autodiscover_modules("jobs")

        # With a DurqBackend in TASKS, import tasks.py too: Django @task functions register there.
        from .tasks_bridge import autodiscover_tasks

        autodiscover_tasks()
