"""What only the tracing checks need: the lesson sections, W3C ids the checks make up, the
spans the learner's code exports (collected in memory), the log lines it writes (through the
learner's own handler), the order API served on 127.0.0.1, and the inventory service it calls.

Nothing here reads the learner's internals: only the functions, loggers, span names and kinds,
headers and tables the lab README fixes.
"""

from __future__ import annotations

import io
import json
import logging
import random
import re
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from socketserver import ThreadingMixIn
from typing import Any, TextIO
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.trace import SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from dojo.checks import CheckFailure, call, short, table
from dojo.checks.learner import not_written

LESSON = "distributed-logging"

# The lesson section each stage's failures send the learner to (lab.yaml says the same).
READ = {
    "structured-logs": f"{LESSON}#structured-json-logging",
    "incoming-context": f"{LESSON}#trace-span-and-the-traceparent-header",
    "context-per-request": f"{LESSON}#the-mdc-how-the-id-reaches-every-log-line",
    "async-boundaries": f"{LESSON}#async-boundaries-where-the-context-gets-lost",
    "kafka-headers": f"{LESSON}#across-kafka-traceparent-in-the-record-headers",
    "sql-comments": f"{LESSON}#the-whole-path-hop-by-hop",
    "errors": f"{LESSON}#investigating-with-a-trace-id",
    "outgoing-http": f"{LESSON}#what-micrometer-tracing-does-in-spring-boot-3",
    "find-the-trace": f"{LESSON}#investigating-with-a-trace-id",
}
MISTAKES = f"{LESSON}#common-mistakes"

API_LOGGER, CONSUMER_LOGGER = "orders.api", "orders.consumer"
API_SERVICE, CONSUMER_SERVICE = "orders-api", "shipping"
TRACEPARENT_FORMAT = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")
CHECK_PROPAGATOR = TraceContextTextMapPropagator()


# -- ids ----------------------------------------------------------------------------------------

def trace_id_hex() -> str:
    """A random trace id with a leading zero digit: formatting that drops leading zeros shows."""
    return f"{random.getrandbits(124) | 1:032x}"


def span_id_hex() -> str:
    return f"{random.getrandbits(60) | 1:016x}"


def traceparent(trace_id: str | None = None, parent_id: str | None = None,
                flags: str = "01") -> str:
    return f"00-{trace_id or trace_id_hex()}-{parent_id or span_id_hex()}-{flags}"


def parse_traceparent(value: str | None) -> tuple[str, str, str] | None:
    """(trace id, parent id, flags) of a well-formed version-00 traceparent, else None."""
    match = TRACEPARENT_FORMAT.match((value or "").strip())
    return (match.group(1), match.group(2), match.group(3)) if match else None


class LeadingZeroIds(IdGenerator):
    """Random ids whose first hex digits are zeros every other time: an id printed without
    its leading zeros (`f"{span_id:x}"`) is then one digit short, as it is in production one
    time in sixteen."""

    def __init__(self) -> None:
        self._rng = random.Random()
        self._lock = threading.Lock()
        self._n = 0

    def _bits(self, full: int) -> int:
        with self._lock:
            self._n += 1
            short_id = self._n % 2 == 0
            value = self._rng.getrandbits(full - 8 if short_id else full)
        return value | 1

    def generate_span_id(self) -> int:
        return self._bits(64)

    def generate_trace_id(self) -> int:
        return self._bits(128)


# -- spans --------------------------------------------------------------------------------------

def hex_trace(span: ReadableSpan) -> str:
    assert span.context is not None
    return f"{span.context.trace_id:032x}"


def hex_span(span: ReadableSpan) -> str:
    assert span.context is not None
    return f"{span.context.span_id:016x}"


def hex_parent(span: ReadableSpan) -> str | None:
    return None if span.parent is None else f"{span.parent.span_id:016x}"


KIND_NAMES = {SpanKind.SERVER: "SERVER", SpanKind.CLIENT: "CLIENT",
              SpanKind.PRODUCER: "PRODUCER", SpanKind.CONSUMER: "CONSUMER",
              SpanKind.INTERNAL: "INTERNAL"}
