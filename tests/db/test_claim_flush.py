"""PostgreSQL: a claim that is its own transaction does not wait for its WAL flush; any other does.

The flush is most of the time from a commit to the handler's start. What the claim turns off is
observed on the server: the test opens the transaction itself (Django still sees autocommit, so
the claim is made as a lone claim) and reads ``synchronous_commit`` in it before committing.
"""

from __future__ import annotations

import pytest
from django.conf import settings
from django.db import connection, transaction
from django.test import override_settings

from django_durq.clock import now_ms
from django_durq.db import counters, dialect_for
from django_durq.models import Job
from tests.conftest import db_vendor
from tests.ledger import jobs

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(db_vendor() != "postgres", reason="synchronous_commit is PostgreSQL's"),
]


@pytest.fixture(params=["planned anew", "prepared"])
def claim_path(request):
    """Both ways a claim is sent: its text, planned each time, or the dispatcher's prepared statement."""
    if request.param == "prepared":
        dialect_for(connection).prepare_dispatcher_connection()
    yield request.param
    connection.close()  # the next test's session has nothing prepared


def claim_alone_and_read_the_setting() -> tuple[int, str]:
    """Claim as an idle dispatcher's lone claim, inside a transaction the server holds open.

    Returns the jobs claimed and the transaction's ``synchronous_commit``.
    """

    def begin_first(execute, sql, params, many, context):
        if sql.lstrip().startswith(("WITH expired", "EXECUTE durq_claim")):
            context["cursor"].execute("BEGIN")
        return execute(sql, params, many, context)

    now = now_ms()
    with connection.execute_wrapper(begin_first):
        claimed = dialect_for(connection).claim_counted("default", 5, now, "test:1:claimer", counters.claim_count(now))
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('synchronous_commit')")
        setting = cursor.fetchone()[0]
        cursor.execute("COMMIT")
    return len(claimed), setting


def test_a_lone_claim_commits_without_waiting_for_the_flush(claim_path):
    job = jobs.effect.enqueue(tag="one")
    assert claim_alone_and_read_the_setting() == (1, "off")
    assert Job.objects.get(pk=job.pk).status == "running"  # committed all the same
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('synchronous_commit')")
        assert cursor.fetchone()[0] == "on"  # for that transaction only


def test_durable_claims_wait_for_the_flush(claim_path):
    jobs.effect.enqueue(tag="one")
    with override_settings(DURQ={**settings.DURQ, "DURABLE_CLAIMS": True}):
        assert claim_alone_and_read_the_setting() == (1, "on")


def test_a_claim_inside_a_transaction_leaves_the_flush_to_it(claim_path):
    # Completions and a claim commit together (complete_and_claim): the completions must be flushed.
    jobs.effect.enqueue(tag="one")
    with transaction.atomic():
        assert len(dialect_for(connection).claim("default", 5, now_ms(), "test:1:claimer")) == 1
        with connection.cursor() as cursor:
            cursor.execute("SELECT current_setting('synchronous_commit')")
            assert cursor.fetchone()[0] == "on"
