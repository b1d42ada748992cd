"""Whether a PostgreSQL alias reaches the server itself, or a transaction pooler that lends sessions out.

A transaction pooler (PgBouncer with ``pool_mode = transaction``, and others alike) lends each
client one of its server connections for one transaction, then lends it to the next client.
State kept by a server session (``LISTEN``, advisory locks, SQL ``PREPARE``) then stays behind on
a connection that serves other clients: a worker would hear no notification, two workers would
both hold the one maintenance lock, and a prepared claim would be missing on the next server
connection. Nothing in ``DATABASES`` says whether a host and port lead to a pooler, so the worker
asks the server instead, once per process (``lends_sessions``).

The probe opens two client connections and reads ``pg_backend_pid()`` in rounds of six transactions, in the
order A, A, B, B, A, B. Straight to the server each client connection is one backend for its whole
life, and two are two: every read on A gives one pid, every read on B another. Through a
transaction pooler the backend goes with the transaction: PgBouncer lends the server connection
released last to the next client (``server_round_robin = 0``, its default) — then B gets A's — or
the one idle longest (``server_round_robin = 1``) — then A's two reads differ — and with a single
server connection everyone gets the same one. Either way one client shows two pids or two clients
share one. A pool in session mode keeps each client on one backend for the client's life, as a
direct connection does, and rightly passes: session state works through it.
"""

from __future__ import annotations

import contextlib
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper

from .base import own_connection

# The clients of the probe's transactions, in order (see the module's docstring), eight times over:
# through a pooler, workers probing at the same moment can take the server connections between
# one client's transactions so that one short round looks direct; straight to the server every
# round gives the same answer, so repeating can only find a pooler that one round missed.
PROBE_ORDER = "AABBAB" * 8

# Verdicts measured in this process, by where the alias leads: a worker probes once, at start.
_verdicts: dict[tuple[Any, ...], bool] = {}


def _target(wrapper: BaseDatabaseWrapper) -> tuple[Any, ...]:
    settings = wrapper.settings_dict
    return (settings.get("HOST"), str(settings.get("PORT")), settings.get("NAME"), settings.get("USER"))


def _backend_pid(raw: Any) -> int:
    cursor = raw.cursor()
    # Never prepared: psycopg prepares a statement from its sixth run on one client connection,
    # under a name that every client uses alike, and through a pooler the two clients' statements
    # land on one server session, where the second ``PREPARE`` of that name fails.
    cursor.execute("SELECT pg_backend_pid()", prepare=False)
    return int(cursor.fetchone()[0])


def lends_sessions(wrapper: BaseDatabaseWrapper) -> bool:
    """True when ``wrapper``'s connections reach a transaction pooler, which lends server sessions to other clients.

    Measured once per process and database (two connections, 48 one-statement transactions);
    raises what connecting raises.
    """
    target = _target(wrapper)
    if target not in _verdicts:
        clients = {"A": own_connection(wrapper)}
        try:
            clients["B"] = own_connection(wrapper)
            seen: dict[str, set[int]] = {"A": set(), "B": set()}
            for name in PROBE_ORDER:
                clients[name].autocommit = True  # each statement its own transaction
                seen[name].add(_backend_pid(clients[name]))
        finally:
            for raw in clients.values():
                with contextlib.suppress(Exception):
                    raw.close()
        _verdicts[target] = len(seen["A"]) > 1 or len(seen["B"]) > 1 or bool(seen["A"] & seen["B"])
    return _verdicts[target]
