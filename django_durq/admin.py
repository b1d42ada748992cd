"""The queue in the Django admin: Jobs, Dead letters, Queues, Schedules and Workflows, one module each."""

from . import dead_letter_admin, job_admin, queue_admin, schedule_admin, workflow_admin  # noqa: F401 - each registers its page