SPAN_COLUMNS = ("name", "kind", "trace_id", "span_id", "parent_id", "status")


class Spans:
    """A tracer whose spans the check collects in memory (the learner's code gets `.tracer`)."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider(id_generator=LeadingZeroIds(), shutdown_on_exit=False)
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.tracer = self.provider.get_tracer("dojo.tracing.checks")

    def finished(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())

    def of_trace(self, trace_id: str) -> list[ReadableSpan]:
        return [s for s in self.finished() if hex_trace(s) == trace_id]

    def named(self, name: str, kind: SpanKind | None = None) -> list[ReadableSpan]:
        return [s for s in self.finished()
                if s.name == name and (kind is None or s.kind == kind)]

    def of_kind(self, kind: SpanKind, trace_id: str | None = None) -> list[ReadableSpan]:
        return [s for s in self.finished() if s.kind == kind
                and (trace_id is None or hex_trace(s) == trace_id)]

    def by_id(self) -> dict[str, ReadableSpan]:
        return {hex_span(s): s for s in self.finished()}

    def shutdown(self) -> None:
        self.provider.shutdown()


def span_rows(spans: Iterable[ReadableSpan]) -> list[dict[str, Any]]:
    return [{"name": s.name, "kind": KIND_NAMES.get(s.kind, str(s.kind)),
             "trace_id": hex_trace(s), "span_id": hex_span(s),
             "parent_id": hex_parent(s) or "-",
             "status": s.status.status_code.name} for s in spans]


def spans_table(spans: Iterable[ReadableSpan], limit: int = 12) -> str:
    return table(span_rows(spans), SPAN_COLUMNS, limit=limit, empty="(no spans exported)")


# -- log lines ----------------------------------------------------------------------------------

LINE_COLUMNS = ("service", "level", "trace_id", "span_id", "message")


def lines_table(lines: Sequence[Mapping[str, Any]], limit: int = 12) -> str:
    rows = [{k: line.get(k, "<missing>") for k in LINE_COLUMNS} for line in lines]
    return table(rows, LINE_COLUMNS, limit=limit, width=48, empty="(no log lines)")


class Logs:
    """The learner's `telemetry.log_handler` on the service loggers the README names, writing
    to memory or to one file per service; the lines read back as dicts."""

    def __init__(self, learner: Any, directory: Path | None = None) -> None:
        self.telemetry = learner.module("telemetry")
        self.directory = directory
        self._streams: dict[str, TextIO] = {}
        self._handlers: list[tuple[logging.Logger, logging.Handler, int, bool]] = []

    def install(self) -> Logs:
        for logger_name, service in ((API_LOGGER, API_SERVICE),
                                     (CONSUMER_LOGGER, CONSUMER_SERVICE)):
            if self.directory is not None:
                stream: TextIO = open(self.directory / f"{service}.jsonl", "a",  # noqa: SIM115
                                      encoding="utf-8")
            else:
                stream = io.StringIO()
            self._streams[service] = stream
            handler = call(self.telemetry.log_handler, service, stream)
            logger = logging.getLogger(logger_name)
            self._handlers.append((logger, handler, logger.level, logger.propagate))
            logger.addHandler(handler)
            logger.setLevel(logging.INFO)
            logger.propagate = False
        return self

    def uninstall(self) -> None:
        for logger, handler, level, propagate in self._handlers:
            logger.removeHandler(handler)
            logger.setLevel(level)
            logger.propagate = propagate
            handler.flush()
        self._handlers.clear()
        for stream in self._streams.values():
            if not isinstance(stream, io.StringIO):
                stream.close()

    def text(self, service: str) -> str:
        stream = self._streams[service]
        if isinstance(stream, io.StringIO):
            return stream.getvalue()
        stream.flush()
        assert self.directory is not None
        return (self.directory / f"{service}.jsonl").read_text(encoding="utf-8")

    def lines(self, service: str | None = None) -> list[dict[str, Any]]:
        """Every line written so far (of one service, or of both), parsed; a line that is not
        a JSON object fails the check, pointing at stage 1."""
        out: list[dict[str, Any]] = []
        for name in ([service] if service else list(self._streams)):
            for raw in self.text(name).splitlines():
                if not raw.strip():
                    continue
                try:
                    line = json.loads(raw)
                except ValueError:
                    line = None
                if not isinstance(line, dict):
                    raise CheckFailure(
                        "Your log handler wrote a line that is not a JSON object, so a log "
                        "store could not index it (stage 1 fixes the format).",
                        expected="one JSON object per line", actual="a line that is not",
                        evidence=short(raw, 300), lesson=READ["structured-logs"])
                out.append(line)
        return out

    def of_trace(self, trace_id: str, service: str | None = None) -> list[dict[str, Any]]:
        return [line for line in self.lines(service) if line.get("trace_id") == trace_id]


async def awaited(coroutine: Any) -> Any:
    """Await learner code; a stub's NotImplementedError becomes NotWritten."""
    try:
        return await coroutine
    except NotImplementedError as exc:
        raise not_written(exc) from exc


