"""A slot's connections between jobs (``worker/slot_connections.py``): kept while healthy, dropped
when a handler broke them or left them in a transaction, closed once ``CONN_MAX_AGE`` runs out, and
checked by the next handler's first query where ``CONN_HEALTH_CHECKS`` asks for it."""

from __future__ import annotations

import time

import pytest
from django.db import connection

from django_durq.worker.slot_connections import SlotConnections

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def slot():
    slot_connections = SlotConnections()
    slot_connections.after_idle()
    connection.ensure_connection()
    saved = dict(connection.settings_dict)
    close_at, health_checks = connection.close_at, connection.health_check_enabled
    yield slot_connections
    connection.settings_dict.update(saved)
    connection.close_at, connection.health_check_enabled = close_at, health_checks


def test_a_healthy_connection_is_kept_between_jobs_even_with_conn_max_age_0(slot):
    driver = connection.connection
    connection.settings_dict["CONN_MAX_AGE"] = 0
    connection.close_at = time.monotonic()  # Django's "close at the end of the request"
    slot.tidy()
    assert connection.connection is driver


def test_a_connection_is_closed_once_its_conn_max_age_has_run_out_and_not_before(slot):
    driver = connection.connection
    connection.settings_dict["CONN_MAX_AGE"] = 600
    connection.close_at = time.monotonic() + 600
    slot.tidy()
    assert connection.connection is driver
    connection.close_at = time.monotonic() - 1
    slot.tidy()
    assert connection.connection is None


def test_with_health_checks_the_next_handlers_first_query_checks_the_connection(slot):
    connection.settings_dict["CONN_MAX_AGE"] = 600
    connection.close_at = time.monotonic() + 600
    connection.health_check_enabled = True
    connection.health_check_done = True
    slot.tidy()
    assert connection.connection is not None and connection.health_check_done is False


def test_a_transaction_a_handler_left_open_is_rolled_back(slot):
    connection.set_autocommit(False)
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    slot.tidy()
    assert connection.get_autocommit() and not connection.in_atomic_block
