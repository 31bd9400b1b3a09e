"""The consumer (another service in real life): applies each order event to customer_stats
exactly once in effect, however many times Kafka delivers it.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicPartition
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
    """Apply one record once: marker and effect in one READ COMMITTED transaction."""
    event_id = None
    event_type = ""
    for name, value in record.headers() or []:
        if name == EVENT_ID_HEADER and value is not None:
            event_id = uuid.UUID(bytes(value).decode("ascii"))
        elif name == EVENT_TYPE_HEADER and value is not None:
            event_type = bytes(value).decode("utf-8")
    if event_id is None:
        raise ValueError(f"no {EVENT_ID_HEADER} header at {record.topic()}/"
                         f"{record.partition()}@{record.offset()}")
    payload = json.loads(record.value())

    with engine.begin() as conn:
        inserted = conn.execute(
            text("INSERT INTO processed_event (event_id) VALUES (:id) "
                 "ON CONFLICT (event_id) DO NOTHING RETURNING event_id"),
            {"id": event_id},
        ).scalar_one_or_none()
        if inserted is None:
            return False
        effect(conn, event_type, payload)
        return True


def consume(engine: Engine, consumer: Any, *, max_records: int, timeout_seconds: float = 10.0,
            effect: Effect = apply_effect) -> int:
    """consumer.consume() in batches of one; commit each offset after its transaction."""
    handled = 0
    deadline = time.monotonic() + timeout_seconds
    while handled < max_records and time.monotonic() < deadline:
        batch = consumer.consume(num_messages=1,
                                 timeout=max(0.0, min(0.25, deadline - time.monotonic())))
        for record in batch:
            error = record.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    continue
                raise KafkaException(error)
            try:
                handle_record(engine, record, effect=effect)
            except BaseException:
                # the position is already past it: move back, so the next consume() on
                # this consumer reads it again instead of skipping it
                with contextlib.suppress(KafkaException):
                    consumer.seek(TopicPartition(record.topic(), record.partition(),
                                                 record.offset()))
                raise
            consumer.commit(message=record, asynchronous=False)
            handled += 1
    return handled
