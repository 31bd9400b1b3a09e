"""The order service. Every change to an order and the event that announces it are written in
one local transaction: both rows commit together or neither does. Nothing here talks to Kafka.
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


def place_order(engine: Engine, customer_id: UUID, total_cents: int) -> UUID:
    """Create an order (version 1) and its `order.placed.v1` event in one transaction.

    Args:
        engine: the order service's database.
        customer_id: who placed it.
        total_cents: the order total.

    Returns:
        The new order's id, assigned here (not by the database).
    """
    order_id = uuid.uuid4()
    with engine.begin() as conn:
        conn.execute(
            text("INSERT INTO orders (id, customer_id, total_cents, version) "
                 "VALUES (:id, :customer_id, :total_cents, 1)"),
            {"id": order_id, "customer_id": customer_id, "total_cents": total_cents},
        )
        _append_event(conn, order_id, 1, ORDER_PLACED, {
            "order_id": str(order_id),
            "customer_id": str(customer_id),
            "total_cents": total_cents,
        })
    return order_id


def change_order_total(engine: Engine, order_id: UUID, total_cents: int) -> int:
    """Change an order's total, bump its version, and write `order.total-changed.v1`.

    Returns:
        The order's new version.

    Raises:
        LookupError: there is no such order.
    """
    with engine.begin() as conn:
        # PostgreSQL 18: one UPDATE takes the row lock (re-reading the latest committed row
        # under READ COMMITTED) and returns the row as it was before and after the change.
        row = conn.execute(
            text("UPDATE orders SET total_cents = :total_cents, version = version + 1, "
                 "updated_at = now() WHERE id = :id "
                 "RETURNING old.total_cents AS previous_total, new.version AS version, "
                 "new.customer_id AS customer_id"),
            {"id": order_id, "total_cents": total_cents},
        ).one_or_none()
        if row is None:
            raise LookupError(f"no order {order_id}")
        version = row.version
        _append_event(conn, order_id, version, ORDER_TOTAL_CHANGED, {
            "order_id": str(order_id),
            "customer_id": str(row.customer_id),
            "total_cents": total_cents,
            "previous_total_cents": row.previous_total,
        })
    return version


def _append_event(conn: Connection, order_id: UUID, version: int, event_type: str,
                  payload: dict[str, Any]) -> None:
    conn.execute(
        text("INSERT INTO outbox_event (id, aggregate_type, aggregate_id, event_type, "
             "aggregate_version, payload, headers) VALUES (:id, :aggregate_type, "
             ":aggregate_id, :event_type, :version, CAST(:payload AS jsonb), "
             "CAST(:headers AS jsonb))"),
        {"id": uuid.uuid4(), "aggregate_type": AGGREGATE_TYPE, "aggregate_id": order_id,
         "event_type": event_type, "version": version, "payload": json.dumps(payload),
         "headers": json.dumps(EVENT_HEADERS)},
    )
