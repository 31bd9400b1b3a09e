"""The order service. Every change to an order and the event that announces it are written in
one local transaction: both rows commit together or neither does. Nothing here talks to Kafka.
"""

from __future__ import annotations

from uuid import UUID

from sqlalchemy import Engine

AGGREGATE_TYPE = "order"
ORDER_PLACED = "order.placed.v1"
ORDER_TOTAL_CHANGED = "order.total-changed.v1"


def place_order(engine: Engine, customer_id: UUID, total_cents: int) -> UUID:
    """Create an order (version 1) and its `order.placed.v1` event in one transaction.

    The outbox row: a new event id, aggregate_type "order", aggregate_id = the order id,
    aggregate_version 1, payload {"order_id", "customer_id", "total_cents"} (ids as text).

    Args:
        engine: the order service's database.
        customer_id: who placed it.
        total_cents: the order total.

    Returns:
        The new order's id, assigned here with uuid.uuid4() (not by the database).
    """
    raise NotImplementedError(
        "place_order: generate the order id, then in ONE `with engine.begin() as conn:` block "
        "INSERT INTO orders (version 1) and INSERT INTO outbox_event (order.placed.v1)")


def change_order_total(engine: Engine, order_id: UUID, total_cents: int) -> int:
    """Change an order's total, bump its version, and write `order.total-changed.v1` with
    payload {"order_id", "customer_id", "total_cents", "previous_total_cents"}, all in one
    transaction.

    Returns:
        The order's new version (2 after the first change, then 3, …).

    Raises:
        LookupError: there is no such order.
    """
    raise NotImplementedError(
        "change_order_total: in one transaction, lock the order (SELECT … FOR UPDATE), update "
        "total and version = version + 1, and insert the event with that version")
