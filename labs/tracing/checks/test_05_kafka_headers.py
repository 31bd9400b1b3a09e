"""Stage kafka-headers: the order record carries traceparent (and tracestate) in its headers,
injected from a PRODUCER span; the consumer continues it in a CONSUMER span, a child of that
producer span; a record without (valid) trace context starts a new trace and says so."""

from __future__ import annotations

from typing import Any

import pytest
from _support import (
    API_SERVICE,
    CONSUMER_SERVICE,
    INVENTORY_SPAN,
    READ,
    hex_parent,
    hex_span,
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
from opentelemetry.trace import SpanKind
from sqlalchemy import text

from dojo.checks import CheckFailure, table
from dojo.checks.observers import headers_table, read_topic

pytestmark = pytest.mark.stage("kafka-headers")
SEE = READ["kafka-headers"]
STATE = "shop=5ZJ1ql8,rojo=00f067aa0ba902b7"
ON_ASYNCIO = (" handle_order_async runs this step on a thread of the loop's executor: "
              "asyncio.to_thread copies the request's context there, loop.run_in_executor "
              "does not.")


def place(shop: Any, trace: str, parent: str, state: str | None = STATE,
          on_asyncio: bool = False) -> str:
    headers = {"traceparent": traceparent(trace, parent)}
    if state:
        headers["tracestate"] = state
    answer = (shop.post_async(order_body(), headers) if on_asyncio
              else shop.server.post(order_body(), headers))
    if answer.status != 201:
        raise CheckFailure("POST /orders must place the order.", expected="201",
                           actual=str(answer.status), evidence=str(answer.body)[:400],
                           lesson=SEE)
    return str(answer.body.get("order_id"))


def test_the_record_carries_traceparent_from_a_producer_span(shop, kafka):
    verify_record(shop, kafka, on_asyncio=False)


def test_on_asyncio_the_record_carries_traceparent_from_a_producer_span(shop, kafka):
    # handle_order_async sends on a thread of the loop's executor: the request's context
    # must go with it (asyncio.to_thread copies it; loop.run_in_executor does not).
    verify_record(shop, kafka, on_asyncio=True)


def verify_record(shop: Any, kafka: Any, on_asyncio: bool) -> None:
    trace, caller = trace_id_hex(), span_id_hex()
    place(shop, trace, caller, on_asyncio=on_asyncio)
    records = read_topic(kafka, shop.deps.topic, 1)
    if len(records) != 1:
        raise CheckFailure("One order, one record on the topic.", expected="1 record",
                           actual=f"{len(records)} records", lesson=SEE)
    record = records[0]
    header = record.text("traceparent")
    parsed = parse_traceparent(header)
    evidence = headers_table(record.headers) + "\nvalue: " + (record.value or b"").decode(
        "utf-8", "replace")[:300]
    if parsed is None:
        in_value = trace in (record.value or b"").decode("utf-8", "replace")
        raise CheckFailure(
            "The order record must carry the trace context in its headers (traceparent, "
            "W3C format), where the consumer, a dead letter tool or a proxy can read it "
            "without knowing your payload."
            + (" The trace id is in the record's value instead: headers are the carrier, "
               "the value is the business event." if in_value else ""),
            expected="header traceparent = 00-<trace id>-<producer span id>-<flags>",
            actual=("no traceparent header; the trace id sits in the value" if in_value
                    else f"traceparent = {header!r}"),
            evidence=evidence, lesson=SEE)
    got_trace, parent, flags = parsed
    producers = {hex_span(s): s for s in shop.spans.of_kind(SpanKind.PRODUCER, trace)}
    servers = {hex_span(s) for s in shop.spans.of_kind(SpanKind.SERVER, trace)
               if s.name != INVENTORY_SPAN}
    problems = []
    if got_trace != trace:
        problems.append(f"its trace id {got_trace} is not the request's {trace}")
    elif parent == caller:
        problems.append("its parent-id is the caller's span: the incoming header was "
                        "forwarded, skipping every span of this service")
    elif parent in servers:
        problems.append("its parent-id is the SERVER span: inject inside a PRODUCER span "
                        "around the send")
    elif parent not in producers:
        problems.append(f"its parent-id {parent} is no PRODUCER span of this trace")
    elif producers[parent].name != "publish order":
        problems.append(f"the PRODUCER span is named {producers[parent].name!r}, expected "
                        "'publish order'")
    # The SDK may set other bits than `sampled` (W3C level 2's random-trace-id bit: 03):
    # what must hold is the sampled bit, and the flags of the span the header names.
    own = (f"{int(producers[parent].context.trace_flags):02x}"
           if parent in producers and producers[parent].context is not None else None)
    if not int(flags, 16) & 1:
        problems.append(f"flags {flags}: the caller sampled this trace (the sampled bit, 01, "
                        "is set)")
    elif own is not None and flags != own:
        problems.append(f"flags {flags}, but the 'publish order' span's are {own}: inject "
                        "the span's own flags")
    if record.text("tracestate") != STATE:
        problems.append(f"tracestate = {record.text('tracestate')!r}, expected the caller's "
                        f"{STATE!r} (it travels with the trace)")
    if problems:
        raise CheckFailure(
            "The record's traceparent must continue the request's trace from the PRODUCER "
            "span that sent it (span 'publish order'), so the consumer's span hangs under the "
            "send; tracestate travels with it." + (ON_ASYNCIO if on_asyncio else ""),
            expected="traceparent: the request's trace id, parent-id = the 'publish order' "
                     "span, its flags (sampled); tracestate as the caller sent it",
            actual="; ".join(problems),
            evidence=evidence + "\n\n" + spans_table(shop.spans.of_trace(trace)), lesson=SEE)


def shipped(shop: Any) -> set[str]:
    with shop.deps.engine.connect() as conn:
        return {str(r[0]) for r in conn.execute(text("SELECT order_id FROM shipments"))}


def consume(shop: Any, count: int) -> None:
    handled = shop.consume(count)
    if handled != count:
        raise CheckFailure(
            f"consume(deps, consumer, max_records={count}) must handle the {count} records on "
            "the topic and return how many it handled.",
            expected=str(count), actual=str(handled), lesson=SEE)


def test_the_consumer_continues_the_producers_trace(shop):
    sent = [(trace_id_hex(), span_id_hex()) for _ in range(3)]
    heads = [[("traceparent", traceparent(t, p).encode())] for t, p in sent]
    heads[1].append(("tracestate", STATE.encode()))
    order_ids = produce_orders(shop, heads)
    consume(shop, 3)
    consumers = shop.spans.of_kind(SpanKind.CONSUMER)
    lines = shop.logs.lines(CONSUMER_SERVICE)
    rows, wrong = [], 0
    for (trace, parent), order_id in zip(sent, order_ids, strict=True):
        mine = [s for s in consumers if hex_trace(s) == trace]
        line = next((ln for ln in lines if str(ln.get("order_id")) == order_id
                     and ln.get("message") == "order shipped"), None)
        if not mine:
            problem = "no CONSUMER span in the record's trace"
        elif any(hex_parent(s) != parent for s in mine):
            problem = f"CONSUMER span's parent {hex_parent(mine[0])}, not the header's"
        elif mine[0].name != "process order":
            problem = f"CONSUMER span named {mine[0].name!r}, expected 'process order'"
        elif line is None:
            problem = "no 'order shipped' line with its order_id"
        elif line.get("trace_id") != trace:
            problem = f"'order shipped' logged with trace_id {line.get('trace_id')!r}"
        elif any(ln.get("level") == "WARNING" and ln.get("trace_id") == trace
                 for ln in lines):
            problem = "a WARNING in its trace, though its context was there and continued"
        else:
            problem = ""
        wrong += bool(problem)
        rows.append({"header trace": trace, "header parent": parent,
                     "problem": problem or "ok"})
    if wrong:
        raise CheckFailure(
            "A record that carries traceparent belongs to the producer's trace: the consumer "
            "must extract it and process the record in a CONSUMER span that is a child of the "
            "producer's span, not start a trace of its own (nor warn that it did).",
            expected="per record: span 'process order' (CONSUMER), trace id and parent from "
                     "the header; 'order shipped' logged with that trace id; no WARNING",
            actual=f"{wrong} of 3 records handled wrongly (see problem)",
            evidence=table(rows, ("header trace", "header parent", "problem"), width=70)
            + "\n\n" + spans_table(consumers) + "\n\n" + lines_table(lines), lesson=SEE)
    missing = set(order_ids) - shipped(shop)
    if missing:
        raise CheckFailure("Each record's order must be shipped (a row in shipments).",
                           expected="3 shipments", actual=f"{len(missing)} missing",
                           evidence="\n".join(sorted(missing)), lesson=SEE)


def test_a_record_without_trace_context_starts_a_new_trace_and_says_so(shop):
    bad = traceparent(trace_id_hex(), span_id_hex()).upper()  # upper-case hex: invalid
    order_ids = produce_orders(shop, [None, [("traceparent", bad.encode())]])
    consume(shop, 2)
    consumers = shop.spans.of_kind(SpanKind.CONSUMER)
    warnings = [ln for ln in shop.logs.lines(CONSUMER_SERVICE) if ln.get("level") == "WARNING"]
    problems = []
    if len(consumers) != 2:
        problems.append(f"{len(consumers)} CONSUMER spans for 2 records")
    for span in consumers:
        if span.parent is not None:
            problems.append(f"a CONSUMER span has a parent ({hex_parent(span)}) though its "
                            "record had no valid traceparent")
        elif not any(ln.get("trace_id") == hex_trace(span) for ln in warnings):
            problems.append(f"no WARNING line carries the new trace id {hex_trace(span)}: "
                            "nobody will know this trace was started here")
    traces = {hex_trace(s) for s in consumers}
    if len(traces) != len(consumers):
        problems.append("two records share one new trace")
    missing = set(order_ids) - shipped(shop)
    if missing:
        problems.append(f"{len(missing)} of the 2 orders not shipped: a record without a "
                        "header is still an order")
    if problems:
        raise CheckFailure(
            "A record with no traceparent, or a malformed one (upper-case hex here), has no "
            "trace to continue: process it in a new trace, and log a WARNING in that trace "
            "saying the context was missing, so the gap is visible.",
            expected="2 root CONSUMER spans, 2 new trace ids, a WARNING line in each, both "
                     "orders shipped",
            actual="; ".join(problems[:3]),
            evidence="\n".join(problems) + "\n\n" + spans_table(consumers) + "\n\n"
            + lines_table(shop.logs.lines(CONSUMER_SERVICE)), lesson=SEE)


def test_one_trace_from_the_http_request_to_the_consumer(shop):
    trace = trace_id_hex()
    order_id = place(shop, trace, span_id_hex(), state=None)
    consume(shop, 1)
    producers = {hex_span(s) for s in shop.spans.of_kind(SpanKind.PRODUCER, trace)}
    consumers = shop.spans.of_kind(SpanKind.CONSUMER)
    api = [ln for ln in shop.logs.lines(API_SERVICE) if ln.get("trace_id") == trace]
    shipping = [ln for ln in shop.logs.lines(CONSUMER_SERVICE) if ln.get("trace_id") == trace]
    ok = (len(consumers) == 1 and hex_trace(consumers[0]) == trace
          and hex_parent(consumers[0]) in producers and api and shipping)
    if not ok:
        raise CheckFailure(
            "One request, one trace: the order placed over HTTP and shipped by the consumer "
            "must share a trace id, the consumer's span a child of the API's producer span, "
            "and both services' lines must carry the id.",
            expected="CONSUMER span in the request's trace under its PRODUCER span; lines "
                     "from orders-api and shipping with the trace id",
            actual=f"{len(consumers)} CONSUMER span(s), {len(api)} orders-api and "
                   f"{len(shipping)} shipping line(s) with the trace id",
            evidence=f"order {order_id}\n" + spans_table(shop.spans.finished()) + "\n\n"
            + lines_table(shop.logs.lines()), lesson=SEE)


def test_an_unsampled_trace_goes_through_kafka_with_flags_00(shop, kafka):
    # With the SDK's parent-based sampler, a caller's flags 00 make every span of the request
    # unsampled: none is exported, but the trace goes on, and its flags travel with it.
    trace, caller = trace_id_hex(), span_id_hex()
    answer = shop.server.post(order_body(), {"traceparent": traceparent(trace, caller, "00")})
    if answer.status != 201:
        raise CheckFailure("POST /orders must place the order.", expected="201",
                           actual=str(answer.status), evidence=str(answer.body)[:400],
                           lesson=SEE)
    records = read_topic(kafka, shop.deps.topic, 1)
    header = records[0].text("traceparent") if records else None
    parsed = parse_traceparent(header)
    problems = []
    if parsed is None or parsed[0] != trace:
        problems.append(f"the record's traceparent {header!r} does not carry the request's "
                        "trace id")
    else:
        if parsed[2] != "00":
            problems.append(f"the record's flags are {parsed[2]}, but the caller did not "
                            "sample this trace (00): inject the span's own flags")
        if parsed[1] == caller:
            problems.append("its parent-id is the caller's span: the incoming header was "
                            "forwarded")
    consume(shop, 1)
    shipping = shop.logs.lines(CONSUMER_SERVICE)
    ours = [ln for ln in shipping if ln.get("trace_id") == trace]
    if not ours:
        problems.append("no shipping line carries the trace id: an unsampled context is "
                        "still a context to continue (and to log)")
    warned = [ln for ln in shipping if ln.get("level") == "WARNING"]
    if parsed is not None and warned:
        problems.append(f"{len(warned)} WARNING line(s), though the record had a valid "
                        "traceparent")
    if problems:
        raise CheckFailure(
            "A trace the caller did not sample (flags 00) still crosses Kafka: the record's "
            "traceparent carries its trace id and flags 00, and the consumer continues it and "
            "logs its id. Sampling decides what is exported, not what is propagated.",
            expected="record traceparent 00-<the request's trace id>-<a span of yours>-00; "
                     "shipping lines with that trace id; no WARNING",
            actual="; ".join(problems),
            evidence=(headers_table(records[0].headers) if records else "no record")
            + "\n\n" + lines_table(shipping), lesson=SEE)
