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
from sqlalchemy.dialects.postgresql import insert as pg_insert

try:
    from .tables import processed_event
except ImportError:
    from tables import processed_event  # type: ignore[no-redef]

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
    headers = dict(record.headers() or [])
    if headers.get(EVENT_ID_HEADER) is None:
        raise ValueError("no event-id header: nothing to deduplicate on")
    event_id = uuid.UUID(bytes(headers[EVENT_ID_HEADER]).decode().strip())
    event_type = bytes(headers.get(EVENT_TYPE_HEADER) or b"").decode()
    payload = json.loads(record.value())
    marker = (pg_insert(processed_event).values(event_id=event_id)
              .on_conflict_do_nothing(index_elements=[processed_event.c.event_id])
              .returning(processed_event.c.event_id))
    with engine.begin() as conn:
        # (rowcount of a Core INSERT … ON CONFLICT is -1 under SQLAlchemy 2.1: use RETURNING)
        if conn.execute(marker).first() is None:
            return False
        effect(conn, event_type, payload)
    return True


def consume(engine: Engine, consumer: Any, *, max_records: int, timeout_seconds: float = 10.0,
            effect: Effect = apply_effect) -> int:
    started = time.monotonic()
    count = 0
    while count < max_records:
        left = timeout_seconds - (time.monotonic() - started)
        if left <= 0:
            return count
        got = consumer.consume(num_messages=1, timeout=min(left, 0.5))
        if not got:
            continue
        record = got[0]
        if record.error() is not None:
            if record.error().code() == KafkaError._PARTITION_EOF:
                continue
            raise KafkaException(record.error())
        try:
            handle_record(engine, record, effect=effect)
        except BaseException:
            tp = TopicPartition(record.topic(), record.partition(), record.offset())
            try:
                consumer.seek(tp)
            except KafkaException:
                pass
            raise
        consumer.commit(message=record, asynchronous=False)
        count += 1
    return count
