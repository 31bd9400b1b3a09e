"""Given: the order service's business steps, without any tracing. Nothing to write here.

The lab is about carrying one trace through these steps; the steps themselves are done. Read
them to know what runs where (which thread, which connection), then leave them as they are:
the checks call your code, and your code calls these.
"""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
import uuid
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any

from opentelemetry.trace import Tracer
from sqlalchemy import Engine, text


class BadRequest(ValueError):
    """The request body is not an order (answered 400: the caller's mistake, not an error of
    the service)."""


class DownstreamError(RuntimeError):
    """A call to another service failed (its cause says how)."""


class ShipmentError(RuntimeError):
    """The consumer could not record a shipment (its cause says why)."""


@dataclass(frozen=True)
class Order:
    customer_id: uuid.UUID
    sku: str
    quantity: int
    total_cents: int


@dataclass(frozen=True)
class Response:
    """What a handler answers: an HTTP status and a JSON body."""

    status: int
    body: dict[str, Any]


class BackgroundJobs:
    """A long-lived asyncio worker that runs jobs one after another, after the request that
    submitted them has been answered.

    Like any worker started once at start-up, it runs every job in its own context (the one it
    was started in): a job carries nothing of the request that submitted it unless you hand it
    over yourself.
    """

    def __init__(self) -> None:
        self._queue: asyncio.Queue[Callable[[], Awaitable[None]]] | None = None
        self._worker: asyncio.Task[None] | None = None
        self.failures: list[BaseException] = []

    def start(self) -> None:
        """Start the worker on the running event loop."""
        self._queue = asyncio.Queue()
        self._worker = asyncio.get_running_loop().create_task(self._run())

    def submit(self, job: Callable[[], Awaitable[None]]) -> None:
        """Queue `job` (an async function taking no arguments); the worker awaits it later."""
        if self._queue is None:
            raise RuntimeError("BackgroundJobs.start() was not called")
        self._queue.put_nowait(job)

    async def drain(self) -> None:
        """Wait until every job submitted so far has run."""
        if self._queue is not None:
            await self._queue.join()

    async def stop(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
            await asyncio.gather(self._worker, return_exceptions=True)

    async def _run(self) -> None:
        assert self._queue is not None
        while True:
            job = await self._queue.get()
            try:
                await job()
            except Exception as exc:  # a failed job must not stop the worker
                self.failures.append(exc)
            finally:
                self._queue.task_done()


@dataclass
class Deps:
    """Everything the service talks to, handed in by whoever starts it (the checks do)."""

    engine: Engine                 # PostgreSQL (orders, shipments)
    producer: Any                  # a confluent_kafka.Producer
    topic: str                     # where order events go
    tracer: Tracer                 # every span comes from this tracer
    executor: Executor             # a thread pool for work the request hands off
    inventory_url: str             # the inventory service, http://127.0.0.1:PORT
    dlt_topic: str = ""            # where the consumer dead-letters what it cannot process
    jobs: BackgroundJobs | None = None  # background jobs (the asyncio handler)


def parse_order(body: bytes) -> Order:
    """The order in a request body: {"customer_id", "sku", "quantity", "total_cents"}."""
    try:
        data = json.loads(body or b"{}")
        order = Order(uuid.UUID(str(data["customer_id"])), str(data["sku"]),
                      int(data["quantity"]), int(data["total_cents"]))
    except (ValueError, KeyError, TypeError) as exc:
        raise BadRequest(f"not an order: {exc}") from exc
    if order.quantity <= 0 or order.total_cents < 0:
        raise BadRequest("quantity must be positive and total_cents not negative")
    return order


def insert_order(engine: Engine, order: Order) -> uuid.UUID:
    """Store the order (one short transaction, committed); returns its new id."""
    order_id = uuid.uuid4()
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO orders (id, customer_id, sku, quantity, total_cents) "
                          "VALUES (:id, :customer_id, :sku, :quantity, :total_cents)"),
                     {"id": order_id, "customer_id": order.customer_id, "sku": order.sku,
                      "quantity": order.quantity, "total_cents": order.total_cents})
    return order_id


def post_json(url: str, payload: Mapping[str, Any], headers: Mapping[str, str],
              timeout: float = 10.0) -> dict[str, Any]:
    """POST `payload` as JSON with `headers` (and a JSON content type); the JSON answer.

    Raises:
        DownstreamError: the service answered with an error status or could not be reached;
            the urllib error is its cause.
    """
    request = urllib.request.Request(
        url, data=json.dumps(payload).encode(), method="POST",
        headers={"Content-Type": "application/json", **headers})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            body = answer.read()
    except (urllib.error.URLError, TimeoutError) as exc:
        raise DownstreamError(f"POST {url} failed") from exc
    return dict(json.loads(body or b"{}"))


def order_event(order_id: uuid.UUID, order: Order) -> bytes:
    """The value of the `order placed` Kafka record."""
    return json.dumps({"order_id": str(order_id), "customer_id": str(order.customer_id),
                       "sku": order.sku, "quantity": order.quantity,
                       "total_cents": order.total_cents}).encode()


def ship_order(engine: Engine, value: bytes | None) -> uuid.UUID:
    """Record the shipment of the order in an `order placed` record value; returns its id.

    Raises:
        ShipmentError: the value is not an order event, or the database refused the row (the
            database error is its cause).
    """
    try:
        event = json.loads(value or b"")
        order_id = uuid.UUID(str(event["order_id"]))
        with engine.begin() as conn:
            conn.execute(text("INSERT INTO shipments (order_id, sku, quantity) "
                              "VALUES (:order_id, :sku, :quantity) "
                              "ON CONFLICT (order_id) DO NOTHING"),
                         {"order_id": order_id, "sku": str(event["sku"]),
                          "quantity": int(event["quantity"])})
    except Exception as exc:
        raise ShipmentError("could not ship the order in this record") from exc
    return order_id
