"""Structured logs that carry the trace, and the trace context at the service's edges.

Everything here reads the *current* span from OpenTelemetry's context, which lives in
contextvars: each thread and each asyncio task sees its own, so concurrent requests never see
each other's ids.
"""

from __future__ import annotations

import json
import logging
import math
import traceback
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, TextIO

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanKind, Tracer, format_span_id, format_trace_id
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from sqlalchemy import Engine, event

PROPAGATOR = TraceContextTextMapPropagator()

# The attributes every LogRecord has; anything else on a record came from `extra=`.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime",
                                                                       "trace_id", "span_id"}


def current_ids() -> tuple[str, str]:
    """(trace id, span id) of the current span as lower-case hex, ("", "") when there is none."""
    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return "", ""
    return format_trace_id(context.trace_id), format_span_id(context.span_id)


class TraceContextFilter(logging.Filter):
    """Puts the current trace and span ids on every record (empty outside a span)."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.trace_id, record.span_id = current_ids()
        return True


def _json_value(value: Any) -> Any:
    """What JSON holds as it is stays so (numbers, booleans, text, null, lists, objects);
    anything else (UUID, Decimal, datetime, ...) becomes its text."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, (int, float)):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, (list, tuple)):
        return [_json_value(item) for item in value]
    if isinstance(value, dict):
        return {str(key): _json_value(item) for key, item in value.items()}
    return str(value)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: timestamp, level, service, trace_id, span_id, message, the
    `extra=` fields, and the traceback of an exception (causes included)."""

    def __init__(self, service: str) -> None:
        super().__init__()
        self.service = service

    def format(self, record: logging.LogRecord) -> str:
        made = datetime.fromtimestamp(record.created, UTC)
        line: dict[str, Any] = {
            "timestamp": (made.strftime("%Y-%m-%dT%H:%M:%S.")
                          + f"{made.microsecond // 1000:03d}Z"),
            "level": record.levelname,
            "service": self.service,
            "trace_id": getattr(record, "trace_id", ""),
            "span_id": getattr(record, "span_id", ""),
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and key not in line:
                line[key] = _json_value(value)
        exc_info = record.exc_info
        if exc_info and exc_info[1] is not None:
            # the record's own exception (not whatever is being handled now), chain included
            line["exception"] = "".join(
                traceback.format_exception(exc_info[0], exc_info[1], exc_info[2])).rstrip("\n")
        return json.dumps(line, ensure_ascii=False)


def log_handler(service: str, stream: TextIO) -> logging.Handler:
    """A handler writing `service`'s records to `stream` as JSON lines with the trace ids."""
    handler = logging.StreamHandler(stream)
    handler.addFilter(TraceContextFilter())  # on the handler: it sees every record it writes
    handler.setFormatter(JsonFormatter(service))
    return handler


def extract(headers: Mapping[str, str]) -> Context:
    """The caller's trace context from W3C headers, in a fresh Context.

    A missing or malformed traceparent gives an empty context, so the next span starts a new
    trace: the propagator refuses version ff, extra fields on version 00, wrong lengths,
    all-zero ids and upper-case hex.
    """
    carrier = {name.lower(): value for name, value in headers.items()}
    return PROPAGATOR.extract(carrier)


def inject() -> dict[str, str]:
    """traceparent (and tracestate, when there is one) of the current span."""
    carrier: dict[str, str] = {}
    PROPAGATOR.inject(carrier)
    return carrier


@contextmanager
def server_span(tracer: Tracer, name: str, headers: Mapping[str, str]) -> Iterator[Span]:
    """A SERVER span for an incoming request, the current span inside the block: a child of
    the caller's span when a valid traceparent came, the root of a new trace otherwise."""
    with tracer.start_as_current_span(name, context=extract(headers),
                                      kind=SpanKind.SERVER) as span:
        yield span


def trace_sql(engine: Engine) -> None:
    """Append the current span's traceparent to every statement run through `engine`, as a
    sqlcommenter comment: a DBA sees it in pg_stat_activity and in the slow-query log."""

    @event.listens_for(engine, "before_cursor_execute", retval=True)
    def add_traceparent(conn: Any, cursor: Any, statement: str, parameters: Any,
                        context: Any, executemany: bool) -> tuple[str, Any]:
        traceparent = inject().get("traceparent")
        if traceparent:
            statement = f"{statement} /*traceparent='{traceparent}'*/"
        return statement, parameters
