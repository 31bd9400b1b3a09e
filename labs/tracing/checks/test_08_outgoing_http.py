"""Stage outgoing-http: the call to the inventory service runs in a CLIENT span and carries its
traceparent, so the inventory's own span is that client span's child."""

from __future__ import annotations

import socket
from typing import Any

import pytest
from _support import (
    INVENTORY_SPAN,
    READ,
    hex_parent,
    hex_span,
    hex_trace,
    order_body,
    parse_traceparent,
    span_id_hex,
    spans_table,
    trace_id_hex,
    traceparent,
)
from opentelemetry.trace import SpanKind, StatusCode

from dojo.checks import CheckFailure, table

pytestmark = pytest.mark.stage("outgoing-http")
SEE = READ["outgoing-http"]
ON_ASYNCIO = (" handle_order_async runs this step on a thread of the loop's executor: "
              "asyncio.to_thread copies the request's context there, loop.run_in_executor "
              "does not.")


def covers(client: Any, server: Any) -> bool:
    """The CLIENT span started before the inventory's span and ended after it: the inventory
    ends its span before it sends the answer, which the caller has to wait for."""
    return (client.start_time is not None and client.end_time is not None
            and server.start_time is not None and server.end_time is not None
            and client.start_time <= server.start_time and server.end_time <= client.end_time)


def verify_call(shop: Any, trace: str, caller: str | None, header_sent: str,
                on_asyncio: bool = False) -> None:
    calls = shop.inventory.calls
    header = calls[-1].headers.get("traceparent") if calls else None
    parsed = parse_traceparent(header)
    clients = {hex_span(s): s for s in shop.spans.of_kind(SpanKind.CLIENT, trace)}
    servers = {hex_span(s) for s in shop.spans.of_kind(SpanKind.SERVER, trace)
               if s.name != INVENTORY_SPAN}
    downstream = [s for s in shop.spans.named(INVENTORY_SPAN)
                  if calls and hex_span(s) == calls[-1].span_id]
    if not calls:
        problem = "the inventory service was never called"
    elif parsed is None:
        problem = f"the call carried traceparent {header!r}: the inventory starts a new trace"
    elif parsed[0] != trace:
        problem = f"the call carried another trace id ({parsed[0]})"
    elif caller is not None and parsed[1] == caller:
        problem = ("the call carried the caller's own traceparent, forwarded unchanged: the "
                   "inventory looks like a sibling of your service, not its child")
    elif parsed[1] in servers:
        problem = ("its parent-id is the SERVER span: the call has no CLIENT span of its own, "
                   "so its time and failure are nowhere")
    elif parsed[1] not in clients:
        problem = f"its parent-id {parsed[1]} is no CLIENT span of this trace"
    elif clients[parsed[1]].name != "reserve stock":
        problem = f"the CLIENT span is named {clients[parsed[1]].name!r}, not 'reserve stock'"
    elif not downstream or hex_parent(downstream[-1]) != parsed[1]:
        problem = "the inventory's span is not a child of your CLIENT span"
    elif calls[-1].parent_ended_before:
        problem = ("the 'reserve stock' span had already ended when the inventory received "
                   "the call: it was opened to make the header, and the call ran after it, "
                   "so the span measures nothing and a failed call is not recorded on it")
    elif not covers(clients[parsed[1]], downstream[-1]):
        problem = ("the 'reserve stock' span does not cover the call: it ended before the "
                   "inventory had answered, so the span measures only part of the call")
    else:
        return
    raise CheckFailure(
        "The call to the inventory service must carry the trace on: inside a CLIENT span "
        "('reserve stock') around the call, inject that span's context into the request "
        "headers, so the inventory's span is its child, and make the call before the span "
        "ends, so the span measures it." + (ON_ASYNCIO if on_asyncio else ""),
        expected="traceparent: the request's trace id, parent-id = your 'reserve stock' "
                 "CLIENT span, open for the whole call",
        actual=problem,
        evidence=f"request traceparent: {header_sent or '(none)'}\nheaders the inventory got: "
        + (str({k: v for k, v in calls[-1].headers.items()
                if k in ('traceparent', 'tracestate')}) if calls else "-")
        + "\n" + spans_table(shop.spans.finished()),
        lesson=SEE)


def test_the_inventory_call_carries_traceparent_from_a_client_span(shop):
    trace, caller = trace_id_hex(), span_id_hex()
    header = traceparent(trace, caller)
    shop.server.post(order_body(), {"traceparent": header})
    verify_call(shop, trace, caller, header)


def test_without_an_incoming_trace_the_call_carries_the_new_one(shop):
    shop.server.post(order_body())
    servers = [s for s in shop.spans.of_kind(SpanKind.SERVER) if s.name != INVENTORY_SPAN]
    if len(servers) != 1:
        raise CheckFailure("One request, one SERVER span.", expected="1",
                           actual=str(len(servers)), evidence=spans_table(servers),
                           lesson=SEE)
    verify_call(shop, hex_trace(servers[0]), None, "")


