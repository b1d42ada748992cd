"""The worker's main thread sleeps until rung: by another thread, or by a signal's arrival (even
one that arrived before the wait began), never by a signal handler taking a lock."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator

import pytest

from django_durq.worker.main_bell import MainBell

# Far longer than any wake-up takes: a wait that lasted this long was not woken.
LONG_S = 30.0


@pytest.fixture
def bell() -> Iterator[MainBell]:
    bell = MainBell()
    yield bell
    bell.close()


@pytest.fixture
def usr1() -> Iterator[list[int]]:
    """SIGUSR1 handled by recording it, as the supervisor's handlers record and return."""
    heard: list[int] = []
    previous = signal.signal(signal.SIGUSR1, lambda signum, frame: heard.append(signum))
    yield heard
    signal.signal(signal.SIGUSR1, previous)


def waited_s(bell: MainBell) -> float:
    started = time.monotonic()
    bell.wait(LONG_S)
    return time.monotonic() - started


def test_a_ring_from_another_thread_wakes_the_wait(bell):
    threading.Timer(0.1, bell.ring).start()
    assert waited_s(bell) < LONG_S / 2


def test_rings_before_the_wait_wake_it_once_and_are_then_forgotten(bell):
    bell.ring()
    bell.ring()
    assert waited_s(bell) < LONG_S / 2
    started = time.monotonic()
    bell.wait(0.2)  # the earlier rings are spent: this one runs its course
    assert time.monotonic() - started >= 0.2


def test_a_signal_wakes_the_wait_and_its_handler_has_run(bell, usr1):
    bell.hear_signals()
    threading.Timer(0.1, os.kill, (os.getpid(), signal.SIGUSR1)).start()
    assert waited_s(bell) < LONG_S / 2
    assert usr1 == [signal.SIGUSR1]


def test_a_signal_that_came_before_the_wait_is_not_lost(bell, usr1):
    bell.hear_signals()
    os.kill(os.getpid(), signal.SIGUSR1)
    assert usr1 == [signal.SIGUSR1]  # handled at once, before any wait
    assert waited_s(bell) < LONG_S / 2


def current_wakeup_fd() -> int:
    fd = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(fd)
    return fd


def test_closing_gives_back_the_signal_fd_and_a_late_ring_is_harmless():
    before = current_wakeup_fd()
    bell = MainBell()
    bell.hear_signals()
    during = current_wakeup_fd()
    bell.close()
    assert during != before and current_wakeup_fd() == before
    bell.ring()  # a thread still running after the supervisor stopped
