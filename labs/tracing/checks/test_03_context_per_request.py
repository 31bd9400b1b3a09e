"""Stage context-per-request: 50 requests in flight at once, on the threaded server and on the
asyncio handler, never log each other's trace ids (the context lives in contextvars)."""

from __future__ import annotations

import json
import random
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from _support import (
    API_SERVICE,
    READ,
    awaited,
    hex_span,
    hex_trace,
    trace_id_hex,
    traceparent,
)
from _support import order_body as new_order

from dojo.checks import CheckFailure, table

pytestmark = pytest.mark.stage("context-per-request")
SEE = READ["context-per-request"]
N = 50


def requests_of(n: int) -> list[tuple[str, dict[str, Any]]]:
    """n requests, each with its own trace id and SKU (the inventory tells them apart)."""
    return [(trace_id_hex(), new_order(sku=f"SKU-{i:02d}-{random.randint(100, 999)}"))
            for i in range(n)]


def hold_in_order(shop: Any, sent: list[tuple[str, dict[str, Any]]]) -> None:
    """The inventory holds every call until all N are in; the last request in (the last to
    start its span) is answered only after another request logged `order placed`. A context
    kept where requests share it then shows in that line, every run."""
    api_text = shop.logs.text

    def another_moved_on() -> bool:
        return "order placed" in api_text(API_SERVICE)

    shop.inventory.hold(N, last=sent[-1][1]["sku"], release_last=another_moved_on)


def verify_no_bleed(shop: Any, sent: list[tuple[str, dict[str, Any]]],
                    answers: list[tuple[int, dict[str, Any]]], where: str) -> None:
    failed = [(status, body) for status, body in answers if status != 201]
    if failed:
        raise CheckFailure(
            f"Every one of the {N} concurrent orders ({where}) must be placed.",
            expected=f"{N} answers 201", actual=f"{len(failed)} answer(s) not 201",
            evidence="\n".join(f"{s}: {str(b)[:200]}" for s, b in failed[:5]), lesson=SEE)
    if shop.inventory.held_together < N:
        raise CheckFailure(
            f"The {N} requests ({where}) never were in flight together: each waited for the "
            "one before it, so nothing here could show whether contexts stay apart.",
            expected=f"{N} requests inside the inventory call at the same time",
            actual=f"at most {shop.inventory.held_together} at once",
            evidence="The inventory service holds every call until all have arrived (10 s at "
                     "most). A lock around the handler, or blocking calls on the event loop "
                     "instead of asyncio.to_thread, keeps them apart.", lesson=SEE)
    trace_of_customer = {body["customer_id"]: trace for trace, body in sent}
    trace_of_order = {}
    for (trace, _), (_, body) in zip(sent, answers, strict=True):
        trace_of_order[str(body.get("order_id"))] = trace
    ours = set(trace_of_customer.values())
    span_ids: dict[str, set[str]] = {}
    for span in shop.spans.finished():
        span_ids.setdefault(hex_trace(span), set()).add(hex_span(span))
    lines = shop.logs.lines(API_SERVICE)
    bled, counts = [], {trace: 0 for trace in ours}
    for line in lines:
        logged = line.get("trace_id")
        expected = (trace_of_customer.get(str(line.get("customer_id")))
                    or trace_of_order.get(str(line.get("order_id"))))
        if logged in counts:
            counts[logged] += 1
        wrong_trace = expected is not None and logged != expected
        wrong_span = logged in ours and line.get("span_id") not in span_ids.get(logged, set())
        if wrong_trace or wrong_span:
            bled.append({"message": line.get("message"),
                         "its request's trace": expected or "?",
                         "logged trace_id": logged,
                         "logged span_id": line.get("span_id"),
                         "span of that trace": "no" if wrong_span else "yes"})
    uneven = sorted(set(counts.values()))
    if bled or len(uneven) > 1 or uneven == [0]:
        raise CheckFailure(
            f"With {N} requests in flight at once ({where}), requests logged other requests' "
            "trace and span ids: the current trace lives somewhere all requests share (a "
            "global, or a thread-local where many requests share a thread). Keep it in "
            "contextvars, which OpenTelemetry already does: read trace.get_current_span() "
            "when each line is written.",
            expected="every line carries its own request's trace id and one of its spans; "
                     "each request writes as many lines as the others",
            actual=f"{len(bled)} line(s) with another request's ids; lines per request "
                   f"between {min(counts.values())} and {max(counts.values())}",
            evidence=table(bled, ("message", "its request's trace", "logged trace_id",
                                  "logged span_id", "span of that trace"), width=34),
            lesson=SEE)


def test_fifty_requests_on_threads_keep_their_own_trace(shop):
    sent = requests_of(N)
    server = shop.server
    hold_in_order(shop, sent)

    def post(request: tuple[str, dict[str, Any]]) -> tuple[int, dict[str, Any]]:
        trace, body = request
        answer = server.post(body, {"traceparent": traceparent(trace)})
        return answer.status, answer.body

    deadline = time.monotonic() + 20
    with ThreadPoolExecutor(N) as clients:
        futures = []
        for n, request in enumerate(sent, 1):
            futures.append(clients.submit(post, request))
            shop.inventory.wait_arrived(n, deadline)  # spans start in the order sent
        answers = [future.result() for future in futures]
    shop.drain_executor()
    verify_no_bleed(shop, sent, answers, "on the threaded server")


def test_fifty_requests_on_asyncio_keep_their_own_trace(shop):
    import asyncio

    sent = requests_of(N)
    hold_in_order(shop, sent)

    async def one(trace: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        response = await awaited(shop.api.handle_order_async(
            shop.deps, {"traceparent": traceparent(trace)}, json.dumps(body).encode()))
        return response.status, dict(response.body)

    async def all_of_them() -> list[tuple[int, dict[str, Any]]]:
        deadline = time.monotonic() + 20
        tasks = []
        for n, (trace, body) in enumerate(sent, 1):
            tasks.append(asyncio.create_task(one(trace, body)))
            while (shop.inventory.arrived() < n and not tasks[-1].done()
                   and time.monotonic() < deadline):
                await asyncio.sleep(0.002)  # spans start in the order sent
        return list(await asyncio.gather(*tasks))

    answers = shop.run_async(all_of_them)
    shop.drain_executor()
    verify_no_bleed(shop, sent, answers, "on asyncio")
