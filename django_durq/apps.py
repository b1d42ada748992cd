from importlib import import_module

from django.apps import AppConfig
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import autodiscover_modules

from .clock import set_default_clock
from .conf import get_settings
from .db.clock import database_clock
from .enqueue.results import result
from .tasks.bridge import autodiscover_tasks


class DurqConfig(AppConfig):
    name = "django_durq"
    verbose_name = "Job queue"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import checks  # noqa: F401 - registers the system checks; app loading: checks import models
        from .models import hand_in_result_reader  # app loading: models load once the registry is ready

        # The queue's timeline is the database server's clock (clock.py cannot import the dialects).
        set_default_clock(database_clock)
        # Job.wait() reads its result through the operation the vocabulary cannot import.
        hand_in_result_reader(result)

        # Import every installed app's jobs.py, and the modules DURQ["MODULES"] lists, so that
        # @job handlers are registered in every process: a worker runs only what it registered.
        autodiscover_modules("jobs")
        for path in get_settings().modules:
            try:
                import_module(path)
            except ModuleNotFoundError as error:
                if error.name is None or not f"{path}.".startswith(f"{error.name}."):
                    raise  # the module exists; an import inside it failed
                raise ImproperlyConfigured(f'DURQ["MODULES"] lists {path!r}, which cannot be imported: {error}') from error

        # With a DurqBackend in TASKS, import tasks.py too: Django @task functions register there.

        autodiscover_tasks()
