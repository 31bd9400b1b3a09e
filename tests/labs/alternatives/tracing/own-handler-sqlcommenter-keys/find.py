"""Finding one request: its lines in every service's log, and where its time went.

Design: instants as integer microseconds since the epoch (exact, whatever the offset), and
self time by a sweep over the children's clipped start/end events.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICRO = timedelta(microseconds=1)


def _instant_us(value: Any) -> int | None:
    if not isinstance(value, str):
        return None
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return (moment - _EPOCH) // _MICRO


def find_trace(logs_dir: str | Path, trace_id: str) -> list[dict[str, Any]]:
    names = sorted(entry.name for entry in os.scandir(logs_dir)
                   if entry.is_file() and entry.name.endswith(".jsonl"))
    keyed: list[tuple[int, int, int, dict[str, Any]]] = []
    for file_rank, name in enumerate(names):
        with open(os.path.join(logs_dir, name), "rb") as handle:
            for line_no, raw in enumerate(handle):
                try:
                    obj = json.loads(raw.decode("utf-8", "replace"))
                except ValueError:
                    continue
                if type(obj) is not dict or obj.get("trace_id") != trace_id:
                    continue
                when = _instant_us(obj.get("timestamp"))
                if when is None:
                    continue
                keyed.append((when, file_rank, line_no, obj))
    keyed.sort(key=lambda k: k[:3])
    return [k[3] for k in keyed]


def _self_ns(start: int, end: int, kids: list[tuple[int, int]]) -> int:
    """end - start minus the part of [start, end) covered by at least one kid."""
    events: list[tuple[int, int]] = []
    for a, b in kids:
        a, b = max(a, start), min(b, end)
        if b > a:
            events.append((a, 1))
            events.append((b, -1))
    events.sort()
    depth, covered, since = 0, 0, start
    for at, step in events:
        if depth > 0:
            covered += at - since
        depth += step
        since = at
    return (end - start) - covered


def span_tree(spans: Iterable[ReadableSpan], trace_id: str
              ) -> list[tuple[int, str, float, float]]:
    wanted = int(trace_id, 16)
    mine = [s for s in spans
            if s.context is not None and s.context.trace_id == wanted
            and s.start_time is not None and s.end_time is not None]
    by_id = {s.context.span_id: s for s in mine}
    kids: dict[int, list[ReadableSpan]] = defaultdict(list)
    roots: list[ReadableSpan] = []
    for s in mine:
        pid = s.parent.span_id if s.parent is not None else None
        if pid is not None and pid in by_id and pid != s.context.span_id:
            kids[pid].append(s)
        else:
            roots.append(s)
    out: list[tuple[int, str, float, float]] = []
    stack = [(0, s) for s in sorted(roots, key=lambda s: s.start_time, reverse=True)]
    while stack:  # iterative depth first: push siblings latest first
        depth, s = stack.pop()
        children = kids.get(s.context.span_id, [])
        own = _self_ns(s.start_time, s.end_time,
                       [(c.start_time, c.end_time) for c in children])
        out.append((depth, s.name, (s.end_time - s.start_time) / 1_000_000, own / 1_000_000))
        for c in sorted(children, key=lambda c: c.start_time, reverse=True):
            stack.append((depth + 1, c))
    return out


def slowest_span(spans: Iterable[ReadableSpan], trace_id: str) -> str | None:
    best: tuple[float, str] | None = None
    for _, name, _, own in span_tree(spans, trace_id):
        if best is None or own > best[0]:
            best = (own, name)
    return None if best is None else best[1]
