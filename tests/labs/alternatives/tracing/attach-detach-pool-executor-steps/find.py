"""Finding one request: its log lines from every service, and where its time went."""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan


def _when(line: dict[str, Any]) -> datetime | None:
    try:
        moment = datetime.fromisoformat(str(line["timestamp"]))
    except (KeyError, ValueError):
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def find_trace(logs_dir: str | Path, trace_id: str) -> list[dict[str, Any]]:
    import heapq
    base = Path(logs_dir)
    names = sorted(p.name for p in base.iterdir() if p.is_file() and p.suffix == ".jsonl")
    per_file = []
    for rank, name in enumerate(names):
        rows = []
        for number, raw in enumerate((base / name).read_text("utf-8", "replace").splitlines()):
            try:
                line = json.loads(raw)
            except ValueError:
                continue
            if isinstance(line, dict) and line.get("trace_id") == trace_id:
                when = _when(line)
                if when is not None:
                    rows.append((when, rank, number, line))
        rows.sort(key=lambda r: r[:3])
        per_file.append(rows)
    return [r[3] for r in heapq.merge(*per_file, key=lambda r: r[:3])]


def _of_trace(spans: Iterable[ReadableSpan], trace_id: str) -> list[ReadableSpan]:
    wanted = int(trace_id, 16)
    return [s for s in spans if s.context is not None and s.context.trace_id == wanted
            and s.start_time is not None and s.end_time is not None]


def span_tree(spans: Iterable[ReadableSpan], trace_id: str
              ) -> list[tuple[int, str, float, float]]:
    """Depth first with an explicit stack; self time by a sweep over clipped child edges."""
    mine = _of_trace(spans, trace_id)
    by_id = {s.context.span_id: s for s in mine}
    kids: dict[int, list[ReadableSpan]] = {sid: [] for sid in by_id}
    roots: list[ReadableSpan] = []
    for s in mine:
        pid = s.parent.span_id if s.parent is not None else None
        (kids[pid] if pid in by_id and pid != s.context.span_id else roots).append(s)

    def self_ns(s: ReadableSpan) -> int:
        edges: list[tuple[int, int]] = []
        for k in kids[s.context.span_id]:
            a, b = max(s.start_time, k.start_time), min(s.end_time, k.end_time)
            if b > a:
                edges += [(a, 1), (b, -1)]
        edges.sort(key=lambda e: (e[0], -e[1]))
        covered, depth, since = 0, 0, 0
        for at, step in edges:
            if depth == 0 and step == 1:
                since = at
            depth += step
            if depth == 0 and step == -1:
                covered += at - since
        return (s.end_time - s.start_time) - covered

    rows: list[tuple[int, str, float, float]] = []
    stack = [(0, r) for r in sorted(roots, key=lambda r: r.start_time, reverse=True)]
    while stack:
        depth, s = stack.pop()
        rows.append((depth, s.name, (s.end_time - s.start_time) / 1e6, self_ns(s) / 1e6))
        for k in sorted(kids[s.context.span_id], key=lambda k: k.start_time, reverse=True):
            stack.append((depth + 1, k))
    return rows


def slowest_span(spans: Iterable[ReadableSpan], trace_id: str) -> str | None:
    best = None
    for row in span_tree(spans, trace_id):
        if best is None or row[3] > best[3]:
            best = row
    return None if best is None else best[1]
