"""Stage structured-logs: `log_handler(service, stream)` writes each record as one JSON line
with timestamp, level, service, trace_id, span_id and message; the ids are the current span's,
empty (and present) outside a span; `extra=` fields and exceptions travel in the line."""

from __future__ import annotations

import re
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from _logcheck import CapturedLog
from _support import READ, Spans, hex_span, hex_trace, traceparent
from opentelemetry.trace import SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from dojo.checks import CheckFailure, short, table

pytestmark = pytest.mark.stage("structured-logs")
SEE = READ["structured-logs"]
FIELDS = ("timestamp", "level", "service", "trace_id", "span_id", "message")


@pytest.fixture
def captured(learner: Any) -> Any:
    log = CapturedLog(learner.module("telemetry"))
    yield log
    log.close()


@pytest.fixture
def tracer_spans() -> Any:
    spans = Spans()
    yield spans
    spans.shutdown()


def _show(captured: CapturedLog) -> str:
    text = "\n".join(short(line, 160) for line in captured.raw_lines()[:10]) or "(nothing)"
    if captured.errors:
        text += "\nerrors inside the handler:\n" + "\n".join(captured.errors[:3])
    return text


def _require_lines(captured: CapturedLog, wanted: int, what: str) -> list[dict[str, Any]]:
    """Exactly `wanted` lines, each a JSON object, or a failure that says which broke."""
    parsed = captured.parsed()
    broken = [i for i, line in enumerate(parsed) if line is None]
    if broken or len(parsed) != wanted:
        lost = wanted - len(parsed)
        raise CheckFailure(
            f"Every log record must become exactly one line holding one JSON object ({what}).",
            expected=f"{wanted} lines, each a JSON object",
            actual=", ".join(part for part in (
                f"{len(parsed)} lines",
                f"{len(broken)} of them not a JSON object" if broken else "",
                f"{lost} record(s) lost: the handler raised while writing them (logging "
                "swallows the error)" if lost > 0 and captured.errors else "") if part),
            evidence=_show(captured), lesson=SEE)
    return [line for line in parsed if line is not None]