def test_on_asyncio_the_inventory_call_carries_traceparent_from_a_client_span(shop):
    # handle_order_async makes the call on a thread of the loop's executor: the request's
    # context must go with it (asyncio.to_thread copies it; loop.run_in_executor does not).
    trace, caller = trace_id_hex(), span_id_hex()
    header = traceparent(trace, caller)
    shop.post_async(order_body(), {"traceparent": header})
    verify_call(shop, trace, caller, header, on_asyncio=True)


def closed_port_url() -> str:
    """A URL on 127.0.0.1 where nothing listens: the connection is refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def test_a_failed_call_is_recorded_on_its_client_span(shop):
    # The call fails two ways (the inventory answers 503; nothing listens at inventory_url),
    # from both handlers: each time the CLIENT span, not only the SERVER span, shows it.
    rows, wrong = [], 0
    for handler in ("handle_order", "handle_order_async"):
        for failure in ("503 Service Unavailable", "connection refused"):
            body, trace = order_body(), trace_id_hex()
            url = shop.deps.inventory_url
            if failure.startswith("503"):
                shop.inventory.failures[body["sku"]] = (503, "warehouse 7 is offline")
            else:
                shop.deps.inventory_url = closed_port_url()
            try:
                headers = {"traceparent": traceparent(trace)}
                answer = (shop.server.post(body, headers) if handler == "handle_order"
                          else shop.post_async(body, headers))
            finally:
                shop.deps.inventory_url = url
            clients = [s for s in shop.spans.of_kind(SpanKind.CLIENT, trace)
                       if s.name == "reserve stock"]
            events = [e for s in clients for e in s.events if e.name == "exception"]
            if answer.status != 502:
                problem = f"answered {answer.status}, not 502"
            elif not clients:
                problem = "no 'reserve stock' CLIENT span in the request's trace"
            elif clients[-1].status.status_code != StatusCode.ERROR or not events:
                problem = (f"'reserve stock': status {clients[-1].status.status_code.name}, "
                           f"{len(events)} exception event(s)")
            else:
                problem = ""
            wrong += bool(problem)
            rows.append({"handler": handler, "the call": failure,
                         "problem": problem or "ok"})
    if wrong:
        raise CheckFailure(
            "A failed call to the inventory must be recorded on its CLIENT span ('reserve "
            "stock'): status ERROR and the exception as an event. The SERVER span says the "
            "request failed; the CLIENT span says it was this call, and how long it took to "
            "fail. Starting the span with record_exception=False or "
            "set_status_on_exception=False (or catching the error inside it) hides that.",
            expected="each failed call: 502, a 'reserve stock' CLIENT span with status ERROR "
                     "and an 'exception' event",
            actual=f"{wrong} of {len(rows)} failed calls not recorded on their CLIENT span",
            evidence=table(rows, ("handler", "the call", "problem"), width=70) + "\n\n"
            + spans_table(shop.spans.of_kind(SpanKind.CLIENT), limit=8),
            lesson=SEE)


def test_an_unsampled_callers_call_carries_flags_00(shop):
    # The caller did not sample the trace: the CLIENT span is not recording (not exported),
    # but the call still carries the trace on, with the span's own flags, 00.
    rows, wrong = [], 0
    for handler in ("handle_order", "handle_order_async"):
        trace, caller = trace_id_hex(), span_id_hex()
        sent = traceparent(trace, caller, "00")
        before = len(shop.inventory.calls)
        if handler == "handle_order":
            shop.server.post(order_body(), {"traceparent": sent})
        else:
            shop.post_async(order_body(), {"traceparent": sent})
        calls = shop.inventory.calls[before:]
        header = calls[-1].headers.get("traceparent") if calls else None
        parsed = parse_traceparent(header)
        exported = [s for s in shop.spans.of_trace(trace) if s.name != INVENTORY_SPAN]
        if parsed is None or parsed[0] != trace:
            problem = "the call does not carry the request's trace id"
        elif parsed[2] != "00":
            problem = (f"flags {parsed[2]}: the caller did not sample this trace (00), so "
                       "neither does your span")
        elif parsed[1] == caller:
            problem = "the caller's own traceparent, forwarded unchanged"
        elif exported:
            problem = f"{len(exported)} span(s) of the unsampled trace exported"
        else:
            problem = ""
        wrong += bool(problem)
        rows.append({"handler": handler, "traceparent sent": sent,
                     "inventory got": header or "(none)", "problem": problem or "ok"})
    if wrong:
        raise CheckFailure(
            "A trace the caller did not sample (flags 00) still goes on to the inventory: the "
            "call carries its trace id, your CLIENT span's id and that span's flags, 00. "
            "Flags that turn into 01 on the way make the inventory record a trace nobody "
            "upstream kept.",
            expected="traceparent 00-<the request's trace id>-<your span>-00; no span of the "
                     "trace exported",
            actual=f"{wrong} of {len(rows)} calls wrong",
            evidence=table(rows, ("handler", "traceparent sent", "inventory got", "problem"),
                           width=60),
            lesson=SEE,
            fix="extract with TraceContextTextMapPropagator (it keeps the flags) and inject "
                "from the CLIENT span")
