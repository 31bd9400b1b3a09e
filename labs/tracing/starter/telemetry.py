"""Structured logs that carry the trace, and the trace context at the service's edges.

The current span lives in OpenTelemetry's context (contextvars): read it with
`opentelemetry.trace.get_current_span()` whenever you need it, and keep no copy of your own.
"""

from __future__ import annotations

import logging
from typing import TextIO

from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from sqlalchemy import Engine

# The W3C Trace Context propagator: extract(carrier) -> Context, inject(carrier).
PROPAGATOR = TraceContextTextMapPropagator()


def log_handler(service: str, stream: TextIO) -> logging.Handler:
    """A handler that writes every record to `stream` as one JSON line: timestamp (ISO 8601
    with a UTC offset), level, service, trace_id and span_id of the current span ("" outside
    a span), message, the `extra=` fields, and `exception` (the traceback) when there is one.

    Returns:
        The handler (a logging.StreamHandler with your filter and formatter on it).
    """
    raise NotImplementedError(
        "log_handler: a logging.Filter that sets record.trace_id / record.span_id from the "
        "current span, a logging.Formatter that json.dumps the fields, on a StreamHandler "
        "(README, stage 1)")


def trace_sql(engine: Engine) -> None:
    """Make every statement run through `engine` inside a span end with
    /*traceparent='00-<trace id>-<span id>-<flags>'*/; leave statements outside a span as
    they are."""
    raise NotImplementedError(
        "trace_sql: a before_cursor_execute listener on engine, retval=True, that appends the "
        "current traceparent as a sqlcommenter comment (README, stage 6)")