def test_every_record_is_one_json_line_with_the_documented_fields(captured, tracer_spans):
    log = captured.log
    before = datetime.now(UTC)
    with tracer_spans.tracer.start_as_current_span("POST /orders"):
        log.info("order %s placed for %d cents", "A-17", 4213)
        log.warning('a "quoted" word,\na second line and ünïcode')
        log.info("with business keys", extra={"order_id": "ord-4711", "customer_id": "c-93",
                                              "items": 3, "express": True})
    log.error("outside any span")
    after = datetime.now(UTC)
    lines = _require_lines(captured, 4, "four records, one with a line break in its message")
    problems = []
    for n, line in enumerate(lines, 1):
        missing = [f for f in FIELDS if f not in line]
        if missing:
            problems.append(f"line {n}: no {', '.join(missing)}")
    if not problems:
        wanted = [("INFO", "order A-17 placed for 4213 cents"),
                  ("WARNING", 'a "quoted" word,\na second line and ünïcode'),
                  ("INFO", "with business keys"), ("ERROR", "outside any span")]
        for n, (line, (level, message)) in enumerate(zip(lines, wanted, strict=True), 1):
            if line["level"] != level:
                problems.append(f"line {n}: level {line['level']!r}, expected {level!r}")
            if line["message"] != message:
                problems.append(f"line {n}: message {line['message']!r}, expected {message!r} "
                                "(the message with its %-arguments filled in)")
            if line["service"] != "orders-api":
                problems.append(f"line {n}: service {line['service']!r}, expected 'orders-api' "
                                "(the name given to log_handler)")
            problems += _timestamp_problems(n, line["timestamp"], before, after)
        # README: milliseconds or finer. (isoformat() leaves out a fraction that is exactly
        # zero, so one line without any is no proof; every line without one, or one cut
        # shorter than milliseconds, is.)
        fractions = [re.search(r"[T ]\d\d:\d\d:\d\d(?:[.,](\d+))?", str(line["timestamp"]))
                     for line in lines]
        digits = [len(f.group(1) or "") if f else 0 for f in fractions]
        if all(d == 0 for d in digits) or any(0 < d < 3 for d in digits):
            problems.append(f"timestamps {', '.join(repr(line['timestamp']) for line in lines)}"
                            " are not to the millisecond: lines of one second cannot be put in "
                            "order across services (isoformat(timespec='milliseconds'))")
        if lines[2].get("order_id") != "ord-4711" or lines[2].get("customer_id") != "c-93":
            problems.append("line 3: the fields given with extra= (order_id, customer_id) are "
                            "not in the line; support searches by them")
        items, express = lines[2].get("items"), lines[2].get("express")
        if type(items) is not int or items != 3 or express is not True:
            problems.append(f"line 3: extra= items={items!r}, express={express!r}, expected 3 "
                            "and true: a number or a boolean JSON can hold stays one (a query "
                            "for items > 2 finds no text); only values JSON cannot hold (UUID, "
                            "Decimal, datetime) become text")
        with_exception = [n for n, line in enumerate(lines, 1) if "exception" in line]
        if with_exception:
            problems.append(f"line(s) {', '.join(map(str, with_exception))}: an exception "
                            "field on a record that has no exception (even null): the field "
                            "is there only when the record has one, and whoever counts the "
                            "lines with an exception counts these too")
    if problems:
        raise CheckFailure(
            "A log store indexes the fields of each JSON line; the checks (and your "
            "colleagues' queries) rely on the names and values the README fixes.",
            expected="timestamp (ISO 8601 with an offset), level, service, trace_id, span_id, "
                     "message, and the extra= fields",
            actual=f"{len(problems)} problem(s)",
            evidence="\n".join(problems[:10]) + "\n\n" + _show(captured), lesson=SEE)


def _timestamp_problems(n: int, value: Any, before: datetime, after: datetime) -> list[str]:
    try:
        moment = datetime.fromisoformat(str(value))
    except ValueError:
        return [f"line {n}: timestamp {value!r} is not ISO 8601"]
    if moment.tzinfo is None:
        return [f"line {n}: timestamp {value!r} has no UTC offset: which zone is it?"]
    slack = timedelta(seconds=1)
    if not before - slack <= moment <= after + slack:
        return [f"line {n}: timestamp {value!r} is not the time of the call "
                f"({before.isoformat()} … {after.isoformat()})"]
    return []


def test_trace_and_span_ids_are_those_of_the_current_span(captured, tracer_spans):
    log, tracer = captured.log, tracer_spans.tracer
    caller = traceparent()
    remote = TraceContextTextMapPropagator().extract({"traceparent": caller})
    current: list[Any] = []
    with tracer.start_as_current_span("POST /orders", context=remote,
                                      kind=SpanKind.SERVER) as server:
        current.append(server)
        log.info("in the server span")
        with tracer.start_as_current_span("reserve stock", kind=SpanKind.CLIENT) as client:
            current.append(client)
            log.info("in the client span")
            with tracer.start_as_current_span("encode") as inner:
                current.append(inner)
                log.info("in a grandchild span")
        current.append(server)
        log.info("back in the server span")
    with tracer.start_as_current_span("another request") as other:
        current.append(other)
        log.info("in another trace")
    lines = _require_lines(captured, 5, "five records in nested spans")
    rows, wrong = [], 0
    for line, span in zip(lines, current, strict=True):
        want = (hex_trace(span), hex_span(span))
        got = (line.get("trace_id"), line.get("span_id"))
        ok = got == want
        wrong += not ok
        rows.append({"message": line.get("message"), "current span": span.name,
                     "expected trace_id/span_id": f"{want[0]} / {want[1]}",
                     "logged": f"{got[0]} / {got[1]}", "ok": "yes" if ok else "NO"})
    if wrong:
        unpadded = any(
            isinstance(got, str) and got != want and got == want.lstrip("0")
            for line, span in zip(lines, current, strict=True)
            for got, want in ((line.get("trace_id"), hex_trace(span)),
                              (line.get("span_id"), hex_span(span))))
        raise CheckFailure(
            "Each line must carry the trace id and the span id of the span that is current "
            "when it is logged: lower-case hex, 32 and 16 digits. The span id says which step "
            "wrote the line (the caller's span in a traceparent is the parent, not ours).",
            expected="trace_id and span_id of the current span on every line",
            actual=f"{wrong} of 5 lines with other ids",
            evidence=table(rows, ("message", "current span", "expected trace_id/span_id",
                                  "logged", "ok"), width=52)
            + (f"\n(caller's traceparent: {caller})"),
            lesson=SEE,
            fix=("format the ids with all their digits: format_trace_id / format_span_id, or "
                 "f'{span_id:016x}' (an id that starts with 0 lost its leading zeros)") if unpadded
            else None)


