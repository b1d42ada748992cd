"""The queue in the Django admin: Jobs, Dead letters, Queues, Schedules and Workflows, one module each."""

from . import dead_letters, jobs, queues, schedules, workflows  # noqa: F401 - each registers its page
