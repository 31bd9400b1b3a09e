"""The order service, written with SQLAlchemy Core expressions instead of SQL text. Every change
to an order and the event announcing it are written in one local transaction.
"""

from __future__ import annotations

import uuid
from typing import Any
from uuid import UUID

from sqlalchemy import (BigInteger, Column, Connection, DateTime, Engine, MetaData, Table, Text,
                        Uuid, func, insert, select, update)
from sqlalchemy.dialects.postgresql import JSONB

AGGREGATE_TYPE = "order"
ORDER_PLACED = "order.placed.v1"
ORDER_TOTAL_CHANGED = "order.total-changed.v1"
TRACE_HEADERS = {"content-type": "application/json", "producer": "order-service"}

_metadata = MetaData()
_orders = Table(
    "orders", _metadata,
    Column("id", Uuid, primary_key=True),
    Column("customer_id", Uuid, nullable=False),
    Column("total_cents", BigInteger, nullable=False),
    Column("version", BigInteger, nullable=False),
    Column("updated_at", DateTime(timezone=True)),
)
_outbox = Table(
    "outbox_event", _metadata,
    Column("id", Uuid, primary_key=True),
    Column("aggregate_type", Text),
    Column("aggregate_id", Text),
    Column("event_type", Text),
    Column("aggregate_version", BigInteger),
    Column("payload", JSONB),
    Column("headers", JSONB),
)


def place_order(engine: Engine, customer_id: UUID, total_cents: int) -> UUID:
    """Create an order (version 1) and its `order.placed.v1` event in one transaction."""
    order_id = uuid.uuid4()
    payload = {"order_id": str(order_id), "customer_id": str(customer_id),
               "total_cents": total_cents}
    with engine.begin() as conn:
        conn.execute(insert(_orders).values(id=order_id, customer_id=customer_id,
                                            total_cents=total_cents, version=1))
        _record(conn, order_id, 1, ORDER_PLACED, payload)
    return order_id


def change_order_total(engine: Engine, order_id: UUID, total_cents: int) -> int:
    """Change an order's total, bump its version, write `order.total-changed.v1`; one
    transaction. Raises LookupError when there is no such order."""
    with engine.begin() as conn:
        before = conn.execute(
            select(_orders.c.customer_id, _orders.c.total_cents)
            .where(_orders.c.id == order_id)
            .with_for_update()
        ).one_or_none()
        if before is None:
            raise LookupError(f"no order {order_id}")
        version = conn.execute(
            update(_orders)
            .where(_orders.c.id == order_id)
            .values(total_cents=total_cents, version=_orders.c.version + 1,
                    updated_at=func.now())
            .returning(_orders.c.version)
        ).scalar_one()
        _record(conn, order_id, version, ORDER_TOTAL_CHANGED, {
            "order_id": str(order_id),
            "customer_id": str(before.customer_id),
            "total_cents": total_cents,
            "previous_total_cents": before.total_cents,
        })
    return version


def _record(conn: Connection, order_id: UUID, version: int, event_type: str,
            payload: dict[str, Any]) -> None:
    conn.execute(insert(_outbox).values(
        id=uuid.uuid4(), aggregate_type=AGGREGATE_TYPE, aggregate_id=str(order_id),
        event_type=event_type, aggregate_version=version, payload=payload,
        headers=TRACE_HEADERS))
