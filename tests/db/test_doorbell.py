"""Bells: a ring for one job reaches one worker's socket, goes on to the others in turn, and skips ended ones."""

from __future__ import annotations

import select
import socket

import pytest

from django_durq.db import doorbell
from django_durq.db.doorbell import Bell
from tests.conftest import db_vendor

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(db_vendor() == "postgres", reason="PostgreSQL wakes workers with NOTIFY"),
]


def rung(bell: Bell) -> list[tuple[str, list[str]]]:
    select.select([bell], [], [], 1.0)
    return bell.take()


@pytest.fixture
def bells():
    opened = [Bell.open("default", f"host:{pid}:bell00") for pid in (1, 2, 3)]
    assert all(opened)
    yield opened
    for bell in opened:
        bell.close()


def test_a_ring_for_one_job_reaches_one_bell_and_is_passed_on_to_each_other_one_once(bells):
    doorbell.ring("default", ["mail"], jobs=1)
    first = [bell for bell in bells if rung(bell)]
    assert len(first) == 1
    tried: list[str] = []
    holder = first[0]
    for _ in range(len(bells) - 1):
        assert holder.pass_on("mail", tried)
        tried.append(holder.name)
        holder = next(bell for bell in bells if bell is not holder and (rings := rung(bell)) and rings[0][1] == tried)
        assert holder.name not in tried
    assert not holder.pass_on("mail", tried)  # every bell was tried


def test_a_ring_for_many_jobs_reaches_as_many_bells(bells):
    doorbell.ring("default", ["mail"], jobs=2)
    assert sum(1 for bell in bells if rung(bell)) == 2
    doorbell.ring("default", ["mail", "sms"])  # a number not known: every bell
    assert all(sorted(queue for queue, _ in rung(bell)) == ["mail", "sms"] for bell in bells)


def test_the_bell_of_an_ended_worker_is_skipped_and_removed(bells):
    for bell in bells[1:]:
        bell.socket.close()  # ended without a clean stop: the socket file stays
    for _ in range(5):  # whichever bell it picks first, a ring for one job reaches the live one
        doorbell.ring("default", ["mail"], jobs=1)
        assert rung(bells[0]) == [("mail", [])]
    doorbell.ring("default", ["mail"])  # tries every bell
    assert rung(bells[0]) == [("mail", [])]
    assert sorted(path.name for path in bells[0].root.glob(f"*{doorbell.SUFFIX}")) == [bells[0].name]


def test_no_bell_where_its_path_would_be_too_long_for_a_socket():
    assert Bell.open("default", "h" * 200) is None
    assert hasattr(socket, "AF_UNIX")
