"""Stage incoming-context: POST /orders continues a valid incoming traceparent in a SERVER
span, and starts a new trace for a missing or malformed one, through a real HTTP server."""

from __future__ import annotations

from typing import Any

import pytest
from _support import (
    API_SERVICE,
    INVENTORY_SPAN,
    READ,
    hex_parent,
    hex_span,
    hex_trace,
    lines_table,
    order_body,
    span_id_hex,
    spans_table,
    trace_id_hex,
    traceparent,
)
from opentelemetry.trace import SpanKind

from dojo.checks import CheckFailure, table

pytestmark = pytest.mark.stage("incoming-context")
SEE = READ["incoming-context"]


def server_spans(shop: Any) -> list[Any]:
    return [s for s in shop.spans.of_kind(SpanKind.SERVER) if s.name != INVENTORY_SPAN]


def require_created(answer: Any, what: str) -> None:
    if answer.status != 201:
        raise CheckFailure(
            f"POST /orders ({what}) must place the order and answer 201.",
            expected="201 with {\"order_id\": …}", actual=f"{answer.status}",
            evidence=str(answer.body)[:500], lesson=SEE)


def test_a_valid_traceparent_is_continued(shop):
    trace_id, parent_id = trace_id_hex(), span_id_hex()
    state = "shop=t61rcWkgMzE,cart=00f067aa0ba902b7"
    answer = shop.server.post(order_body(), {"traceparent": traceparent(trace_id, parent_id),
                                             "tracestate": state})
    require_created(answer, "with a valid traceparent")
    servers = server_spans(shop)
    mine = [s for s in servers if hex_trace(s) == trace_id]
    problems = []
    if len(servers) != 1:
        problems.append(f"{len(servers)} SERVER spans for one request (expected one, named "
                        "'POST /orders')")
    if not mine:
        problems.append("no SERVER span in the caller's trace: the request started a trace "
                        "of its own")
    else:
        span = mine[0]
        if span.name != "POST /orders":
            problems.append(f"the SERVER span is named {span.name!r}, expected 'POST /orders'")
        if hex_parent(span) != parent_id:
            problems.append(f"its parent is {hex_parent(span)}, expected the caller's span "
                            f"{parent_id}")
        elif not span.parent.is_remote:
            problems.append("its parent is not marked remote: it was not extracted from the "
                            "header")
        got_state = span.context.trace_state.to_header() if span.context.trace_state else ""
        if got_state != state:
            problems.append(f"tracestate {got_state!r}, expected the caller's {state!r}")
    if problems:
        raise CheckFailure(
            "A request that arrives with a valid traceparent belongs to the caller's trace: "
            "its SERVER span must be a child of the caller's span (the header's parent-id), "
            "with the same trace id and the caller's tracestate.",
            expected="one SERVER span 'POST /orders': trace id and parent from the header",
            actual=f"{len(problems)} problem(s)",
            evidence="\n".join(problems) + "\n\ntraceparent sent: "
            + traceparent(trace_id, parent_id) + "\n" + spans_table(shop.spans.finished()),
            lesson=SEE)
    lines = shop.logs.lines(API_SERVICE)
    ours = [line for line in lines if line.get("trace_id") == trace_id]
    ids = {hex_span(s) for s in shop.spans.of_trace(trace_id)}
    strays = [line for line in ours if line.get("span_id") not in ids]
    if len(ours) < 2 or strays:
        raise CheckFailure(
            "The request's log lines must carry its trace id, and the id of the span that "
            "was current when they were written ('order received' and 'order placed' at "
            "least).",
            expected="≥ 2 lines with the caller's trace id, each with a span id of this trace",
            actual=f"{len(ours)} line(s) with it, {len(strays)} with a span id of no span in "
                   "the trace",
            evidence=lines_table(lines) + "\n\n" + spans_table(shop.spans.of_trace(trace_id)),
            lesson=SEE)


def test_no_traceparent_starts_a_new_trace(shop):
    for _ in range(2):
        require_created(shop.server.post(order_body()), "without a traceparent")
    servers = server_spans(shop)
    traces = {hex_trace(s) for s in servers}
    problems = []
    if len(servers) != 2:
        problems.append(f"{len(servers)} SERVER spans for 2 requests")
    if len(traces) != len(servers):
        problems.append("two requests share a trace id")
    rooted = [s for s in servers if s.parent is not None]
    if rooted:
        problems.append(f"{len(rooted)} SERVER span(s) with a parent, but no caller sent one")
    lines = shop.logs.lines(API_SERVICE)
    for trace in traces:
        if not any(line.get("trace_id") == trace for line in lines):
            problems.append(f"no log line carries the new trace id {trace}")
    if problems:
        raise CheckFailure(
            "A request without a traceparent is the start of a trace: its SERVER span is a "
            "root with a new trace id, and its log lines carry that id.",
            expected="2 SERVER spans, 2 new trace ids, no parents, lines with those ids",
            actual=f"{len(problems)} problem(s)",
            evidence="\n".join(problems) + "\n\n" + spans_table(servers) + "\n\n"
            + lines_table(lines), lesson=SEE)