# -- the order API on 127.0.0.1 -------------------------------------------------------------------

class _ThreadingWSGIServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True
    request_queue_size = 128  # 50 clients connect at once; the default backlog is 5


class _InventoryServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128


class _QuietWSGIHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass


@dataclass
class Answer:
    status: int
    body: dict[str, Any]


class AppServer:
    """The learner's WSGI app (`api.create_app(deps)`) served on 127.0.0.1, a thread per
    request."""

    def __init__(self, app: Any) -> None:
        self.httpd = make_server("127.0.0.1", 0, app, server_class=_ThreadingWSGIServer,
                                 handler_class=_QuietWSGIHandler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,),
                                       name="order-api-server", daemon=True)
        self.thread.start()

    def post(self, body: Mapping[str, Any] | bytes, headers: Mapping[str, str] | None = None,
             path: str = "/orders", timeout: float = 30.0) -> Answer:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, method="POST",
                                         headers={"Content-Type": "application/json",
                                                  **(headers or {})})
        try:
            with urllib.request.urlopen(request, timeout=timeout) as answer:
                status, raw = answer.status, answer.read()
        except urllib.error.HTTPError as exc:
            status, raw = exc.code, exc.read()
        try:
            parsed = json.loads(raw or b"{}")
        except ValueError:
            parsed = {"<not json>": raw.decode("utf-8", "replace")[:200]}
        return Answer(status, parsed if isinstance(parsed, dict) else {"<json>": parsed})

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def order_body(sku: str | None = None, quantity: int | None = None) -> dict[str, Any]:
    """An order with amounts that are not round numbers."""
    return {"customer_id": str(uuid.uuid4()), "sku": sku or f"SKU-{random.randint(1000, 9999)}",
            "quantity": quantity or random.randint(2, 9),
            "total_cents": random.randint(1001, 99999)}


class RecordingExecutor(ThreadPoolExecutor):
    """The thread pool handed to the learner's code, counting what was submitted to it."""

    def __init__(self, workers: int = 2) -> None:
        super().__init__(workers, thread_name_prefix="shop-pool")
        self.submitted = 0
        # Start the threads now: work submitted later never runs on a thread created for it.
        for _ in range(workers):
            super().submit(time.sleep, 0.01)

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        self.submitted += 1
        return super().submit(fn, *args, **kwargs)


def produce_orders(shop: Any, heads: Sequence[Sequence[tuple[str, bytes | None]] | None],
                   indent: int | None = None) -> list[str]:
    """One order record per entry of `heads` (its headers), values as the API writes them
    (with `indent`, spread over lines: valid JSON whose bytes a parse and dump would change)."""
    producer = shop.kafka.producer()
    ids = []
    for headers in heads:
        order_id = str(uuid.uuid4())
        value = {"order_id": order_id, "customer_id": str(uuid.uuid4()),
                 "sku": f"SKU-{random.randint(1000, 9999)}", "quantity": random.randint(2, 9),
                 "total_cents": random.randint(1001, 99999)}
        producer.produce(shop.deps.topic, key=order_id.encode(),
                         value=json.dumps(value, indent=indent).encode(),
                         headers=list(headers) if headers else None)
        ids.append(order_id)
    producer.flush(10)
    return ids


