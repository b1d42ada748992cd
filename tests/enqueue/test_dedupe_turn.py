"""MariaDB: the turn to insert a dedupe key is a named lock of the session, given back whatever
happened inside it, a transaction broken by a deadlock included."""

from __future__ import annotations

import pytest
from django.db import OperationalError, connection, transaction

from django_durq.db import dialect_for
from tests.conftest import db_vendor

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(db_vendor() != "mysql", reason="the turn is a MariaDB named lock"),
]


def turn_is_free(key: str) -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT IS_FREE_LOCK(CONCAT('durq:', SHA1(CONCAT(DATABASE(), ':', %s))))", (key,))
        return cursor.fetchone()[0] == 1


def test_a_broken_transaction_inside_the_turn_surfaces_its_own_error_and_gives_the_turn_back():
    dialect = dialect_for(connection)
    deadlock = OperationalError(1213, "Deadlock found when trying to get lock")
    with pytest.raises(OperationalError) as raised, transaction.atomic(), dialect.dedupe_turn("turn-key"):
        assert not turn_is_free("turn-key")
        transaction.set_rollback(True)  # as InnoDB's rollback of a deadlocked transaction leaves it
        raise deadlock
    assert raised.value is deadlock  # not Django's refusal to run the release in a broken transaction
    assert turn_is_free("turn-key")
