"""The MariaDB watcher's view of job ids: a commit that lands after a later one still wakes the pools."""

from django_durq.worker.watcher import GAP_S, MAX_GAPS, IdGaps


def test_a_later_id_seen_first_leaves_the_earlier_one_in_view_until_it_commits():
    gaps = IdGaps(last=10)
    assert gaps.saw([12], now=0.0) is True
    assert gaps.open() == [11]
    assert gaps.saw([], now=1.0) is False  # still open
    assert gaps.saw([11], now=2.0) is True  # committed at last: a new job
    assert gaps.open() == []


def test_an_empty_table_at_start_still_keeps_the_ids_below_the_first_one_seen():
    gaps = IdGaps(last=0)  # MAX(id) of an empty table, with ids handed out before
    assert gaps.saw([5_001], now=0.0) is True
    assert gaps.open() == list(range(5_001 - MAX_GAPS, 5_001))
    assert gaps.saw([5_000], now=0.5) is True


def test_gaps_that_never_fill_are_forgotten():
    gaps = IdGaps(last=10)
    gaps.saw([12], now=0.0)
    assert gaps.saw([], now=GAP_S + 1) is False
    assert gaps.open() == []
