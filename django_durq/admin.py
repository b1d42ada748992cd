"""The queue in the Django admin: Jobs, Dead letters, Queues and Schedules, one module each."""

from . import dead_letter_admin, job_admin, queue_admin, schedule_admin  # noqa: F401 - each registers its page
