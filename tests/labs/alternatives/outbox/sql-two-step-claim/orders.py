"""Order service, design B: event row first, NO KEY UPDATE lock, version via RETURNING."""

from __future__ import annotations

import json
import uuid
from uuid import UUID

from sqlalchemy import Engine, text

AGGREGATE_TYPE = "order"
ORDER_PLACED = "order.placed.v1"
ORDER_TOTAL_CHANGED = "order.total-changed.v1"

_INSERT_EVENT = text(
    "INSERT INTO outbox_event (id, aggregate_type, aggregate_id, event_type, aggregate_version, "
    "payload) VALUES (:id, 'order', :agg, :type, :version, CAST(:payload AS jsonb))")


def place_order(engine: Engine, customer_id: UUID, total_cents: int) -> UUID:
    order_id = uuid.uuid4()
    payload = {"order_id": str(order_id), "customer_id": str(customer_id),
               "total_cents": total_cents}
    with engine.connect() as conn:
        with conn.begin():
            conn.execute(_INSERT_EVENT, {"id": uuid.uuid4(), "agg": str(order_id),
                                         "type": ORDER_PLACED, "version": 1,
                                         "payload": json.dumps(payload)})
            conn.execute(text("INSERT INTO orders (id, customer_id, total_cents, version) "
                              "VALUES (:id, :c, :t, 1)"),
                         {"id": order_id, "c": customer_id, "t": total_cents})
    return order_id


def change_order_total(engine: Engine, order_id: UUID, total_cents: int) -> int:
    with engine.connect() as conn:
        with conn.begin():
            row = conn.execute(text("SELECT customer_id, total_cents FROM orders "
                                    "WHERE id = :id FOR NO KEY UPDATE"),
                               {"id": order_id}).first()
            if row is None:
                raise KeyError(order_id)
            version = conn.execute(
                text("UPDATE orders SET total_cents = :t, version = version + 1, "
                     "updated_at = clock_timestamp() WHERE id = :id RETURNING version"),
                {"id": order_id, "t": total_cents}).scalar_one()
            payload = {"order_id": str(order_id), "customer_id": str(row.customer_id),
                       "total_cents": total_cents, "previous_total_cents": row.total_cents}
            conn.execute(_INSERT_EVENT, {"id": uuid.uuid4(), "agg": str(order_id),
                                         "type": ORDER_TOTAL_CHANGED, "version": version,
                                         "payload": json.dumps(payload)})
    return version