def test_outside_a_span_the_ids_are_empty_and_nothing_breaks(captured, tracer_spans):
    log = captured.log
    order_id = uuid.uuid4()
    log.info("no span at all")
    seen: list[Any] = []
    with tracer_spans.tracer.start_as_current_span("request"):
        # A new thread starts with an empty context, whatever the thread that started it had.
        thread = threading.Thread(target=lambda: log.info("from a thread of its own"))
        thread.start()
        thread.join(5)
    log.info("values JSON has no type for",
             extra={"order_id": order_id, "amount": Decimal("42.13"),
                    "at": datetime(2025, 3, 14, 14, 3, 7, tzinfo=UTC)})
    time.sleep(0)  # the thread's line is written by now (join)
    seen = _require_lines(captured, 3, "three records outside any span, one with a UUID, a "
                                       "Decimal and a datetime in extra=")
    problems = []
    for n, line in enumerate(seen, 1):
        for key in ("trace_id", "span_id"):
            if key not in line:
                problems.append(f"line {n}: no {key} field (it must be there, empty)")
            elif line[key] != "":
                problems.append(f"line {n}: {key} = {line[key]!r} outside any span")
    if seen and str(seen[-1].get("order_id")) != str(order_id):
        problems.append(f"line 3: order_id = {seen[-1].get('order_id')!r}, expected the UUID "
                        "as text")
    if problems:
        raise CheckFailure(
            "Outside a span (a start-up line, a thread of its own) the line still has "
            "trace_id and span_id, empty, so queries and parsers never meet a missing field; "
            "an id that is not there must not be invented or borrowed from another thread.",
            expected='trace_id "" and span_id "" on each of the 3 lines',
            actual=f"{len(problems)} problem(s)",
            evidence="\n".join(problems) + "\n\n" + _show(captured), lesson=SEE)
    amount, at = seen[-1].get("amount"), seen[-1].get("at")
    if amount != "42.13" or not isinstance(at, str):
        raise CheckFailure(
            "A value JSON has no type for goes into the line as text (README): a Decimal as "
            "its exact digits, not a float, which is not the amount (a binary fraction: sums "
            "of them drift by fractions of a cent); a datetime as its text.",
            expected='amount "42.13" (a string), at a string',
            actual=f"amount {amount!r}, at {at!r}",
            evidence=_show(captured),
            fix="json.dumps(..., default=str) (or your own default that returns str(value))"
                if isinstance(amount, float) else None,
            lesson=SEE)


class _WarehouseDown(Exception):
    pass


class _ShipmentFailed(RuntimeError):
    pass


