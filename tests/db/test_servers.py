"""Which servers of Django's mysql backend can hold the queue: MariaDB 10.6 or newer, never MySQL."""

from __future__ import annotations

import pytest

from django_durq.checks import check_database
from django_durq.db.checks import mysql_family_problem
from tests.conftest import db_vendor


def test_mysql_is_refused_with_its_own_id_naming_mariadb():
    problem = mysql_family_problem(False, (8, 4, 2))
    assert problem is not None
    assert problem.id == "durq.E017"
    assert problem.message.startswith("MySQL 8.4.2 is not supported: django-durq needs MariaDB 10.6 or newer")
    assert "MariaDB 10.6" in problem.hint


def test_mariadb_before_10_6_is_too_old():
    problem = mysql_family_problem(True, (10, 5, 22))
    assert problem is not None
    assert (problem.id, problem.message) == (
        "durq.E009",
        "MariaDB 10.5.22 is too old: django-durq needs 10.6 or newer (SKIP LOCKED)",
    )


@pytest.mark.parametrize("version", [(10, 6, 0), (10, 11, 9), (11, 4, 3)])
def test_mariadb_from_10_6_is_fine(version):
    assert mysql_family_problem(True, version) is None


@pytest.mark.skipif(db_vendor() != "mysql", reason="the mysql leg runs MariaDB")
@pytest.mark.django_db
def test_the_database_check_passes_on_the_mariadb_leg():
    from django.db import connection

    assert connection.mysql_is_mariadb
    assert check_database(databases=["default"]) == []
