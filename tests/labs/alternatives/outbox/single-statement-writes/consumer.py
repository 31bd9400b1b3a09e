"""The consumer (another service in real life): applies each order event to customer_stats
exactly once in effect, however many times Kafka delivers it.
"""

from __future__ import annotations

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


_MARK = text("""
INSERT INTO processed_event (event_id, event_type)
SELECT :event_id, :event_type
ON CONFLICT ON CONSTRAINT processed_event_pkey DO NOTHING
RETURNING true
""")


def handle_record(engine: Engine, record: Any, *, effect: Effect = apply_effect) -> bool:
    """Apply one record's effect at most once: marker and effect in one transaction; the
    marker insert returns a row only for the first delivery (a concurrent twin blocks on the
    primary key until the first commits, then inserts nothing).

    Returns True when the effect was applied now, False for a duplicate.
    """
    event_id = event_type = None
    for name, value in record.headers() or []:
        if name == EVENT_ID_HEADER:
            event_id = uuid.UUID(value.decode())
        elif name == EVENT_TYPE_HEADER:
            event_type = value.decode()
    if event_id is None:
        raise ValueError(f"record at offset {record.offset()} has no {EVENT_ID_HEADER} header")
    payload = json.loads(record.value())

    with engine.begin() as conn:
        if not conn.execute(_MARK, {"event_id": event_id, "event_type": event_type}).first():
            return False
        effect(conn, event_type or "", payload)
    return True


def consume(engine: Engine, consumer: Any, *, max_records: int, timeout_seconds: float = 10.0,
            effect: Effect = apply_effect) -> int:
    """Fetch records in small batches (consumer.consume) and handle them one by one, committing
    each record's offset after its transaction committed. On a failure, the consumer is rewound
    to the first unhandled record of each partition in the batch (so this consumer, too, will
    see them again), and the exception propagates.

    Returns how many records were handled (duplicates included).
    """
    handled = 0
    deadline = time.monotonic() + timeout_seconds
    while handled < max_records:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        batch = consumer.consume(num_messages=min(50, max_records - handled),
                                 timeout=min(0.25, remaining))
        for index, record in enumerate(batch):
            error = record.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    continue
                _rewind(consumer, batch[index:])
                raise KafkaException(error)
            try:
                handle_record(engine, record, effect=effect)
            except BaseException:
                _rewind(consumer, batch[index:])
                raise
            consumer.commit(message=record, asynchronous=False)
            handled += 1
    return handled


def _rewind(consumer: Any, unhandled: list[Any]) -> None:
    first: dict[tuple[str, int], int] = {}
    for record in unhandled:
        if record.error() is None:
            key = (record.topic(), record.partition())
            first[key] = min(first.get(key, record.offset()), record.offset())
    for (topic, partition), offset in first.items():
        try:
            consumer.seek(TopicPartition(topic, partition, offset))
        except KafkaException:
            pass  # the partition was revoked meanwhile: its new owner starts at the commit
