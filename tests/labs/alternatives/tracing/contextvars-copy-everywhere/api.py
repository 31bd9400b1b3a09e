"""The order API: POST /orders, served on threads (WSGI) or on asyncio.

One request, one trace: the SERVER span continues the caller's traceparent, and every hop the
request makes (the inventory call, the Kafka record, the confirmation on the thread pool, the
audit job after the response) carries that trace onward.

Design: no OpenTelemetry Context object is ever passed around by hand. Whatever runs outside
the request's own thread or task (a pool thread, a default-executor thread, the jobs worker)
runs in a *copy of the request's contextvars*, taken at the moment the work is handed off
(`_bound`); the spans there simply use the current span as their parent.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import json
import logging
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, TypeVar

from opentelemetry.trace import Span, SpanKind, Status, StatusCode

import shop
import telemetry

log = logging.getLogger("orders.api")

R = TypeVar("R")


def _bound(function: Callable[..., R], *args: Any) -> Callable[[], R]:
    """`function(*args)`, to run later anywhere, in a copy of the caller's contextvars (the
    current span among them) taken now. Each call takes a copy of its own: a Context can be
    entered by one thread at a time."""
    return functools.partial(contextvars.copy_context().run, function, *args)


async def _in_thread(function: Callable[..., R], *args: Any) -> R:
    """A blocking step on the loop's default executor, in a copy of the task's context."""
    return await asyncio.get_running_loop().run_in_executor(None, _bound(function, *args))


# -- the hops a request makes ------------------------------------------------------------------

def reserve_stock(deps: shop.Deps, order_id: uuid.UUID, order: shop.Order) -> dict[str, Any]:
    """Reserve the order's stock at the inventory service, in a CLIENT span whose context
    travels in the request's traceparent header."""
    with deps.tracer.start_as_current_span("reserve stock", kind=SpanKind.CLIENT):
        return shop.post_json(f"{deps.inventory_url}/reservations",
                              {"order_id": str(order_id), "sku": order.sku,
                               "quantity": order.quantity},
                              telemetry.inject())


def publish_order(deps: shop.Deps, order_id: uuid.UUID, order: shop.Order) -> None:
    """Send the `order placed` record, in a PRODUCER span whose context travels in the
    record's headers (never in its value), and wait for the broker's acknowledgement."""
    with deps.tracer.start_as_current_span("publish order", kind=SpanKind.PRODUCER):
        headers = [(name, value.encode()) for name, value in telemetry.inject().items()]
        failures: list[str] = []

        def on_delivery(err: Any, msg: Any) -> None:
            if err is not None:
                failures.append(str(err))

        deps.producer.produce(deps.topic, key=str(order_id).encode(),
                              value=shop.order_event(order_id, order), headers=headers,
                              on_delivery=on_delivery)
        if deps.producer.flush(10) or failures:
            raise shop.DownstreamError(f"order event not acknowledged: {failures or 'timeout'}")


def send_confirmation(deps: shop.Deps, order_id: uuid.UUID) -> None:
    """Runs on the thread pool: (pretend to) mail the customer."""
    with deps.tracer.start_as_current_span("send confirmation"):
        log.info("confirmation sent", extra={"order_id": str(order_id)})


async def audit_order(deps: shop.Deps, order_id: uuid.UUID) -> None:
    """Runs as a background job after the response, as a task in a copy of the request's
    context (see `_job_in_request_context`): its current span is the request's."""
    await asyncio.sleep(0.01)  # after the response, for real
    with deps.tracer.start_as_current_span("audit order"):
        log.info("order audited", extra={"order_id": str(order_id)})


def _job_in_request_context(job: Callable[[], Awaitable[None]]) -> Callable[[], Awaitable[None]]:
    """A job for shop.BackgroundJobs that runs, when the worker gets to it, as a task of its
    own in a copy of the context current *now* (the request's), not in the worker's. The
    worker awaits that task; nothing the job sets leaks into the worker's context."""
    context = contextvars.copy_context()

    def start() -> Awaitable[None]:
        return asyncio.get_running_loop().create_task(job(), context=context)  # type: ignore[arg-type]

    return start


