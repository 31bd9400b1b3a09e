"""Finding one request: its log lines from every service, and where its time went."""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan


def _instant(line: dict[str, Any]) -> datetime | None:
    """The line's timestamp as an aware instant (a naive one is taken as UTC)."""
    stamp = line.get("timestamp")
    if not isinstance(stamp, str):
        return None
    try:
        moment = datetime.fromisoformat(stamp)
    except ValueError:
        return None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def _log_lines(logs_dir: Path) -> Iterable[dict[str, Any]]:
    """Every JSON object line of every `*.jsonl` file directly in `logs_dir`, files in name
    order, lines in file order."""
    for path in sorted(logs_dir.glob("*.jsonl"), key=lambda p: p.name):
        if not path.is_file():
            continue
        text = path.read_bytes().decode("utf-8", "replace")
        for raw in text.split("\n"):
            if not raw.strip():
                continue
            try:
                line = json.loads(raw)
            except ValueError:
                continue  # a stack trace, a line cut short
            if isinstance(line, dict):
                yield line


def find_trace(logs_dir: str | Path, trace_id: str) -> list[dict[str, Any]]:
    """Every line of every service's log (`*.jsonl` in `logs_dir`) that carries `trace_id`,
    in time order; ties keep the reading order (file name, then position)."""
    keyed: list[tuple[datetime, int, dict[str, Any]]] = []
    for sequence, line in enumerate(_log_lines(Path(logs_dir))):
        if line.get("trace_id") != trace_id:
            continue
        when = _instant(line)
        if when is not None:
            keyed.append((when, sequence, line))
    keyed.sort(key=lambda item: (item[0], item[1]))  # instants, never text
    return [line for _, _, line in keyed]


def _own_ns(start: int, end: int, kids: list[ReadableSpan]) -> int:
    """Nanoseconds of [start, end) that no kid covers: a sweep over the kids' clipped
    boundaries, counting how many kids are open at each moment."""
    events: list[tuple[int, int]] = []
    for kid in kids:
        a = max(start, kid.start_time or 0)
        b = min(end, kid.end_time or 0)
        if b > a:
            events.append((a, 1))
            events.append((b, -1))
    events.sort()
    covered, open_kids, since = 0, 0, start
    for moment, step in events:
        if open_kids > 0:
            covered += moment - since
        open_kids += step
        since = moment
    return end - start - covered


def span_tree(spans: Iterable[ReadableSpan], trace_id: str
              ) -> list[tuple[int, str, float, float]]:
    """The trace's spans depth first, siblings by start time: (depth, name, duration ms, self
    ms)."""
    wanted = int(trace_id, 16)
    mine = [s for s in spans
            if s.context is not None and s.context.trace_id == wanted
            and s.start_time is not None and s.end_time is not None]
    ids = {s.context.span_id for s in mine if s.context is not None}

    def parent_of(span: ReadableSpan) -> int | None:
        parent = span.parent.span_id if span.parent is not None else None
        return parent if parent in ids else None  # a parent we do not have: a root

    by_start = sorted(mine, key=lambda s: s.start_time or 0)  # stable: ties as given
    kids: dict[int | None, list[ReadableSpan]] = {}
    for span in by_start:
        kids.setdefault(parent_of(span), []).append(span)

    rows: list[tuple[int, str, float, float]] = []
    # An explicit stack, pushed in reverse so that the earliest sibling comes out first.
    stack: list[tuple[ReadableSpan, int]] = [(r, 0) for r in reversed(kids.get(None, []))]
    while stack:
        span, depth = stack.pop()
        assert span.context is not None
        start, end = span.start_time or 0, span.end_time or 0
        children = kids.get(span.context.span_id, [])
        rows.append((depth, span.name, (end - start) / 1e6,
                     _own_ns(start, end, children) / 1e6))
        stack.extend((child, depth + 1) for child in reversed(children))
    return rows


def slowest_span(spans: Iterable[ReadableSpan], trace_id: str) -> str | None:
    """The name of the span with the most self time in the trace (None for no spans); the
    first such span, depth first, on a tie."""
    best: tuple[float, str] | None = None
    for _, name, _, own in span_tree(spans, trace_id):
        if best is None or own > best[0]:
            best = (own, name)
    return best[1] if best is not None else None
