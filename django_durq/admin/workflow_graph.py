"""A workflow's graph as the admin draws it: inline SVG whose geometry is computed here, no script.

Each job is a box in the column of its depth (the longest path to it from a job that waits for
nothing), so a job is always right of every job it waits for; within a column, a job sits near
the jobs it waits for (their mean row), which keeps a fan-out and its fan-in level. An edge is a
curve from the right side of the job waited for to the left side of the job waiting.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from django.urls import reverse
from django.utils.text import Truncator

from ..ops import WorkflowDetail

NODE_W, NODE_H = 200, 70
GAP_X, GAP_Y = 64, 16
MARGIN = 12
# Past this many jobs a drawing is no longer read; the page's table lists every member.
MAX_NODES = 300


@dataclass
class Node:
    job_id: int
    x: int
    y: int
    name: str
    title: str
    status: str
    meta: str  # "#id · status · attempts"
    arguments: str
    progress: float | None  # 0..1, when the job reported progress
    external: bool
    url: str

    width = NODE_W
    height = NODE_H
    track_width = NODE_W - 20

    @property
    def bar_width(self) -> float:
        return round(self.track_width * (self.progress or 0), 1)


@dataclass
class Curve:
    path: str
    state: str  # "counted" once its end was counted, else "waiting"


def depths(nodes: list[int], edges: list[tuple[int, int]]) -> dict[int, int]:
    """Longest path from a root to each node; ``edges`` are (dependent, upstream) pairs.

    A cycle cannot be queued, but a drawing must not hang on bad rows: what a cycle leaves
    unplaced goes one column past the rest.
    """
    upstream: dict[int, list[int]] = defaultdict(list)
    downstream: dict[int, list[int]] = defaultdict(list)
    known = set(nodes)
    for job_id, depends_on in edges:
        if job_id in known and depends_on in known:
            upstream[job_id].append(depends_on)
            downstream[depends_on].append(job_id)
    left = {node: len(upstream[node]) for node in nodes}
    depth = {node: 0 for node in nodes if not left[node]}
    ready = sorted(depth)
    while ready:
        node = ready.pop()
        for child in downstream[node]:
            depth[child] = max(depth.get(child, 0), depth[node] + 1)
            left[child] -= 1
            if not left[child]:
                ready.append(child)
    last = max(depth.values(), default=-1) + 1
    return {node: depth.get(node, last) for node in nodes}


def layout(detail: WorkflowDetail) -> dict[str, Any]:
    """The SVG's size, boxes and curves, for ``admin/django_durq/workflow/graph.html``."""
    jobs = [*detail.external, *detail.jobs]
    if len(jobs) > MAX_NODES:
        return {"too_large": True, "count": len(jobs), "limit": MAX_NODES}
    external = {job.pk for job in detail.external}
    pairs = [(edge.job_id, edge.depends_on_id) for edge in detail.edges]
    depth = depths([job.pk for job in jobs], pairs)
    columns: dict[int, list[int]] = defaultdict(list)
    row: dict[int, float] = {}
    for column in sorted(set(depth.values())):
        members = [job.pk for job in jobs if depth[job.pk] == column]
        # Near the mean row of what each waits for; ties keep the order they were added in.
        placed = sorted(members, key=lambda pk: _mean([row[u] for u in detail.upstream(pk) if u in row], members.index(pk)))
        for index, pk in enumerate(placed):
            row[pk] = index
        columns[column] = placed
    tallest = max((len(ids) for ids in columns.values()), default=0)
    height = MARGIN * 2 + tallest * NODE_H + max(tallest - 1, 0) * GAP_Y
    position: dict[int, tuple[float, float]] = {}
    for column, ids in columns.items():
        # Each column is centred on the tallest one.
        offset = (height - (len(ids) * NODE_H + max(len(ids) - 1, 0) * GAP_Y)) // 2
        for index, pk in enumerate(ids):
            position[pk] = (MARGIN + column * (NODE_W + GAP_X), offset + index * (NODE_H + GAP_Y))
    nodes = [_node(job, position[job.pk], job.pk in external) for job in jobs]
    curves = [
        _curve(position[edge.depends_on_id], position[edge.job_id], edge.settled)
        for edge in detail.edges
        if edge.depends_on_id in position
    ]
    width = MARGIN * 2 + len(columns) * NODE_W + max(len(columns) - 1, 0) * GAP_X
    return {"too_large": False, "width": width, "height": height, "nodes": nodes, "curves": curves}


def _mean(values: list[float], fallback: float) -> float:
    return sum(values) / len(values) if values else fallback


def _node(job: Any, at: tuple[float, float], external: bool) -> Node:
    done, total = job.progress_done, job.progress_total
    progress = max(0.0, min(1.0, done / total)) if done is not None and total else None
    return Node(
        job_id=job.pk,
        x=round(at[0]),
        y=round(at[1]),
        name=Truncator(job.name).chars(28),
        title=f"{job.name} #{job.pk}: {job.state}" + (" (queued before this workflow)" if external else ""),
        status=job.status,
        meta=f"#{job.pk} · {job.status} · {job.attempts}/{job.max_attempts} attempts",
        arguments=Truncator(_arguments(job)).chars(32),
        progress=progress,
        external=external,
        url=reverse("admin:django_durq_job_change", args=[job.pk]),
    )


def _arguments(job: Any) -> str:
    """The values it was queued with, which tell apart jobs of one name (``42, 1080p``)."""
    try:
        values = [*job.args, *job.kwargs.values()]
    except ValueError:
        return ""
    return ", ".join(str(value) for value in values)


def _curve(start: tuple[float, float], end: tuple[float, float], settled: bool) -> Curve:
    x1, y1 = start[0] + NODE_W, start[1] + NODE_H / 2
    x2, y2 = end[0], end[1] + NODE_H / 2
    bend = (x2 - x1) / 2
    path = f"M {x1:.1f} {y1:.1f} C {x1 + bend:.1f} {y1:.1f}, {x2 - bend:.1f} {y2:.1f}, {x2 - 6:.1f} {y2:.1f}"
    return Curve(path=path, state="counted" if settled else "waiting")
