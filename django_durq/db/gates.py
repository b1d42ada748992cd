"""The turns limited claimers take, and a queue's pause state: rows of ``durq_queue_control``.

A limited claim counts what its limits allow and then claims, and two claimers counting the same
scope at once would both see its last free place. So each takes turns on what it counts:

- the queue's own row, for the queue's pause state and its own limits (``max_running``, rate);
- one row for every limit key, ``KEYS_GATE``, taken by every limited claim after its queue's
  turn. A key is one scope across queues, and a claim learns its candidates' keys only as it
  reads them, under its turns: one turn for all keys needs no order among key locks and no row
  per key, and is held for the few statements of one claim. It is shared by the limited claims
  of every queue, so a claimer frozen while it holds it holds up theirs too (bounded below).

The queue's turn is always taken first, then the keys' turn, so no two claimers wait on each
other. Where writers are serialized (SQLite), the first write of the transaction is the turn.

A claimer frozen while it holds a turn (``SIGSTOP``, a paused container, a stalled host) must
not stop the others for as long as it stays frozen. On PostgreSQL and MariaDB a claim waits at
most ``TURN_WAIT_S`` for a turn and then gives up the claim, not the completions committed in
the same transaction (``flow.claim_limited``); and the server ends a claimer's session once it
has been silent for ``TURN_HOLD_S`` inside its claim, which frees the turns it held.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .base import Dialect

CONTROL = "durq_queue_control"
# The control row whose lock is the turn of every claimer counting limit keys. Queue names
# cannot contain ":", so no queue has this row.
KEYS_GATE = ":keys"
# How long a claim waits for a turn before it claims nothing this time (MariaDB counts whole seconds).
TURN_WAIT_S = 1
# How long a claimer's session may stay silent inside its claim's transaction before the server ends it.
TURN_HOLD_S = 10


def take_turns(dialect: Dialect, queue: str, now_ms: int) -> bool:
    """Lock the queue's control row, then the limit keys' turn, for this transaction; True when the
    queue is paused (a paused queue's claim needs no keys' turn, and may or may not have taken it).
    """
    return dialect.lock_gates(queue, now_ms, keys=not dialect.serialized_writes)


def is_paused(dialect: Dialect, queue: str) -> bool:
    """Whether an operator has paused ``queue`` (as committed when the read began); locks nothing."""
    return bool(dialect.fetchall(f"SELECT 1 FROM {CONTROL} WHERE queue = %s AND paused", (queue,)))
