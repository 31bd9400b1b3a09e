"""An alternative design: lines gathered per file and merged by epoch seconds; self time by a
sweep over the children's start and end points."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan


def _epoch(text: str) -> float:
    moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def find_trace(logs_dir: str | Path, trace_id: str) -> list[dict[str, Any]]:
    keyed = []
    for file_rank, path in enumerate(sorted(Path(logs_dir).glob("*.jsonl"))):
        for position, raw in enumerate(path.read_text("utf-8", "replace").splitlines()):
            try:
                line = json.loads(raw)
                if line["trace_id"] != trace_id:
                    continue
                keyed.append(((_epoch(line["timestamp"]), file_rank, position), line))
            except (ValueError, KeyError, TypeError, AttributeError):
                continue
    return [line for _, line in sorted(keyed, key=lambda item: item[0])]


def _self_ns(start: int, end: int, children: list[tuple[int, int]]) -> int:
    points = []
    for a, b in children:
        a, b = max(a, start), min(b, end)
        if b > a:
            points += [(a, 1), (b, -1)]
    covered, depth, since = 0, 0, start
    for at, step in sorted(points):
        if depth > 0:
            covered += at - since
        depth += step
        since = at
    return (end - start) - covered


def span_tree(spans: Iterable[ReadableSpan], trace_id: str
              ) -> list[tuple[int, str, float, float]]:
    wanted = int(trace_id, 16)
    mine = [s for s in spans if s.context and s.context.trace_id == wanted]
    by_id = {s.context.span_id: s for s in mine if s.context}
    kids: dict[int | None, list[ReadableSpan]] = defaultdict(list)
    for s in mine:
        parent = s.parent.span_id if s.parent and s.parent.span_id in by_id else None
        kids[parent].append(s)
    out: list[tuple[int, str, float, float]] = []
    stack = [(0, s) for s in sorted(kids[None], key=lambda s: s.start_time or 0, reverse=True)]
    while stack:
        depth, s = stack.pop()
        assert s.context is not None
        start, end = s.start_time or 0, s.end_time or 0
        children = sorted(kids[s.context.span_id], key=lambda k: k.start_time or 0)
        own = _self_ns(start, end, [(k.start_time or 0, k.end_time or 0) for k in children])
        out.append((depth, s.name, (end - start) / 1e6, own / 1e6))
        stack += [(depth + 1, k) for k in reversed(children)]
    return out


def slowest_span(spans: Iterable[ReadableSpan], trace_id: str) -> str | None:
    best = None
    for _, name, _, own in span_tree(spans, trace_id):
        if best is None or own > best[1]:
            best = (name, own)
    return best[0] if best else None
