"""The ``durq`` command's arguments: each checked at the edge, a bad one one line and exit status 2."""

from __future__ import annotations

import argparse
import getpass
import re
from typing import NoReturn

from django.core.management import CommandError, CommandParser

from ..ops.pausing import check_words

USAGE_ERROR = 2
NOT_ALL_DONE = 1

MAX_DURATION_MS = 100 * 365 * 86_400_000  # past this, "now minus the duration" is no time a job has
_UNITS_MS = {"s": 1_000, "m": 60_000, "min": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000}
# ASCII digits only: str.isdigit() and \d also take "²" and "١٢٣", which int() then refuses or misreads.
_DIGITS = re.compile(r"[0-9]+")
_DURATION = re.compile(r"^([0-9]+(?:\.[0-9]+)?)\s*(s|m|min|h|d|w)$")


class OneLineParser(CommandParser):
    """Reports a usage error as one line and exit status 2 (a ``CommandError`` when called from code)."""

    def error(self, message: str) -> NoReturn:
        if self.called_from_command_line:
            self.exit(USAGE_ERROR, f"{self.prog}: error: {message} (see --help)\n")
        raise CommandError(f"Error: {message}", returncode=USAGE_ERROR)


def job_id(text: str) -> int:
    if not _DIGITS.fullmatch(text) or int(text) < 1 or len(text) > 18:
        raise argparse.ArgumentTypeError(f"{text!r} is not a job id (a positive whole number)")
    return int(text)


def positive_int(text: str) -> int:
    if not _DIGITS.fullmatch(text) or len(text) > 18 or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of at least 1")
    return int(text)


def duration_ms(text: str) -> int:
    """``30s``, ``15m``, ``12h``, ``7d``, ``2w`` -> milliseconds."""
    match = _DURATION.match(text.strip())
    if match is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration: write a number and a unit, e.g. 30s, 15m, 12h, 7d, 2w")
    ms = round(float(match.group(1)) * _UNITS_MS[match.group(2)])
    if ms > MAX_DURATION_MS:
        raise argparse.ArgumentTypeError(f"{text!r} is longer than 100 years")
    return ms


def reason_text(text: str) -> str:
    try:
        return check_words(text, "")[0]
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def operator() -> str:
    """Who runs this command, for the record of a pause or a resume."""
    try:
        return f"{getpass.getuser()} (manage.py durq)"
    except (OSError, KeyError):  # no user name in the environment or the password database
        return "manage.py durq"


def queue_name(text: str) -> str:
    if not text or ":" in text or "\x00" in text or len(text) > 100:
        raise argparse.ArgumentTypeError(f"{text!r} is not a queue name (1 to 100 characters, no ':' or NUL)")
    return text
