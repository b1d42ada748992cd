"""``manage.py durq limits``: limits at work per queue, as a table or JSON."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand

from .. import ops
from ..clock import now_ms


def show_limits(command: BaseCommand, options: dict[str, Any]) -> None:
    rows = ops.limit_usage(queue=options.get("queue"), now_ms=now_ms())
    if options["json"]:
        command.stdout.write(json.dumps([row.as_dict() for row in rows], indent=2))
        return
    if not rows:
        command.stdout.write("No queue has limits or limited jobs.")
        return
    table = [["QUEUE", "RUNNING", "STARTED/WINDOW", "KEYS AT LIMIT", "HELD BACK"]]
    for row in rows:
        running = f"{row.running}/{row.max_running}" if row.max_running is not None else str(row.running)
        window = f"{row.started_in_window}/{row.rate}" if row.rate is not None else "-"
        table.append([row.queue, running, window, str(row.keys_at_limit), str(row.held_back)])
    widths = [max(len(line[i]) for line in table) for i in range(len(table[0]))]
    for line in table:
        command.stdout.write("  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip())
    for row in rows:
        for key in row.keys:
            why = (
                f"{key.running}/{key.max_running} running"
                if key.max_running is not None and key.running >= key.max_running
                else f"{key.started_in_window}/{key.rate} started in {key.period_ms} ms"
            )
            command.stdout.write(f"  {row.queue}: key {key.key!r} at its limit ({why})")
