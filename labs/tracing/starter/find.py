"""Finding one request: its log lines from every service, and where its time went."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan


def find_trace(logs_dir: str | Path, trace_id: str) -> list[dict[str, Any]]:
    """Every line of every service's log (`*.jsonl` in `logs_dir`) whose trace_id field is
    `trace_id`, parsed, in time order (timestamps compared as instants; ties by file name,
    then position). Lines that are not JSON objects are skipped."""
    raise NotImplementedError(
        "find_trace: read each *.jsonl, json.loads each line, keep trace_id == trace_id, sort "
        "by datetime.fromisoformat(timestamp) (README, stage 9)")


def span_tree(spans: Iterable[ReadableSpan], trace_id: str
              ) -> list[tuple[int, str, float, float]]:
    """The trace's spans depth first, siblings by start time: (depth, name, duration ms,
    self ms); self time is what no child covers, inside the span."""
    raise NotImplementedError(
        "span_tree: group the trace's spans by parent span id, walk from the roots, and "
        "subtract the union of each span's children's (clipped) intervals (README, stage 9)")


def slowest_span(spans: Iterable[ReadableSpan], trace_id: str) -> str | None:
    """The name of the span with the most self time in the trace (None for no spans)."""
    raise NotImplementedError("slowest_span: the row of span_tree with the most self time "
                              "(README, stage 9)")
