"""Stage async-boundaries: the confirmation handed to the thread pool and the audit job that
runs after the response stay in the request's trace, as child spans, and log its trace id."""

from __future__ import annotations

import json
import logging
import time
from typing import Any

import pytest
from _support import (
    API_LOGGER,
    API_SERVICE,
    READ,
    RecordingExecutor,
    awaited,
    hex_parent,
    hex_span,
    hex_trace,
    lines_table,
    order_body,
    spans_table,
    trace_id_hex,
    traceparent,
)

from dojo.checks import CheckFailure, table

pytestmark = pytest.mark.stage("async-boundaries")
SEE = READ["async-boundaries"]


def follow(shop: Any, sent: list[tuple[str, str]], span_name: str, message: str,
           where: str) -> None:
    """For each (trace id, order id): the `message` line about that order carries the trace
    id, and a `span_name` span sits in that trace under one of its spans."""
    lines = shop.logs.lines(API_SERVICE)
    rows, wrong = [], 0
    for trace, order_id in sent:
        line = next((ln for ln in lines if ln.get("message") == message
                     and str(ln.get("order_id")) == order_id), None)
        in_trace = {hex_span(s): s for s in shop.spans.of_trace(trace)}
        named = [s for s in shop.spans.named(span_name) if hex_trace(s) == trace]
        stray = [s for s in shop.spans.named(span_name) if hex_trace(s) != trace
                 and hex_trace(s) not in {t for t, _ in sent}]
        problem = ""
        if line is None:
            problem = f"no {message!r} line with order_id"
        elif line.get("trace_id") != trace:
            problem = f"{message!r} logged with trace_id {line.get('trace_id')!r}"
        elif not named:
            problem = (f"no {span_name!r} span in the trace"
                       + (f" ({len(stray)} in new traces of their own)" if stray else ""))
        elif hex_parent(named[0]) not in in_trace:
            problem = f"{span_name!r} has no parent among the request's spans"
        wrong += bool(problem)
        rows.append({"request trace": trace, "order_id": order_id,
                     "problem": problem or "ok"})
    if wrong:
        raise CheckFailure(
            f"Work the request hands over ({where}) runs on another thread or task, whose "
            "context is its own: unless you carry the request's context over, its lines lose "
            "the trace id and its span starts a trace of its own.",
            expected=f"each {message!r} line carries its request's trace id; each "
                     f"{span_name!r} span is a child of a span of that request",
            actual=f"{wrong} of {len(sent)} requests lost their trace across the boundary",
            evidence=table(rows, ("request trace", "order_id", "problem"), width=70)
            + "\n\n" + lines_table(lines) + "\n\n"
            + spans_table(shop.spans.named(span_name)),
            lesson=SEE)


def post_two_in_a_row(shop: Any) -> list[tuple[str, str]]:
    sent = []
    for _ in range(2):
        trace = trace_id_hex()
        answer = shop.server.post(order_body(), {"traceparent": traceparent(trace)})
        if answer.status != 201:
            raise CheckFailure("POST /orders must place the order.", expected="201",
                               actual=str(answer.status), evidence=str(answer.body)[:400],
                               lesson=SEE)
        sent.append((trace, str(answer.body.get("order_id"))))
    return sent


def require_submitted(count: int, what: str, where: str) -> None:
    if count == 0:
        raise CheckFailure(
            f"The {what} must be handed to {where}, not done inline: the request must not "
            "wait for it (the README names where it goes).",
            expected=f"≥ 1 job submitted to {where}", actual="none", lesson=SEE)


def test_the_confirmation_on_the_thread_pool_keeps_the_trace(shop):
    shop.deps.executor = pool = RecordingExecutor(1)  # one thread serves both requests
    sent = post_two_in_a_row(shop)
    api_log = logging.getLogger(API_LOGGER)
    probe = pool.submit(api_log.info, "probe: no request here")  # the check's own, no context
    probe.result(10)
    shop.drain_executor()
    require_submitted(pool.submitted - 1, "confirmation", "deps.executor")
    follow(shop, sent, "send confirmation", "confirmation sent", "the thread pool")
    [line] = [ln for ln in shop.logs.lines(API_SERVICE) if ln.get("message") ==
              "probe: no request here"] or [{}]
    if line.get("trace_id"):
        raise CheckFailure(
            "A line the check logged on the pool thread, after your confirmations ran there, "
            "still carried a request's trace id: a context you set on the pool thread was "
            "never taken off, so it leaks into whatever that thread runs next.",
            expected='trace_id "" on a line logged outside any request',
            actual="the trace id of an earlier request",
            evidence=lines_table(shop.logs.lines(API_SERVICE)), lesson=SEE,
            fix="run the work inside contextvars.copy_context().run(...): whatever it sets "
                "stays in that copy")


def test_the_confirmation_from_asyncio_keeps_the_trace(shop):
    sent = run_two_async(shop)
    shop.drain_executor()
    follow(shop, sent, "send confirmation", "confirmation sent",
           "the thread pool, from the asyncio handler")


def run_two_async(shop: Any, returned: list[int] | None = None) -> list[tuple[str, str]]:
    pool = shop.deps.executor

    async def both() -> list[tuple[str, str]]:
        sent = []
        for _ in range(2):
            trace = trace_id_hex()
            response = await awaited(shop.api.handle_order_async(
                shop.deps, {"traceparent": traceparent(trace)},
                json.dumps(order_body()).encode()))
            if returned is not None:
                returned.append(time.time_ns())
            if response.status != 201:
                raise CheckFailure("handle_order_async must place the order.", expected="201",
                                   actual=str(response.status),
                                   evidence=str(response.body)[:400], lesson=SEE)
            sent.append((trace, str(response.body.get("order_id"))))
        return sent

    sent = shop.run_async(both)
    require_submitted(pool.submitted, "confirmation", "deps.executor")
    return sent


def test_the_audit_job_after_the_response_keeps_the_trace(shop):
    returned: list[int] = []
    sent = run_two_async(shop, returned)
    require_submitted(shop.jobs_submitted, "audit", "deps.jobs")
    follow(shop, sent, "audit order", "order audited", "a background job after the response")
    early = []
    for (trace, _), answered in zip(sent, returned, strict=True):
        for span in shop.spans.named("audit order"):
            if hex_trace(span) == trace and (span.start_time or 0) < answered:
                early.append(trace)
    if early:
        raise CheckFailure(
            "The audit must run after the response, as a background job: the caller should "
            "not wait for it.",
            expected="every 'audit order' span starts after handle_order_async returned",
            actual=f"{len(early)} started before", evidence="\n".join(early), lesson=SEE)
