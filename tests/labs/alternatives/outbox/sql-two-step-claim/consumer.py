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


def _event_id(record: Any) -> uuid.UUID:
    for name, value in record.headers() or []:
        if name == EVENT_ID_HEADER and value is not None:
            return uuid.UUID(value.decode("utf-8") if isinstance(value, bytes) else value)
    raise ValueError("record without an event-id header")


def _header(record: Any, wanted: str) -> str:
    for name, value in record.headers() or []:
        if name == wanted and value is not None:
            return value.decode("utf-8") if isinstance(value, bytes) else value
    return ""


def handle_record(engine: Engine, record: Any, *, effect: Effect = apply_effect) -> bool:
    event_id = _event_id(record)
    event_type = _header(record, EVENT_TYPE_HEADER)
    payload = json.loads(record.value())
    with engine.connect() as conn:
        with conn.begin():
            inserted = conn.execute(
                text("INSERT INTO processed_event (event_id) VALUES (:id) "
                     "ON CONFLICT (event_id) DO NOTHING RETURNING event_id"),
                {"id": event_id}).first()
            if inserted is None:
                return False
            effect(conn, event_type, payload)
    return True


def consume(engine: Engine, consumer: Any, *, max_records: int, timeout_seconds: float = 10.0,
            effect: Effect = apply_effect) -> int:
    """Batch style: consume() at most the records still wanted; on a failure, rewind every
    partition to its first record not handled."""
    deadline = time.monotonic() + timeout_seconds
    handled = 0
    while handled < max_records:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        batch = consumer.consume(num_messages=max_records - handled, timeout=min(left, 0.25))
        for i, record in enumerate(batch):
            err = record.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    continue
                _rewind(consumer, batch[i + 1:], first=None)
                raise KafkaException(err)
            try:
                handle_record(engine, record, effect=effect)
            except BaseException:
                _rewind(consumer, batch[i:], first=record)
                raise
            consumer.commit(offsets=[TopicPartition(record.topic(), record.partition(),
                                                    record.offset() + 1)],
                            asynchronous=False)
            handled += 1
    return handled


def _rewind(consumer: Any, rest: list[Any], first: Any) -> None:
    seen: set[tuple[str, int]] = set()
    for record in rest:
        if record.error() is not None:
            continue
        tp = (record.topic(), record.partition())
        if tp in seen:
            continue
        seen.add(tp)
        with contextlib.suppress(KafkaException):
            consumer.seek(TopicPartition(record.topic(), record.partition(), record.offset()))
