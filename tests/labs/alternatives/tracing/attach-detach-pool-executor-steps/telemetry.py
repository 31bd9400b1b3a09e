"""Structured logs that carry the trace, and the trace context at the service's edges.

Everything here reads the *current* span from OpenTelemetry's context, which lives in
contextvars: each thread and each asyncio task sees its own, so concurrent requests never see
each other's ids.
"""

from __future__ import annotations

import json
import logging
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


class JsonFormatter(logging.Formatter):
    """One JSON object per line: timestamp, level, service, trace_id, span_id, message, the
    `extra=` fields, and the traceback of an exception (causes included)."""

    def __init__(self, service: str) -> None:
        super().__init__()
        self.service = service

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "timestamp": datetime.fromtimestamp(record.created, UTC)
                                 .isoformat(timespec="milliseconds").replace("+00:00", "Z"),

            "level": record.levelname,
            "service": self.service,
            "trace_id": getattr(record, "trace_id", ""),
            "span_id": getattr(record, "span_id", ""),
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and key not in line:
                line[key] = value
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str, ensure_ascii=False)


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

    from urllib.parse import quote

    def comment(pairs: dict[str, str]) -> str:
        # sqlcommenter: keys sorted, values URL-encoded then quoted, comma separated
        return ",".join(f"{quote(k, safe='')}='{quote(v, safe='')}'"
                        for k, v in sorted(pairs.items()))

    def add_traceparent(conn: Any, cursor: Any, statement: str, parameters: Any,
                        context: Any, executemany: bool) -> tuple[str, Any]:
        sc = trace.get_current_span().get_span_context()
        if not sc.is_valid:
            return statement, parameters
        pairs = {"application": "orders api's shop",
                 "traceparent": f"00-{format_trace_id(sc.trace_id)}-"
                                f"{format_span_id(sc.span_id)}-{int(sc.trace_flags):02x}",
                 "db_driver": "psycopg/3"}
        text_ = comment(pairs)
        if parameters is not None and engine.dialect.paramstyle in ("pyformat", "format"):
            text_ = text_.replace("%", "%%")  # the driver parses % in the statement
        return f"{statement.rstrip()} /*{text_}*/", parameters


    event.listen(engine, "before_cursor_execute", add_traceparent, retval=True)
