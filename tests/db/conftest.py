"""Fixtures of the tests that put PgBouncer between the queue and PostgreSQL."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from django.db import connection, connections
from django.db.utils import load_backend

from tests.pgbouncer import Bouncer, Missing, transaction_pooler

POOLED = "pooled"  # this test process's connection through PgBouncer


@pytest.fixture(scope="module")
def bouncer() -> Iterator[Bouncer]:
    try:
        with transaction_pooler() as running:
            yield running
    except Missing as missing:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{missing}; with CI=true this test must run")
        pytest.skip(str(missing))


@pytest.fixture
def pooled(bouncer: Bouncer, settings) -> Iterator[str]:
    """This process enqueues through PgBouncer: DURQ["DATABASE"] is a connection to the test database behind it.

    The connection is this thread's own, not in DATABASES: Django's test case lets a test use
    such a connection, and creates no test database for it.
    """
    behind = {**connection.settings_dict, "HOST": "127.0.0.1", "PORT": str(bouncer.port)}
    behind.update(OPTIONS={"application_name": "durq-tests"}, DISABLE_SERVER_SIDE_CURSORS=True)
    connections[POOLED] = load_backend(behind["ENGINE"]).DatabaseWrapper(behind, POOLED)
    settings.DURQ = {**settings.DURQ, "DATABASE": POOLED}
    try:
        yield POOLED
    finally:
        connections[POOLED].close()
        del connections[POOLED]
