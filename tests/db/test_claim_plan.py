"""PostgreSQL: a dispatcher on a session of its own keeps its claim's plan on the server.

With Django's default client-side binding the server would plan each claim anew, and planning
costs more than the claim itself. The dispatcher's connection prepares the claim once, with a
generic plan; behind a transaction pooler (``DURQ["LISTEN_DATABASE"]`` elsewhere, or None) a
prepared statement would be missing on the next server connection, so nothing is prepared there.
With server-side binding the server cannot take ``EXECUTE``'s arguments as parameters: the claim
is sent as text, for the driver to prepare.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

import pytest
from django.conf import settings
from django.db import connection, transaction
from django.test import override_settings

from django_durq.clock import now_ms
from django_durq.db import dialect_for
from django_durq.db.store import Store
from django_durq.models import Job
from tests.conftest import db_vendor
from tests.ledger import jobs

PREPARED = {"durq_claim", "durq_claim_counted", "durq_claim_counted_unflushed", "durq_claim_ids"}

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(db_vendor() != "postgres", reason="prepared claims are PostgreSQL's"),
]


@contextmanager
def binding(server_side: bool) -> Iterator[None]:
    """Sessions opened meanwhile bind on the server or on the client, whatever the test leg says."""
    options = connection.settings_dict.setdefault("OPTIONS", {})
    saved = dict(options)
    connection.close()
    options["server_side_binding"] = server_side
    try:
        yield
    finally:
        connection.close()
        options.clear()
        options.update(saved)


@pytest.fixture(autouse=True)
def client_side():
    """A fresh session (nothing prepared yet) with Django's default binding."""
    with binding(server_side=False):
        yield


def prepared_claims() -> dict[str, tuple[int, int]]:
    """This session's prepared claims: name -> (generic plans run, custom plans run)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT name, generic_plans, custom_plans FROM pg_prepared_statements WHERE name LIKE 'durq%%'")
        return {name: (generic, custom) for name, generic, custom in cursor.fetchall()}


def claim(limit: int) -> list[int]:
    """An idle dispatcher's claim: its own transaction, counted in its statement."""
    return [job.id for job in Store("default").claim("default", limit, now_ms(), "test:1:claimer")]


def test_the_dispatchers_session_claims_through_a_generic_plan_it_prepared_once():
    low = jobs.effect.enqueue(tag="low")
    high = jobs.effect.using(priority=5).enqueue(tag="high")
    later = jobs.effect.using(run_in=timedelta(hours=1)).enqueue(tag="later")
    dialect_for(connection).prepare_dispatcher_connection()
    dialect_for(connection).prepare_dispatcher_connection()  # again on the same session: nothing to redo
    assert set(prepared_claims()) == PREPARED
    assert claim(5) == [high.pk, low.pk]  # priority first; a job not yet due is left
    assert claim(5) == []
    row = Job.objects.get(pk=high.pk)
    assert (row.status, row.attempts, row.claimed_by) == ("running", 1, "test:1:claimer")
    assert row.lease_expires_ms == row.started_ms + row.lease_ms  # a time in ms: a bigint, not an integer
    assert Job.objects.get(pk=later.pk).status == "waiting"
    generic, custom = prepared_claims()["durq_claim_counted_unflushed"]
    assert (generic, custom) == (2, 0)


def test_the_limited_claim_runs_prepared_too_and_takes_only_jobs_under_the_key_counted():
    first = jobs.one_per_key.enqueue(key="a", log="/dev/null")
    second = jobs.one_per_key.enqueue(key="b", log="/dev/null")
    dialect = dialect_for(connection)
    dialect.prepare_dispatcher_connection()
    with transaction.atomic():  # as a limited claim runs it, under its turns
        claimed = dialect.claim_ids([(first.pk, "a"), (second.pk, "not b")], now_ms(), "test:1:claimer")
    assert [job.id for job in claimed] == [first.pk]
    assert Job.objects.get(pk=second.pk).status == "waiting"
    assert prepared_claims()["durq_claim_ids"] == (1, 0)  # one generic plan run, none planned for its values


def test_a_new_session_claims_by_text_until_it_is_prepared_again():
    dialect_for(connection).prepare_dispatcher_connection()
    connection.close()  # Django reconnects: the server forgot what the old session prepared
    job = jobs.effect.enqueue(tag="one")
    assert claim(1) == [job.pk]
    assert prepared_claims() == {}
    dialect_for(connection).prepare_dispatcher_connection()
    assert set(prepared_claims()) == PREPARED


@pytest.mark.parametrize("listen", [None, "elsewhere"])
def test_nothing_is_prepared_where_the_queue_database_may_go_through_a_pooler(listen):
    with override_settings(DURQ={**settings.DURQ, "LISTEN_DATABASE": listen}):
        dialect_for(connection).prepare_dispatcher_connection()
        job = jobs.effect.enqueue(tag="one")
        assert claim(1) == [job.pk]
    assert prepared_claims() == {}


def test_with_server_side_binding_the_claim_goes_as_text_and_works():
    with binding(server_side=True):
        job = jobs.effect.enqueue(tag="one")
        dialect_for(connection).prepare_dispatcher_connection()
        assert prepared_claims() == {}
        assert claim(1) == [job.pk]
        assert Job.objects.get(pk=job.pk).status == "running"
