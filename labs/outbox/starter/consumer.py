"""The consumer (another service in real life): applies each order event to customer_stats
exactly once in effect, however many times Kafka delivers it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy import Connection, Engine, text

EVENT_ID_HEADER = "event-id"
EVENT_TYPE_HEADER = "event-type"

Effect = Callable[[Connection, str, dict[str, Any]], None]


def apply_effect(conn: Connection, event_type: str, payload: dict[str, Any]) -> None:
    """Given: the business effect of one event, on the caller's connection (its transaction).

    Deliberately not idempotent on its own — counters count every call — so a duplicate that
    gets through shows up in customer_stats.
    """
    if event_type == "order.placed.v1":
        conn.execute(
            text("INSERT INTO customer_stats (customer_id, orders_placed, total_cents) "
                 "VALUES (:customer_id, 1, :total) ON CONFLICT (customer_id) DO UPDATE SET "
                 "orders_placed = customer_stats.orders_placed + 1, "
                 "total_cents = customer_stats.total_cents + EXCLUDED.total_cents"),
            {"customer_id": payload["customer_id"], "total": payload["total_cents"]},
        )
    elif event_type == "order.total-changed.v1":
        conn.execute(
            text("INSERT INTO customer_stats (customer_id, total_cents) VALUES (:customer_id, "
                 ":delta) ON CONFLICT (customer_id) DO UPDATE SET "
                 "total_cents = customer_stats.total_cents + EXCLUDED.total_cents"),
            {"customer_id": payload["customer_id"],
             "delta": payload["total_cents"] - payload["previous_total_cents"]},
        )
    # Other event types are not this consumer's business: handled, no effect.


def handle_record(engine: Engine, record: Any, *, effect: Effect = apply_effect) -> bool:
    """Apply one Kafka record once.

    Args:
        engine: the consumer's database.
        record: a confluent-kafka Message: headers `event-id`, `event-type`; value = JSON.
        effect: what the event does, called as effect(conn, event_type, payload) on the
            connection of your transaction.

    Returns:
        True when the effect was applied now, False for a duplicate.

    Raises:
        Whatever `effect` raises; nothing may be recorded then.
    """
    raise NotImplementedError(
        "handle_record: take the event id from the `event-id` header; in one transaction "
        "INSERT INTO processed_event … ON CONFLICT DO NOTHING, and only if it inserted a row "
        "call effect(conn, event_type, payload)")


def consume(engine: Engine, consumer: Any, *, max_records: int, timeout_seconds: float = 10.0,
            effect: Effect = apply_effect) -> int:
    """Poll `consumer` (already subscribed or assigned; auto-commit off) and handle records one
    by one, committing each record's offset only after its database transaction committed.

    Stops after `max_records` records or `timeout_seconds`. If handling a record raises, its
    offset is not committed and the exception propagates.

    Returns:
        How many records were handled (duplicates included).
    """
    raise NotImplementedError(
        "consume: loop consumer.poll(0.2); for each record handle_record(...), then "
        "consumer.commit(message=record, asynchronous=False)")
