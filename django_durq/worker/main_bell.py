"""What wakes the worker's main thread: another thread's ``ring()``, or a signal's arrival.

The main thread sleeps until something it must act on happens (a stop was requested, a pool
finished) instead of waking ten times a second to look. A signal handler cannot ring the bell
itself without risk (it runs on the main thread, perhaps inside the wait, and must take no lock
the main thread may hold), so the bell's socket is also the interpreter's signal wake-up fd: the
C-level handler writes a byte there the moment a signal arrives, and the wait returns to run it.
"""

from __future__ import annotations

import contextlib
import select
import signal
import socket
import threading


class MainBell:
    def __init__(self) -> None:
        self._reader, self._writer = socket.socketpair()
        self._reader.setblocking(False)
        self._writer.setblocking(False)
        self._previous_fd: int | None = None

    def ring(self) -> None:
        """Wake the main thread; safe from any thread, and a no-op once the bell is closed."""
        with contextlib.suppress(BlockingIOError, OSError):  # full: a byte is already waiting
            self._writer.send(b"\0")

    def wait(self, timeout_s: float) -> None:
        """Sleep until rung, a signal arrives or ``timeout_s`` passes; forget the rings so far."""
        select.select([self._reader], [], [], timeout_s)
        with contextlib.suppress(BlockingIOError, OSError):
            while self._reader.recv(4096):
                pass

    def hear_signals(self) -> None:
        """Make signals ring the bell; only the main thread can, elsewhere it is left as it was."""
        if threading.current_thread() is threading.main_thread():
            self._previous_fd = signal.set_wakeup_fd(self._writer.fileno(), warn_on_full_buffer=False)

    def close(self) -> None:
        if self._previous_fd is not None:
            signal.set_wakeup_fd(self._previous_fd)
            self._previous_fd = None
        self._reader.close()
        self._writer.close()