def test_an_exception_is_one_line_with_its_causes(captured, tracer_spans):
    log = captured.log
    with tracer_spans.tracer.start_as_current_span("process order") as span:
        try:
            try:
                raise _WarehouseDown("warehouse 7 is offline since 14:03")
            except _WarehouseDown as exc:
                raise _ShipmentFailed("could not ship order ord-4711") from exc
        except _ShipmentFailed:
            log.exception("shipping failed")
    lines = _require_lines(captured, 1, "one log.exception() call, two chained exceptions")
    line = lines[0]
    text = str(line.get("exception", ""))
    problems = []
    if line.get("level") != "ERROR":
        problems.append(f"level {line.get('level')!r}, expected 'ERROR'")
    if line.get("message") != "shipping failed":
        problems.append(f"message {line.get('message')!r}, expected 'shipping failed'")
    for needle, why in (("_ShipmentFailed", "the exception"),
                        ("could not ship order ord-4711", "its message"),
                        ("_WarehouseDown", "its root cause"),
                        ("warehouse 7 is offline since 14:03", "the root cause's message")):
        if needle not in text:
            problems.append(f"the exception field lacks {why}: {needle!r}")
    if line.get("trace_id") != hex_trace(span):
        problems.append(f"trace_id {line.get('trace_id')!r}, expected the current span's")
    if problems:
        raise CheckFailure(
            "log.exception() must write one line whose `exception` field holds the traceback "
            "with every cause: the root cause is what you look for first.",
            expected="one ERROR line; exception = the traceback, causes included; the trace id",
            actual=f"{len(problems)} problem(s)",
            evidence="\n".join(problems) + "\n\n" + _show(captured), lesson=SEE)


class _ReservationLost(Exception):
    pass


def test_exc_info_logs_that_exception_wherever_the_call_is(captured, tracer_spans):
    # A retry loop keeps the last error and logs it once it gives up, after its `except` has
    # ended; a callback logs an error it was handed while handling another one. The line must
    # hold the traceback of the exception given (record.exc_info), not of the one being
    # handled on this thread at that moment (traceback.format_exc, sys.exc_info).
    log = captured.log
    saved: BaseException | None = None
    with tracer_spans.tracer.start_as_current_span("process order"):
        try:
            try:
                raise _WarehouseDown("warehouse 3 stopped answering at 09:41")
            except _WarehouseDown as exc:
                raise _ShipmentFailed("gave up on order ord-5823") from exc
        except _ShipmentFailed as exc:
            saved = exc
        log.error("giving up after 3 attempts", exc_info=saved)
        try:
            raise _ReservationLost("reservation r-91 expired")
        except _ReservationLost:
            log.warning("earlier failure, reported late", exc_info=saved)
    lines = _require_lines(captured, 2, "two records given exc_info=<a saved exception>")
    problems = []
    for n, line in enumerate(lines, 1):
        text = str(line.get("exception", ""))
        for needle, why in (("gave up on order ord-5823", "the exception's message"),
                            ("warehouse 3 stopped answering at 09:41", "its cause's message")):
            if needle not in text:
                problems.append(f"line {n}: the exception field lacks {why}: {needle!r}")
        if "reservation r-91 expired" in text:
            problems.append(f"line {n}: the exception field shows the exception being "
                            "handled when the line was written, not the one given")
    if problems:
        where = ("line 1 was logged after its `except` block ended, line 2 inside the "
                 "`except` of another exception")
        raise CheckFailure(
            "`exc_info=` names the exception to log: the `exception` field must hold the "
            "traceback of that exception (record.exc_info, e.g. formatException), with its "
            "causes, wherever the call is made; not whatever this thread handles right then.",
            expected="both lines: the given exception and its cause; nothing of another one",
            actual=f"{len(problems)} problem(s); {where}",
            evidence="\n".join(problems) + "\n\n" + _show(captured), lesson=SEE,
            fix="format record.exc_info (self.formatException(record.exc_info)), not "
                "traceback.format_exc()"
            if any("being handled" in p for p in problems)
            or "NoneType: None" in str(lines[0].get("exception", "")) else None)
