"""The order service, with optimistic concurrency: read the order, then update it only if its
version is still the one read; a lost race retries the whole transaction. The order row and its
event still commit in one local transaction.
"""

from __future__ import annotations

import json
import uuid
from typing import Any
from uuid import UUID

from sqlalchemy import Connection, Engine, text

AGGREGATE_TYPE = "order"
ORDER_PLACED = "order.placed.v1"
ORDER_TOTAL_CHANGED = "order.total-changed.v1"
EVENT_HEADERS = {"content-type": "application/json"}
MAX_RETRIES = 50


def place_order(engine: Engine, customer_id: UUID, total_cents: int) -> UUID:
    order_id = uuid.uuid4()
    payload = {"order_id": str(order_id), "customer_id": str(customer_id),
               "total_cents": total_cents}
    with engine.begin() as conn:
        # The event first: it can name the order because the id is ours. Both or neither.
        _append_event(conn, order_id, 1, ORDER_PLACED, payload)
        conn.execute(
            text("INSERT INTO orders (id, customer_id, total_cents, version) "
                 "VALUES (:id, :customer_id, :total_cents, 1)"),
            {"id": order_id, "customer_id": customer_id, "total_cents": total_cents},
        )
    return order_id


def change_order_total(engine: Engine, order_id: UUID, total_cents: int) -> int:
    for _ in range(MAX_RETRIES):
        with engine.begin() as conn:
            current = conn.execute(
                text("SELECT customer_id, total_cents, version FROM orders WHERE id = :id"),
                {"id": order_id},
            ).one_or_none()
            if current is None:
                raise LookupError(f"no order {order_id}")
            # Compare-and-set on the version. At READ COMMITTED a concurrent writer makes this
            # wait for its commit and then re-check the WHERE: 0 rows means we lost the race.
            new_version = conn.execute(
                text("UPDATE orders SET total_cents = :total_cents, version = version + 1, "
                     "updated_at = clock_timestamp() "
                     "WHERE id = :id AND version = :seen RETURNING version"),
                {"id": order_id, "total_cents": total_cents, "seen": current.version},
            ).scalar_one_or_none()
            if new_version is None:
                continue  # nothing was written: leaving the block commits an empty transaction
            _append_event(conn, order_id, new_version, ORDER_TOTAL_CHANGED, {
                "order_id": str(order_id),
                "customer_id": str(current.customer_id),
                "total_cents": total_cents,
                "previous_total_cents": current.total_cents,
            })
            return int(new_version)
    raise RuntimeError(f"order {order_id}: too much contention, gave up")


def _append_event(conn: Connection, order_id: UUID, version: int, event_type: str,
                  payload: dict[str, Any]) -> None:
    conn.execute(
        text("INSERT INTO outbox_event (id, aggregate_type, aggregate_id, event_type, "
             "aggregate_version, payload, headers) VALUES (:id, :aggregate_type, "
             ":aggregate_id, :event_type, :version, CAST(:payload AS jsonb), "
             "CAST(:headers AS jsonb))"),
        {"id": uuid.uuid4(), "aggregate_type": AGGREGATE_TYPE, "aggregate_id": str(order_id),
         "event_type": event_type, "version": version, "payload": json.dumps(payload),
         "headers": json.dumps(EVENT_HEADERS)},
    )
