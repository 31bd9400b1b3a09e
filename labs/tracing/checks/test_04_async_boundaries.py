"""Stage async-boundaries: the confirmation handed to the thread pool and the audit job that
runs after the response stay in the request's trace, as child spans, and log its trace id."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from concurrent.futures import ThreadPoolExecutor
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


# A line the check logs where the learner's work ran before it, outside any request: a context
# set there and never taken off (otel_context.attach without detach) shows in its trace id.
PROBES = {
    "pool": ("probe: the pool thread, after the confirmations",
             "deps.executor's one thread, after the confirmations ran there"),
    "loop": ("probe: the loop's executor thread, after the steps",
             "the event loop's default executor (one thread), after the request's steps"),
    "jobs": ("probe: the jobs worker, after the audits",
             "a job of the check's on deps.jobs, after the audit jobs"),
}


def probe_pool(pool: Any) -> None:
    """Log the pool probe on `pool` (of one thread), after the work already queued there;
    not counted as work the learner submitted."""
    ThreadPoolExecutor.submit(pool, logging.getLogger(API_LOGGER).info,
                              PROBES["pool"][0]).result(10)


def require_no_leak(shop: Any, probed: tuple[str, ...]) -> None:
    lines = shop.logs.lines(API_SERVICE)
    rows, leaked = [], 0
    for key in probed:
        message, where = PROBES[key]
        line: dict[str, Any] = next((ln for ln in lines if ln.get("message") == message), {})
        leak = bool(line.get("trace_id"))
        leaked += leak
        rows.append({"logged on": where,
                     "trace_id": str(line.get("trace_id", "(no line)")) or '""',
                     "ok": "NO" if leak else "yes"})
    if leaked:
        raise CheckFailure(
            "A line the check logged outside any request, on a thread or worker where your "
            "code had run a request's work before, still carried a request's trace id: a "
            "context you set there (otel_context.attach) and never took off leaks into "
            "whatever runs there next.",
            expected='trace_id "" on every line logged outside any request',
            actual=f"{leaked} of {len(rows)} such lines carried an earlier request's trace id",
            evidence=table(rows, ("logged on", "trace_id", "ok"), width=70) + "\n\n"
            + lines_table(lines), lesson=SEE,
            fix="run the work inside contextvars.copy_context().run(...) (whatever it sets "
                "stays in that copy), start the span with context=..., or detach the token "
                "attach gave you in a finally")


def test_the_confirmation_on_the_thread_pool_keeps_the_trace(shop):
    shop.deps.executor = pool = RecordingExecutor(1)  # one thread serves both requests
    sent = post_two_in_a_row(shop)
    probe_pool(pool)  # the check's own, no context
    shop.drain_executor()
    require_submitted(pool.submitted, "confirmation", "deps.executor")
    follow(shop, sent, "send confirmation", "confirmation sent", "the thread pool")
    require_no_leak(shop, ("pool",))


def test_the_confirmation_from_asyncio_keeps_the_trace(shop):
    shop.deps.executor = pool = RecordingExecutor(1)  # one thread serves both requests
    sent = run_two_async(shop, probe=True)
    probe_pool(pool)
    shop.drain_executor()
    follow(shop, sent, "send confirmation", "confirmation sent",
           "the thread pool, from the asyncio handler")
    require_no_leak(shop, ("pool", "loop", "jobs"))


def run_two_async(shop: Any, returned: list[int] | None = None,
                  probe: bool = False) -> list[tuple[str, str]]:
    """Two requests one after the other through handle_order_async; with `probe`, on a loop
    whose default executor has one thread, then a probe line logged on that thread and one
    in a job of the check's own on deps.jobs (after the audits)."""
    pool = shop.deps.executor
    api_log = logging.getLogger(API_LOGGER)

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
        if probe:
            await asyncio.get_running_loop().run_in_executor(None, api_log.info,
                                                             PROBES["loop"][0])
            if shop.deps.jobs is not None:

                async def job() -> None:
                    api_log.info(PROBES["jobs"][0])

                shop.deps.jobs.submit(job)
                shop.jobs_submitted -= 1  # the check's own job, not the learner's
        return sent

    sent = shop.run_async(both, threads=1 if probe else 64)
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
