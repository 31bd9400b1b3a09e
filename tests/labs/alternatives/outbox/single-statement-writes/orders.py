"""The order service. Each business change and its event are written by ONE SQL statement (a
data-modifying CTE): the order row and the outbox row commit together or not at all, and there
is no window between two statements at all. The payload is built in SQL with
jsonb_build_object.
"""

from __future__ import annotations

import uuid
from uuid import UUID

from sqlalchemy import Engine, text

AGGREGATE_TYPE = "order"
ORDER_PLACED = "order.placed.v1"
ORDER_TOTAL_CHANGED = "order.total-changed.v1"

_PLACE = text("""
WITH new_order AS (
    INSERT INTO orders (id, customer_id, total_cents, version)
    VALUES (:order_id, :customer_id, :total_cents, 1)
    RETURNING id, customer_id, total_cents, version
)
INSERT INTO outbox_event (id, aggregate_type, aggregate_id, event_type, aggregate_version,
                          payload)
SELECT :event_id, :aggregate_type, id, :event_type, version,
       jsonb_build_object('order_id', id::text, 'customer_id', customer_id::text,
                          'total_cents', total_cents)
FROM new_order
""")

_CHANGE = text("""
WITH before AS (
    SELECT id, customer_id, total_cents, version FROM orders WHERE id = :order_id FOR UPDATE
), changed AS (
    UPDATE orders AS o
    SET total_cents = :total_cents, version = before.version + 1, updated_at = now()
    FROM before
    WHERE o.id = before.id
    RETURNING o.id, o.customer_id, o.total_cents, o.version, before.total_cents AS previous
)
INSERT INTO outbox_event (id, aggregate_type, aggregate_id, event_type, aggregate_version,
                          payload)
SELECT :event_id, :aggregate_type, id, :event_type, version,
       jsonb_build_object('order_id', id::text, 'customer_id', customer_id::text,
                          'total_cents', total_cents, 'previous_total_cents', previous)
FROM changed
RETURNING aggregate_version
""")


def place_order(engine: Engine, customer_id: UUID, total_cents: int) -> UUID:
    """Create an order (version 1) and its `order.placed.v1` event in one statement."""
    order_id = uuid.uuid4()
    with engine.begin() as conn:
        conn.execute(_PLACE, {"order_id": order_id, "customer_id": customer_id,
                              "total_cents": total_cents, "event_id": uuid.uuid4(),
                              "aggregate_type": AGGREGATE_TYPE, "event_type": ORDER_PLACED})
    return order_id


def change_order_total(engine: Engine, order_id: UUID, total_cents: int) -> int:
    """Change an order's total, bump its version and write `order.total-changed.v1`, in one
    statement. Raises LookupError when there is no such order."""
    with engine.begin() as conn:
        version = conn.execute(_CHANGE, {
            "order_id": order_id, "total_cents": total_cents, "event_id": uuid.uuid4(),
            "aggregate_type": AGGREGATE_TYPE, "event_type": ORDER_TOTAL_CHANGED,
        }).scalar_one_or_none()
    if version is None:
        raise LookupError(f"no order {order_id}")
    return version
