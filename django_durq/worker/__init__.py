"""The worker runtime: the only package that starts threads or touches OS signals."""

from .supervisor import Supervisor, run_in_thread

__all__ = ["Supervisor", "run_in_thread"]
