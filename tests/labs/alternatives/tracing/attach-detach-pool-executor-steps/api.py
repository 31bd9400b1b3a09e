"""The order API: POST /orders, served on threads (WSGI) or on asyncio.

One request, one trace: the SERVER span continues the caller's traceparent, and every hop the
request makes (the inventory call, the Kafka record, the confirmation on the thread pool, the
audit job after the response) carries that trace onward.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import logging
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

import shop
import telemetry

log = logging.getLogger("orders.api")


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


async def audit_order(deps: shop.Deps, order_id: uuid.UUID, parent: Context) -> None:
    """Runs as a background job after the response, in the request's trace (`parent`)."""
    await asyncio.sleep(0.01)  # after the response, for real
    with deps.tracer.start_as_current_span("audit order", context=parent):
        log.info("order audited", extra={"order_id": str(order_id)})


def _in_context(ctx: Context, fn: Callable[..., Any]) -> Callable[..., Any]:
    """Run fn with ctx attached on whatever thread calls it, and take it off afterwards."""
    def run(*args: Any) -> Any:
        token = otel_context.attach(ctx)
        try:
            return fn(*args)
        finally:
            otel_context.detach(token)
    return run


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
            deps.executor.submit(_in_context(otel_context.get_current(), send_confirmation),
                                 deps, order_id)
            return shop.Response(201, {"order_id": str(order_id)})
        except Exception as exc:
            return _failed(span, exc, 502)


async def handle_order_async(deps: shop.Deps, headers: Mapping[str, str],
                             body: bytes) -> shop.Response:
    """POST /orders on an event loop: the blocking steps go to threads with
    asyncio.to_thread, which copies the context."""
    with telemetry.server_span(deps.tracer, "POST /orders", headers) as span:
        try:
            order = shop.parse_order(body)
        except shop.BadRequest as exc:
            log.info("order refused: %s", exc)
            return shop.Response(400, {"error": str(exc)})
        try:
            log.info("order received", extra={"customer_id": str(order.customer_id)})
            loop = asyncio.get_running_loop()
            order_id = await loop.run_in_executor(
                None, contextvars.copy_context().run, shop.insert_order, deps.engine, order)
            await loop.run_in_executor(None, contextvars.copy_context().run,
                                       reserve_stock, deps, order_id, order)
            await loop.run_in_executor(None, contextvars.copy_context().run,
                                       publish_order, deps, order_id, order)
            log.info("order placed", extra={"order_id": str(order_id)})
            # run_in_executor, unlike to_thread, does not copy the context: copy it here.
            deps.executor.submit(_in_context(otel_context.get_current(), send_confirmation),
                                 deps, order_id)
            if deps.jobs is not None:
                # The worker runs jobs in its own context: hand the request's over.
                parent = otel_context.get_current()
                deps.jobs.submit(lambda: audit_order(deps, order_id, parent))
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

