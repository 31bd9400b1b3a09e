"""Order service, design C: one data-modifying WITH statement per operation."""

from __future__ import annotations

import json
import uuid
from uuid import UUID

from sqlalchemy import Engine, text

AGGREGATE_TYPE = "order"
ORDER_PLACED = "order.placed.v1"
ORDER_TOTAL_CHANGED = "order.total-changed.v1"

_PLACE = text("""
WITH new_order AS (
    INSERT INTO orders (id, customer_id, total_cents, version)
    VALUES (:order_id, :customer_id, :total, 1)
    RETURNING id, customer_id, total_cents, version
)
INSERT INTO outbox_event (id, aggregate_type, aggregate_id, event_type, aggregate_version,
                          payload)
SELECT :event_id, 'order', id, :event_type, version,
       jsonb_build_object('order_id', id::text, 'customer_id', customer_id::text,
                          'total_cents', total_cents)
FROM new_order
RETURNING aggregate_id
""")

# The lock (FOR UPDATE in `cur`) is taken first; under READ COMMITTED it returns the latest
# committed row, and the UPDATE and the event are derived from that locked row.
_CHANGE = text("""
WITH cur AS (
    SELECT id, customer_id, total_cents, version FROM orders WHERE id = :order_id FOR UPDATE
), upd AS (
    UPDATE orders o SET total_cents = :total, version = cur.version + 1, updated_at = now()
    FROM cur WHERE o.id = cur.id
    RETURNING o.id, o.version, o.total_cents
)
INSERT INTO outbox_event (id, aggregate_type, aggregate_id, event_type, aggregate_version,
                          payload)
SELECT :event_id, 'order', upd.id, :event_type, upd.version,
       jsonb_build_object('order_id', upd.id::text, 'customer_id', cur.customer_id::text,
                          'total_cents', upd.total_cents,
                          'previous_total_cents', cur.total_cents)
FROM upd JOIN cur ON cur.id = upd.id
RETURNING aggregate_version
""")


def place_order(engine: Engine, customer_id: UUID, total_cents: int) -> UUID:
    order_id = uuid.uuid4()
    with engine.begin() as conn:
        conn.execute(_PLACE, {"order_id": order_id, "customer_id": customer_id,
                              "total": total_cents, "event_id": uuid.uuid4(),
                              "event_type": ORDER_PLACED}).one()
    return order_id


def change_order_total(engine: Engine, order_id: UUID, total_cents: int) -> int:
    with engine.begin() as conn:
        version = conn.execute(_CHANGE, {"order_id": order_id, "total": total_cents,
                                         "event_id": uuid.uuid4(),
                                         "event_type": ORDER_TOTAL_CHANGED}).scalar()
        if version is None:
            raise LookupError(f"order {order_id} does not exist")
    return int(version)
