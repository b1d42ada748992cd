"""A claim's row becomes a ClaimedJob by position: its fields must follow CLAIM_COLUMNS in order."""

from dataclasses import fields

from django_durq.db.rows import CLAIM_COLUMNS, ClaimedJob


def test_the_fields_of_a_claimed_job_follow_the_claims_columns_in_order():
    names = tuple(field.name for field in fields(ClaimedJob))
    assert names[: len(CLAIM_COLUMNS)] == CLAIM_COLUMNS, "a column added to CLAIM_COLUMNS needs its field at the same place"
    assert names[len(CLAIM_COLUMNS) :] == ("placed",), "fields set after the claim come after every column"
