"""What the admin's table cells show in little room: a time on one line, a job name that breaks between its parts.

The whole of each is one hover away (a time's title holds its date and zone), and on the job's page.
"""

from __future__ import annotations

import re

from django.utils import timezone
from django.utils.dateformat import format as date_format
from django.utils.html import escape, format_html
from django.utils.safestring import SafeString, mark_safe

from ..clock import ms_to_datetime
from ..ops import local_time

_BREAK_AFTER = re.compile(r"([._])")


def short_time(ms: int | None, now_ms: int, word: str = "") -> SafeString | str:
    """``10:00:43`` today, ``Dec 5, 10:00`` this year, ``2023-11-15`` before; ``word`` ("due") ahead of it.

    In Django's current time zone; the title holds the whole time with its zone (``ops.local_time``).
    """
    moment = ms_to_datetime(ms)
    if moment is None:
        return "-"
    local = timezone.localtime(moment)
    today = timezone.localtime(ms_to_datetime(now_ms)).date()
    if local.date() == today:
        shown = date_format(local, "H:i:s")
    elif local.year == today.year:
        shown = date_format(local, "M j, H:i")
    else:
        shown = date_format(local, "Y-m-d")
    lead = f"{word} " if word else ""
    return format_html(
        '<time class="durq-time" datetime="{}" title="{}">{}{}</time>', local.isoformat(), local_time(ms), lead, shown
    )


def breakable(name: str) -> SafeString:
    """``name`` escaped, with a ``<wbr>`` after each dot and underscore (``billing.<wbr>charge_<wbr>card``).

    Escaped text holds no dot or underscore inside an entity, so the breaks never split one.
    """
    return mark_safe(_BREAK_AFTER.sub(r"\1<wbr>", str(escape(name))))