# -- the handlers -------------------------------------------------------------------------------

def _failed(span: Span, exc: Exception, status: int) -> shop.Response:
    """Record the failure on the span and in one log line; answer with the trace id."""
    span.record_exception(exc)
    span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
    log.exception("order failed")
    trace_id, _ = telemetry.current_ids()
    return shop.Response(status, {"error": str(exc), "trace_id": trace_id})


def handle_order(deps: shop.Deps, headers: Mapping[str, str], body: bytes) -> shop.Response:
    """POST /orders on a server thread."""
    with telemetry.server_span(deps.tracer, "POST /orders", headers) as span:
        try:
            order = shop.parse_order(body)
        except shop.BadRequest as exc:
            log.info("order refused: %s", exc)
            return shop.Response(400, {"error": str(exc)})
        try:
            log.info("order received", extra={"customer_id": str(order.customer_id)})
            order_id = shop.insert_order(deps.engine, order)
            reserve_stock(deps, order_id, order)
            publish_order(deps, order_id, order)
            log.info("order placed", extra={"order_id": str(order_id)})
            # A pool thread has a context of its own: run the work in a copy of ours.
            deps.executor.submit(_bound(send_confirmation, deps, order_id))
            return shop.Response(201, {"order_id": str(order_id)})
        except Exception as exc:
            return _failed(span, exc, 502)


async def handle_order_async(deps: shop.Deps, headers: Mapping[str, str],
                             body: bytes) -> shop.Response:
    """POST /orders on an event loop: the blocking steps go to the default executor's
    threads, each in a copy of the request's context (what asyncio.to_thread does)."""
    with telemetry.server_span(deps.tracer, "POST /orders", headers) as span:
        try:
            order = shop.parse_order(body)
        except shop.BadRequest as exc:
            log.info("order refused: %s", exc)
            return shop.Response(400, {"error": str(exc)})
        try:
            log.info("order received", extra={"customer_id": str(order.customer_id)})
            order_id = await _in_thread(shop.insert_order, deps.engine, order)
            await _in_thread(reserve_stock, deps, order_id, order)
            await _in_thread(publish_order, deps, order_id, order)
            log.info("order placed", extra={"order_id": str(order_id)})
            deps.executor.submit(_bound(send_confirmation, deps, order_id))
            if deps.jobs is not None:
                # The worker runs jobs in its own context: hand the request's over.
                deps.jobs.submit(_job_in_request_context(
                    functools.partial(audit_order, deps, order_id)))
            return shop.Response(201, {"order_id": str(order_id)})
        except Exception as exc:
            return _failed(span, exc, 502)


# -- WSGI plumbing (given) ------------------------------------------------------------------------

def request_headers(environ: Mapping[str, Any]) -> dict[str, str]:
    """The request's headers, names in lower case (`traceparent`, `tracestate`, ...)."""
    headers = {key[5:].replace("_", "-").lower(): str(value)
               for key, value in environ.items() if key.startswith("HTTP_")}
    for key in ("CONTENT_TYPE", "CONTENT_LENGTH"):
        if environ.get(key):
            headers[key.replace("_", "-").lower()] = str(environ[key])
    return headers


def create_app(deps: shop.Deps) -> Callable[..., Iterable[bytes]]:
    """The WSGI application: POST /orders → handle_order; anything else 404."""

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        length = int(environ.get("CONTENT_LENGTH") or 0)
        body = environ["wsgi.input"].read(length) if length else b""
        if environ.get("REQUEST_METHOD") == "POST" and environ.get("PATH_INFO") == "/orders":
            response = handle_order(deps, request_headers(environ), body)
        else:
            response = shop.Response(404, {"error": "not found"})
        payload = json.dumps(response.body).encode()
        start_response(f"{response.status} {_REASONS.get(response.status, 'Status')}",
                       [("Content-Type", "application/json"),
                        ("Content-Length", str(len(payload)))])
        return [payload]

    return app


_REASONS = {200: "OK", 201: "Created", 400: "Bad Request", 404: "Not Found",
            500: "Internal Server Error", 502: "Bad Gateway"}

