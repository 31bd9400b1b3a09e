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


def _lines(path: Path, trace_id: str) -> Iterable[tuple[datetime, dict[str, Any]]]:
    with path.open(encoding="utf-8", errors="replace") as lines:
        for raw in lines:
            try:
                line = json.loads(raw)
            except ValueError:
                continue
            if isinstance(line, dict) and line.get("trace_id") == trace_id:
                when = _when(line)
                if when is not None:
                    yield when, line


def find_trace(logs_dir: str | Path, trace_id: str) -> list[dict[str, Any]]:
    """Every line of every service's log (`*.jsonl` directly in `logs_dir`) that carries
    `trace_id`, in time order (ties: file name, then position; the sort is stable)."""
    found: list[tuple[datetime, dict[str, Any]]] = []
    files = [p for p in Path(logs_dir).iterdir() if p.suffix == ".jsonl" and p.is_file()]
    for path in sorted(files, key=lambda p: p.name):
        found.extend(_lines(path, trace_id))
    found.sort(key=lambda item: item[0])
    return [line for _, line in found]


def _of_trace(spans: Iterable[ReadableSpan], trace_id: str) -> list[ReadableSpan]:
    wanted = int(trace_id, 16)
    return [s for s in spans if s.context is not None and s.context.trace_id == wanted
            and s.start_time is not None and s.end_time is not None]


def _covered(intervals: list[tuple[int, int]]) -> int:
    """Nanoseconds covered by at least one interval."""
    total, reach = 0, None
    for start, end in sorted(intervals):
        if reach is None or start > reach:
            total += end - start
            reach = end
        elif end > reach:
            total += end - reach
            reach = end
    return total


def span_tree(spans: Iterable[ReadableSpan], trace_id: str
              ) -> list[tuple[int, str, float, float]]:
    """The trace's spans depth first, siblings by start time: (depth, name, duration ms, self
    ms). Self time is the span's own time: what no child covers (overlapping children count
    once, time outside the span does not count)."""
    mine = _of_trace(spans, trace_id)
    ids = {s.context.span_id for s in mine if s.context is not None}
    children: dict[int | None, list[ReadableSpan]] = {}
    for span in mine:
        parent = span.parent.span_id if span.parent is not None else None
        children.setdefault(parent if parent in ids else None, []).append(span)
    rows: list[tuple[int, str, float, float]] = []

    def walk(span: ReadableSpan, depth: int) -> None:
        assert span.context is not None and span.start_time is not None
        assert span.end_time is not None
        start, end = span.start_time, span.end_time
        kids = sorted(children.get(span.context.span_id, []), key=lambda s: s.start_time or 0)
        inside = [(max(start, k.start_time or 0), min(end, k.end_time or 0)) for k in kids]
        covered = _covered([(a, b) for a, b in inside if b > a])
        rows.append((depth, span.name, (end - start) / 1e6, (end - start - covered) / 1e6))
        for kid in kids:
            walk(kid, depth + 1)

    for root in sorted(children.get(None, []), key=lambda s: s.start_time or 0):
        walk(root, 0)
    return rows


def slowest_span(spans: Iterable[ReadableSpan], trace_id: str) -> str | None:
    """The name of the span with the most self time in the trace (None for no spans)."""
    rows = span_tree(spans, trace_id)
    if not rows:
        return None
    return max(rows, key=lambda row: row[3])[1]
