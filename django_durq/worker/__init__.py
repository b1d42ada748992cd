"""The worker runtime: the only package that starts threads or touches OS signals."""

from . import duties  # noqa: F401 - registers the cron and retention duties
from .supervisor import Supervisor, run_in_thread

__all__ = ["Supervisor", "run_in_thread"]
