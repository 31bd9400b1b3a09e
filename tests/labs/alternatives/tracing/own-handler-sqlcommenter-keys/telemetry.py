"""Structured logs carrying the trace, and sqlcommenter comments on every statement.

Design: one Handler subclass of our own that reads the current span when it formats the
record (the same thread, the same contextvars, at the moment the line is written), and a
sqlcommenter comment with several keys, values URL-encoded as the sqlcommenter spec says.
"""

from __future__ import annotations

import json
import logging
import threading
import traceback
import urllib.parse
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime
from typing import Any, TextIO

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanKind, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from sqlalchemy import Engine, event

PROPAGATOR = TraceContextTextMapPropagator()

_RESERVED = frozenset(logging.LogRecord("x", logging.INFO, "x", 1, "x", None, None).__dict__) \
    | {"message", "asctime", "taskName"}


def current_ids() -> tuple[str, str]:
    ctx = trace.get_current_span().get_span_context()
    if not ctx.is_valid:
        return "", ""
    return f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}"


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, datetime):
        return value.isoformat()
    return str(value)


class JsonLinesHandler(logging.Handler):
    """Writes one JSON object per line to a text stream."""

    def __init__(self, service: str, stream: TextIO) -> None:
        super().__init__()
        self.service = service
        self.stream = stream
        self._write_lock = threading.Lock()

    def render(self, record: logging.LogRecord) -> str:
        trace_id, span_id = current_ids()
        # local time with its offset: an instant all the same
        stamp = datetime.fromtimestamp(record.created).astimezone()
        out: dict[str, Any] = {
            "timestamp": stamp.isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "service": self.service,
            "trace_id": trace_id,
            "span_id": span_id,
            "message": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _RESERVED and key not in out:
                out[key] = _jsonable(value)
        if record.exc_info and record.exc_info[1] is not None:
            out["exception"] = "".join(traceback.format_exception(record.exc_info[1]))
        return json.dumps(out, ensure_ascii=False)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.render(record)
            with self._write_lock:
                self.stream.write(line + "\n")
                self.stream.flush()
        except Exception:
            self.handleError(record)


def log_handler(service: str, stream: TextIO) -> logging.Handler:
    return JsonLinesHandler(service, stream)


def extract(headers: Mapping[str, str]) -> Context:
    return PROPAGATOR.extract({k.lower(): v for k, v in headers.items()}, context=Context())


def inject() -> dict[str, str]:
    carrier: dict[str, str] = {}
    PROPAGATOR.inject(carrier)
    return carrier


def _sqlcomment(fields: Mapping[str, str]) -> str:
    """sqlcommenter: keys sorted, values URL-encoded then quoted."""
    pairs = [f"{urllib.parse.quote(k, safe='')}='{urllib.parse.quote(v, safe='')}'"
             for k, v in sorted(fields.items())]
    return "/*" + ",".join(pairs) + "*/"


def trace_sql(engine: Engine) -> None:
    @event.listens_for(engine, "before_cursor_execute", retval=True)
    def _comment(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any,
                 executemany: bool) -> tuple[str, Any]:
        fields = inject()
        if "traceparent" not in fields:
            return statement, parameters
        fields["application"] = "orders"
        fields["db_driver"] = "psycopg"
        return f"{statement.rstrip()} {_sqlcomment(fields)}", parameters


@contextmanager
def server_span(tracer: Tracer, name: str, headers: Mapping[str, str]) -> Iterator[Span]:
    """The SERVER span of an incoming request, current inside the block."""
    with tracer.start_as_current_span(name, context=extract(headers),
                                      kind=SpanKind.SERVER) as span:
        yield span
