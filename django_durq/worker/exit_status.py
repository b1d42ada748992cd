"""The exit status of ``durq_worker``: why the process ended, for the process manager that restarts it.

A stop the worker was asked for is 0, so that a manager restarting "on failure" leaves it be; a
stop because something went wrong is never 0 (docs/reference/commands.md lists each cause).
"""

from __future__ import annotations

from django.db import InterfaceError, OperationalError

# A stop it was asked for: SIGTERM or SIGINT (after the grace period), --burst with nothing left
# due, --max-jobs, --max-memory, or a signal during start-up.
CLEAN = 0
# Stopped at once by a second SIGINT or a SIGQUIT: running jobs keep their leases until they expire.
ABORTED = 1
# Refused to start: a bad option or setting, a system-check error, a database it cannot use,
# unapplied migrations. Starting it again changes nothing until the cause is fixed.
REFUSED = 2
# A part of the worker stopped on an unexpected error: a queue's dispatcher, the lease keeper, the
# monitor or the maintenance runner. The worker then stops as on SIGTERM (running jobs get the
# grace period) and exits with this status.
FAILED = 3
# The database stayed unreachable: for two minutes at start-up, or while running, past the two
# minutes of retries of a dispatcher's claim.
DATABASE_UNREACHABLE = 4


def of_failure(error: BaseException) -> int:
    """The status of a worker whose part stopped on ``error``: a lost database, or anything else."""
    if isinstance(error, OperationalError | InterfaceError):
        return DATABASE_UNREACHABLE
    return FAILED
