"""The database server's clock as the queue's timeline: read through the queue's connection.

``clock.py`` holds the pure time helpers and the process-wide clock; ``apps.py`` hands
:func:`database_clock` to it as the default once Django's apps are loaded.
"""

from __future__ import annotations

from ..clock import Clock, ServerClock, SystemClock
from ..conf import get_settings
from .checks import database_now_ms


def database_clock(alias: str | None = None, base: Clock | None = None, refresh_s: float = 30.0) -> Clock:
    """A :class:`ServerClock` reading the queue's database (``DURQ["DATABASE"]`` by default).

    On SQLite, whose processes share one host's clock, that clock itself.
    """
    from django.db import connections

    connection = connections[alias or get_settings().database]
    if connection.vendor == "sqlite":
        return base or SystemClock()
    return ServerClock(lambda: database_now_ms(connections[connection.alias]), base=base, refresh_s=refresh_s)
