"""Stage errors: a failure keeps the trace. A failed request answers with its trace id, logs
its exception once (trace id, root cause) and marks its SERVER span as an error; a record that
keeps failing is retried and dead-lettered in its original trace, traceparent included."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pytest
from _support import (
    API_SERVICE,
    CONSUMER_SERVICE,
    INVENTORY_SPAN,
    READ,
    hex_parent,
    hex_trace,
    lines_table,
    order_body,
    parse_traceparent,
    produce_orders,
    span_id_hex,
    spans_table,
    trace_id_hex,
    traceparent,
)
from opentelemetry.trace import SpanKind, StatusCode

from dojo.checks import CheckFailure, short, table
from dojo.checks.faults import fail_sql
from dojo.checks.observers import read_topic, show_bytes

pytestmark = pytest.mark.stage("errors")
SEE = READ["errors"]
REASON = "warehouse 7 is offline"
ROOT = "warehouse database 7 unavailable"
STATE = "shop=dlt7,rojo=00f067aa0ba902b7"
ATTEMPTS = 3
ORIGIN = ("x-order-origin", b"kiosk-17;branch=Izmir")  # a header of the producer's own
# Headers no text round trip keeps: a value that is not UTF-8, a header with no value, a name
# that comes twice (in this order: the last one is not the first).
OTHERS: list[tuple[str, bytes | None]] = [
    ("x-order-signature", b"\x9f\x00\xff\x17\xc3\x28\x01"),
    ("x-order-route", b"hub-ist-3"),
    ("x-order-retry-token", None),
    ("x-order-route", b"hub-fra-1"),
]


class WarehouseDown(Exception):
    """The root cause the check injects under the consumer's INSERT."""


def failed_request(shop: Any) -> tuple[str, Any]:
    """A request whose inventory call fails with 503 (reason REASON)."""
    body = order_body()
    shop.inventory.failures[body["sku"]] = (503, REASON)
    trace = trace_id_hex()
    return trace, shop.server.post(body, {"traceparent": traceparent(trace)})


def test_a_failed_request_answers_with_its_trace_id(shop):
    trace, answer = failed_request(shop)
    if answer.status != 502 or answer.body.get("trace_id") != trace:
        raise CheckFailure(
            "When the inventory service fails, POST /orders answers 502 and puts the trace "
            "id in the body: the caller's support ticket then arrives with the key that finds "
            "every line of the request.",
            expected='502 with "trace_id": the request\'s trace id',
            actual=f"{answer.status} with trace_id {answer.body.get('trace_id')!r}",
            evidence=f"request trace id: {trace}\nbody: {short(str(answer.body), 300)}",
            lesson=SEE)


def test_a_body_that_is_not_an_order_answers_400(shop):
    # the caller's mistake, not a failed step: 400 from both handlers, never the 502 of a
    # step that failed (a parse_order inside the steps' try answers 502)
    good = order_body()
    bodies = {
        "JSON cut short": json.dumps(good).encode()[:-9],
        "a customer_id that is not a UUID": json.dumps({**good, "customer_id": "c-17"}).encode(),
    }
    wrong = []
    for what, body in bodies.items():
        threaded = shop.server.post(body, {"traceparent": traceparent(trace_id_hex())})
        on_loop = shop.post_async(body, {"traceparent": traceparent(trace_id_hex())})
        for handler, answer in (("handle_order", threaded), ("handle_order_async", on_loop)):
            if answer.status != 400:
                wrong.append((what, handler, str(answer.status), short(str(answer.body), 120)))
    if wrong:
        raise CheckFailure(
            "A request body that is not an order is the caller's mistake: POST /orders "
            "answers 400, from either handler. A 502 says a step of yours failed (the "
            "inventory, the database, Kafka), which sends the caller to your on-call instead "
            "of to their own request.",
            expected="400 for every body that is not an order, from both handlers",
            actual=f"{len(wrong)} answer(s) not 400",
            evidence=table(wrong, ("body", "handler", "status", "answer")),
            fix="parse the body (shop.parse_order) before the try that turns a failed step "
                "into 502, and answer shop.BadRequest with 400"
                if any(status == "502" for _, _, status, _ in wrong) else None,
            lesson=SEE)


