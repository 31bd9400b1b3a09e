"""The order API: POST /orders, served on threads (WSGI) or on asyncio.

The flow works, but nothing in it is traced yet: no span, no trace id in the logs, no
traceparent on any hop. Each TO DO says which stage of the README adds what.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import shop

log = logging.getLogger("orders.api")


# -- the hops a request makes ------------------------------------------------------------------

def reserve_stock(deps: shop.Deps, order_id: uuid.UUID, order: shop.Order) -> dict[str, Any]:
    """Reserve the order's stock at the inventory service.

    TO DO (stage 8): a CLIENT span "reserve stock" around the call, and its traceparent in
    the request headers.
    """
    return shop.post_json(f"{deps.inventory_url}/reservations",
                          {"order_id": str(order_id), "sku": order.sku,
                           "quantity": order.quantity},
                          {})


def publish_order(deps: shop.Deps, order_id: uuid.UUID, order: shop.Order) -> None:
    """Send the `order placed` record and wait for the broker's acknowledgement.

    TO DO (stage 5): a PRODUCER span "publish order" around the send, and its traceparent
    (and tracestate) in the record's headers.
    """
    failures: list[str] = []

    def on_delivery(err: Any, msg: Any) -> None:
        if err is not None:
            failures.append(str(err))

    deps.producer.produce(deps.topic, key=str(order_id).encode(),
                          value=shop.order_event(order_id, order), on_delivery=on_delivery)
    if deps.producer.flush(10) or failures:
        raise shop.DownstreamError(f"order event not acknowledged: {failures or 'timeout'}")


def send_confirmation(deps: shop.Deps, order_id: uuid.UUID) -> None:
    """Runs on the thread pool: (pretend to) mail the customer.

    TO DO (stage 4): a span "send confirmation" in the request's trace.
    """
    log.info("confirmation sent", extra={"order_id": str(order_id)})


async def audit_order(deps: shop.Deps, order_id: uuid.UUID) -> None:
    """Runs as a background job after the response.

    TO DO (stage 4): a span "audit order" in the request's trace (the jobs worker has a
    context of its own: hand the request's over).
    """
    await asyncio.sleep(0.01)
    log.info("order audited", extra={"order_id": str(order_id)})


# -- the handlers -------------------------------------------------------------------------------

def handle_order(deps: shop.Deps, headers: Mapping[str, str], body: bytes) -> shop.Response:
    """POST /orders on a server thread.

    TO DO (stage 2): run it all in a SERVER span "POST /orders", a child of the caller's
    traceparent when a valid one came. (Stage 4: the confirmation keeps the context.
    Stage 7: a failure is recorded on the span, logged once in it, and answered with the
    trace id.)
    """
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
        deps.executor.submit(send_confirmation, deps, order_id)
        return shop.Response(201, {"order_id": str(order_id)})
    except Exception as exc:
        log.exception("order failed")
        return shop.Response(502, {"error": str(exc)})


async def handle_order_async(deps: shop.Deps, headers: Mapping[str, str],
                             body: bytes) -> shop.Response:
    """POST /orders on an event loop: the same flow, the blocking steps in threads.

    TO DO (stage 3): write it like handle_order, in a SERVER span, with
    `await asyncio.to_thread(...)` for the database, the inventory call and the Kafka send.
    (Stage 4: hand the confirmation to deps.executor and, after the response, submit the
    audit to deps.jobs, both in the request's trace.)
    """
    raise NotImplementedError(
        "handle_order_async: handle_order's flow in a SERVER span, blocking steps through "
        "asyncio.to_thread (README, stage 3)")


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