# -- the inventory service (the check's own, on 127.0.0.1) ---------------------------------------

INVENTORY_SPAN = "inventory: POST /reservations"


@dataclass
class InventoryCall:
    headers: dict[str, str]
    body: dict[str, Any]
    span_id: str = ""
    trace_id: str = ""
    # The span the call's traceparent names had already ended (was exported) when the call
    # arrived: the caller made the call after its span, not inside it.
    parent_ended_before: bool = False


@dataclass
class Inventory:
    """The downstream service: records each call's headers, answers as its own traced service
    (a SERVER span from the check's tracer, continuing whatever traceparent came), can hold
    calls until N are in flight, and can fail a SKU with a status and reason."""

    spans: Spans
    calls: list[InventoryCall] = field(default_factory=list)
    failures: dict[str, tuple[int, str]] = field(default_factory=dict)
    _hold: int = 0
    _hold_timeout: float = 10.0
    _arrived: int = 0
    held_together: int = 0
    _last: str | None = None
    _release_last: Callable[[], bool] = field(default=lambda: True)
    _cond: threading.Condition = field(default_factory=threading.Condition)

    def start(self) -> Inventory:
        inventory = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass

            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("Content-Length") or 0)
                try:
                    body = json.loads(self.rfile.read(length) or b"{}")
                except ValueError:
                    body = {}
                status, reason = inventory.serve(
                    {k.lower(): v for k, v in self.headers.items()}, body)
                payload = json.dumps({"reserved": status == 200}).encode()
                self.send_response(status, reason)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self.httpd = _InventoryServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, args=(0.05,), name="inventory",
                         daemon=True).start()
        return self

    def serve(self, headers: dict[str, str], body: dict[str, Any]) -> tuple[int, str]:
        context = CHECK_PROPAGATOR.extract(headers)
        # The exporter holds a span from the moment it ends (SimpleSpanProcessor exports in
        # end()): a parent already there ended before this call was even received.
        parsed = parse_traceparent(headers.get("traceparent"))
        ended = parsed is not None and any(
            hex_span(s) == parsed[1] and hex_trace(s) == parsed[0]
            for s in self.spans.finished())
        with self.spans.tracer.start_as_current_span(INVENTORY_SPAN, context=context,
                                                     kind=SpanKind.SERVER) as span:
            record = InventoryCall(headers, body, f"{span.get_span_context().span_id:016x}",
                                   f"{span.get_span_context().trace_id:032x}", ended)
            with self._cond:
                self.calls.append(record)
                self._arrived += 1
                self._cond.notify_all()
                if self._hold:
                    deadline = time.monotonic() + self._hold_timeout
                    while self._arrived < self._hold and time.monotonic() < deadline:
                        self._cond.wait(deadline - time.monotonic())
                    self.held_together = max(self.held_together, self._arrived)
            if self._last is not None and body.get("sku") == self._last:
                # the last request in: answered only once another request has moved on
                deadline = time.monotonic() + 5.0
                while not self._release_last() and time.monotonic() < deadline:
                    time.sleep(0.005)
            failure = self.failures.get(str(body.get("sku")))
        return failure if failure else (200, "OK")

    def hold(self, count: int, *, last: str | None = None,
             release_last: Callable[[], bool] | None = None, timeout: float = 10.0) -> None:
        """Keep every call waiting until `count` calls have arrived (or `timeout` passed); the
        call for SKU `last` waits on until `release_last()` is true (5 s at most)."""
        with self._cond:
            self._hold, self._hold_timeout, self._arrived = count, timeout, 0
            self.held_together = 0
            self._last, self._release_last = last, release_last or (lambda: True)

    def arrived(self) -> int:
        with self._cond:
            return self._arrived

    def wait_arrived(self, count: int, deadline: float) -> bool:
        """Wait until `count` calls have arrived since `hold`, or the monotonic `deadline`."""
        with self._cond:
            while self._arrived < count and time.monotonic() < deadline:
                self._cond.wait(max(0.0, deadline - time.monotonic()))
            return self._arrived >= count

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