# Each is refused by the W3C rules for version 00 (and for version ff, forbidden outright).
def malformed_headers() -> list[tuple[str, str]]:
    t, p = trace_id_hex(), span_id_hex()
    return [
        ("version ff", f"ff-{t}-{p}-01"),
        ("version 00 with a fifth field", f"00-{t}-{p}-01-0af7651916cd43dd"),
        ("version not hex", f"0g-{t}-{p}-01"),
        ("trace id 31 digits", f"00-{t[:31]}-{p}-01"),
        ("parent id 17 digits", f"00-{t}-{p}a-01"),
        ("all-zero trace id", f"00-{'0' * 32}-{p}-01"),
        ("all-zero parent id", f"00-{t}-{'0' * 16}-01"),
        ("upper-case hex", f"00-{t.upper()[:-1]}A-{p}-01"),
        ("not hex", f"00-{t[:-1]}z-{p}-01"),
        ("flags one digit", f"00-{t}-{p}-1"),
        ("empty", ""),
        ("garbage", "hello"),
    ]


def test_a_malformed_traceparent_starts_a_new_trace(shop):
    rows, wrong = [], 0
    for label, header in malformed_headers():
        before = {id(s) for s in shop.spans.finished()}
        answer = shop.server.post(order_body(), {"traceparent": header})
        new = [s for s in server_spans(shop) if id(s) not in before]
        claimed = header.split("-")[1].lower() if header.count("-") >= 2 else "?"
        if answer.status != 201 or len(new) != 1:
            verdict = f"answered {answer.status}, {len(new)} SERVER span(s)"
        elif new[0].parent is not None:
            verdict = f"continued: parent {hex_parent(new[0])}"
        elif hex_trace(new[0]) == claimed:
            verdict = "kept the header's trace id"
        else:
            verdict = "new trace"
        ok = verdict == "new trace"
        wrong += not ok
        rows.append({"header": label, "traceparent": header or "(empty)", "result": verdict,
                     "ok": "yes" if ok else "NO"})
    if wrong:
        raise CheckFailure(
            "A traceparent that breaks the W3C rules must not be trusted: the request starts "
            "a new trace (and still succeeds). Continuing it would glue unrelated requests "
            "together, or let a client choose ids that are not ids.",
            expected="every malformed header → answered 201, a root SERVER span with a new "
                     "trace id",
            actual=f"{wrong} of {len(rows)} malformed headers trusted or mishandled",
            evidence=table(rows, ("header", "traceparent", "result", "ok"), limit=20,
                           width=70),
            lesson=SEE)


def test_an_unsampled_callers_trace_id_is_still_logged(shop):
    trace_id, caller = trace_id_hex(), span_id_hex()
    answer = shop.server.post(order_body(),
                              {"traceparent": traceparent(trace_id, caller, "00")})
    require_created(answer, "from a caller that did not sample the trace")
    lines = shop.logs.lines(API_SERVICE)
    ours = [line for line in lines if line.get("trace_id") == trace_id]
    exported = shop.spans.of_trace(trace_id)
    if len(ours) < 2:
        raise CheckFailure(
            "The caller did not sample this trace (flags 00), so its spans are not exported, "
            "but the trace still exists: the ids are created and passed on, and every log "
            "line carries them. Sampling decides what is exported, not what is logged.",
            expected="≥ 2 lines with the caller's trace id",
            actual=f"{len(ours)} line(s) with it; {len(exported)} span(s) exported",
            evidence=lines_table(lines), lesson=SEE)
    if exported:
        raise CheckFailure(
            "The caller did not sample this trace (flags 00): with the SDK's parent-based "
            "sampler its spans are valid but not recording, and none is exported. Spans of "
            "it were exported, so the request's span was sampled: the caller's flags were "
            "lost when the traceparent was read (a parser that sets the sampled flag itself, "
            "or that drops the flags, turns every caller's 00 into 01).",
            expected="no span of the caller's trace exported; its flags 00 kept",
            actual=f"{len(exported)} span(s) of it exported",
            evidence=f"traceparent sent: {traceparent(trace_id, caller, '00')}\n"
            + spans_table(exported), lesson=SEE,
            fix="let TraceContextTextMapPropagator().extract read the header: it keeps the "
                "caller's flags")