def exception_lines(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [line for line in lines if line.get("exception")]


def test_a_failed_request_logs_its_exception_once_in_its_trace(shop):
    trace, _ = failed_request(shop)
    lines = shop.logs.lines(API_SERVICE)
    logged = exception_lines(lines)
    evidence = lines_table(lines) + "".join(
        f"\n\nexception field of line {n} (trace_id {line.get('trace_id')!r}):\n"
        + short(str(line["exception"]), 700) for n, line in enumerate(logged[:3], 1))
    if len(logged) != 1:
        raise CheckFailure(
            "A failure must be logged with its traceback once, where it is handled. Logged "
            "at every layer it passes (log and re-raise), one failure reads as several and "
            "buries the one line that matters; not logged at all, nobody sees it.",
            expected="exactly one line with an exception, for one failed request",
            actual=f"{len(logged)} lines with an exception",
            evidence=evidence, lesson=SEE,
            fix="log where you turn the exception into the 502, nowhere else" if logged
            else None)
    line = logged[0]
    problems = []
    if line.get("trace_id") != trace:
        problems.append(f"it carries trace_id {line.get('trace_id')!r}, not the request's: "
                        "logged outside the request's span, it cannot be found by trace id")
    if REASON not in str(line["exception"]):
        problems.append(f"its exception field lacks the root cause ({REASON!r}, the inventory "
                        "service's answer)")
    if line.get("level") != "ERROR":
        problems.append(f"its level is {line.get('level')!r}, not ERROR")
    if problems:
        raise CheckFailure(
            "The one line that logs the failure must be findable by the request's trace id "
            "and must show the root cause.",
            expected="level ERROR, the request's trace id, the root cause in `exception`",
            actual="; ".join(problems), evidence=evidence, lesson=SEE)


def test_a_failed_request_marks_its_server_span_as_an_error(shop):
    trace, _ = failed_request(shop)
    servers = [s for s in shop.spans.of_kind(SpanKind.SERVER, trace) if s.name !=
               INVENTORY_SPAN]
    span = servers[0] if servers else None
    events = [e for e in span.events if e.name == "exception"] if span else []
    if span is None or span.status.status_code != StatusCode.ERROR or not events:
        raise CheckFailure(
            "The tracing backend finds failed requests by their span status, and shows the "
            "exception recorded on the span. An exception you catch (to answer 502) never "
            "reaches the span by itself: record it and set the status.",
            expected="the SERVER span: status ERROR, an 'exception' event",
            actual=("no SERVER span in the trace" if span is None else
                    f"status {span.status.status_code.name}, {len(events)} exception "
                    "event(s)"),
            evidence=spans_table(shop.spans.of_trace(trace)), lesson=SEE)


def dead_letter_one(shop: Any) -> tuple[str, str, str]:
    """A record whose shipment fails every time: (trace id, parent id, order id)."""
    trace, parent = trace_id_hex(), span_id_hex()
    [order_id] = produce_orders(shop, [[("traceparent", traceparent(trace, parent).encode()),
                                        ("tracestate", STATE.encode()), ORIGIN, *OTHERS]],
                                indent=1)
    with fail_sql(shop.deps.engine, r"INSERT\s+INTO\s+shipments", times=100,
                  error=lambda where: WarehouseDown(ROOT)):
        shop.consume(1, max_attempts=ATTEMPTS)
    return trace, parent, order_id


def altered_headers(headers: Sequence[tuple[str, bytes | None]]) -> list[str]:
    """What became of the original OTHERS headers on the dead letter record: each name must
    carry the same values, as bytes (None kept), repeated as often, in the same order."""
    problems = []
    for name in dict.fromkeys(k for k, _ in OTHERS):
        want = [v for k, v in OTHERS if k == name]
        got = [v for k, v in headers if k == name]
        if got == want:
            continue
        if not got:
            problems.append(f"the original header {name} is gone")
        elif len(got) != len(want):
            problems.append(f"header {name} comes {len(got)} time(s), the original "
                            f"{len(want)} times")
        elif sorted(got, key=repr) == sorted(want, key=repr):
            problems.append(f"the values of header {name} are in another order")
        elif None in want:
            problems.append(f"header {name} had no value (null) and now has one")
        else:
            problems.append(f"header {name} has other bytes: a value that is not UTF-8 text "
                            "does not survive being decoded and encoded again")
    return problems


def test_the_dead_letter_record_keeps_the_traceparent(shop, kafka):
    trace, parent, order_id = dead_letter_one(shop)
    records = read_topic(kafka, shop.deps.dlt_topic, 1)
    if len(records) != 1:
        raise CheckFailure(
            f"A record whose shipment fails {ATTEMPTS} times must go to the dead letter "
            "topic (deps.dlt_topic), once.",
            expected="1 record on the dead letter topic", actual=f"{len(records)}",
            lesson=SEE)
    record = records[0]
    [original] = read_topic(kafka, shop.deps.topic, 1)
    parsed = parse_traceparent(record.text("traceparent"))
    problems = []
    if parsed is None or parsed[0] != trace:
        problems.append("no traceparent with the original trace id"
                        if parsed is None else "a traceparent of another trace")
    elif ("traceparent", traceparent(trace, parent).encode()) not in record.headers:
        problems.append(f"traceparent {record.text('traceparent')!r} in place of the "
                        f"original {traceparent(trace, parent)!r}: same trace, but the "
                        "header the producer sent is gone")
    if record.text("tracestate") != STATE:
        problems.append("the original tracestate is gone")
    if ORIGIN not in record.headers:
        problems.append(f"the original header {ORIGIN[0]} is gone")
    problems += altered_headers(record.headers)
    if record.key_text != order_id:
        problems.append("the key is not the original record's")
    if record.value != original.value:
        problems.append("the value is not the original record's, byte for byte (whoever "
                        "replays the dead letter sends exactly what it holds)")
    if problems:
        raise CheckFailure(
            "The dead letter record must keep the original record whole: its key and value "
            "byte for byte, and its trace context (the trace id is the way from a dead letter "
            "alert back to the request that placed the order). Copy every original header, "
            "then add your own.",
            expected="the original traceparent, tracestate and other headers, byte for "
                     "byte (binary and null values, repeated names and their order kept); the "
                     "original key and value",
            actual="; ".join(problems),
            evidence="dead letter record's headers, in order:\n"
            + table([{"header": k, "value": show_bytes(v)} for k, v in record.headers],
                    ("header", "value"), limit=20)
            + f"\noriginal trace id: {trace}\noriginal headers it must carry unchanged: "
            + ", ".join(f"{k}={show_bytes(v)}" for k, v in OTHERS)
            + f"\noriginal value: {show_bytes(original.value, 300)}\ndead letter value: "
            + show_bytes(record.value, 300),
            lesson=SEE)


def test_retries_and_dead_lettering_stay_in_the_records_trace(shop):
    trace, parent, _ = dead_letter_one(shop)
    lines = shop.logs.lines(CONSUMER_SERVICE)
    elsewhere = [line for line in lines if line.get("trace_id") != trace]
    logged = exception_lines(lines)
    evidence = lines_table(lines) + "".join(
        f"\n\nexception field (trace_id {line.get('trace_id')!r}):\n"
        + short(str(line["exception"]), 500) for line in logged[:3])
    if elsewhere or len(logged) != 1 or ROOT not in str(logged[0]["exception"]):
        raise CheckFailure(
            f"Every attempt and the dead-lettering belong to the record's trace: each line "
            f"carries its trace id, and the exception is logged with its traceback once, "
            f"when the record is given up (not at each of the {ATTEMPTS} attempts), with the "
            "root cause in it.",
            expected="all lines in the record's trace; one line with an exception, showing "
                     f"{ROOT!r}",
            actual=f"{len(elsewhere)} line(s) outside the trace, {len(logged)} line(s) with an "
                   "exception" + ("" if not logged or ROOT in str(logged[0]["exception"])
                                  else ", without the root cause"),
            evidence=evidence, lesson=SEE)
    consumers = shop.spans.of_kind(SpanKind.CONSUMER)
    events = sum(1 for s in consumers for e in s.events if e.name == "exception")
    last = max(consumers, key=lambda s: s.end_time or 0) if consumers else None
    wrong_parent = [s for s in consumers if hex_trace(s) != trace or hex_parent(s) != parent]
    strays = [s for s in shop.spans.finished() if hex_trace(s) != trace]
    if strays:
        raise CheckFailure(
            "Every span made while the record is tried and dead-lettered belongs to the "
            "record's trace: a retry is the same work of the same request, not a new trace.",
            expected="every span in the record's trace",
            actual=f"{len(strays)} span(s) in other traces",
            evidence=spans_table(shop.spans.finished()) + f"\nrecord's trace id: {trace}",
            lesson=SEE)
    if (not consumers or wrong_parent or events != ATTEMPTS or last is None
            or last.status.status_code != StatusCode.ERROR):
        raise CheckFailure(
            "The consumer's span(s) for the record must stay children of the producer's span "
            f"through every retry, record each of the {ATTEMPTS} failed attempts as an "
            "exception event, and end with status ERROR when the record is dead-lettered.",
            expected=f"CONSUMER span(s) under the header's span; {ATTEMPTS} exception events; "
                     "the last span ERROR",
            actual=f"{len(consumers)} CONSUMER span(s), {len(wrong_parent)} elsewhere, "
                   f"{events} exception event(s), last status "
                   f"{last.status.status_code.name if last else '-'}",
            evidence=spans_table(consumers), lesson=SEE)
