"""An idle pool's probe interval: the safety net where new jobs wake the worker, the way to find
them where nothing does, and whatever ``DURQ["POLL_INTERVAL"]`` says when it is set."""

from __future__ import annotations

from django_durq.clock import ManualClock
from django_durq.conf import get_settings
from django_durq.worker.runtime import POLL_WITH_WAKEUPS_MS, POLL_WITHOUT_WAKEUPS_MS, Runtime


def runtime() -> Runtime:
    return Runtime(settings=get_settings(), clock=ManualClock(start_ms=0))


def test_unset_it_is_one_second_without_wake_ups_and_five_with_them(settings):
    settings.DURQ = {key: value for key, value in settings.DURQ.items() if key != "POLL_INTERVAL"}
    assert get_settings().poll_interval_ms is None
    polling = runtime()
    assert polling.poll_s == POLL_WITHOUT_WAKEUPS_MS / 1000 == 1.0
    polling.hears_wakeups()
    assert polling.poll_s == POLL_WITH_WAKEUPS_MS / 1000 == 5.0


def test_a_poll_interval_that_is_set_is_kept_either_way(settings):
    settings.DURQ = {**settings.DURQ, "POLL_INTERVAL": 0.3}
    polling = runtime()
    assert polling.poll_s == 0.3
    polling.hears_wakeups()
    assert polling.poll_s == 0.3
