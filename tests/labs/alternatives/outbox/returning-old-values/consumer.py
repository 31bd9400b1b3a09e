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
    """Apply one Kafka record once: the marker in processed_event and the effect commit in one
    transaction, so a duplicate finds the marker and a failed effect leaves none.

    Args:
        engine: the consumer's database.
        record: a confluent-kafka Message (headers `event-id`, `event-type`; JSON value).
        effect: what the event does, called as effect(conn, event_type, payload).

    Returns:
        True when the effect was applied now, False for a duplicate.

    Raises:
        Whatever `effect` raises (nothing is recorded then); ValueError for a record without
        an `event-id` header.
    """
    headers = {name: value for name, value in (record.headers() or [])}
    raw_id = headers.get(EVENT_ID_HEADER)
    if raw_id is None:
        raise ValueError(f"record at offset {record.offset()} has no {EVENT_ID_HEADER} header")
    event_id = uuid.UUID(raw_id.decode().strip())  # braces and urn:uuid: accepted too
    event_type = (headers.get(EVENT_TYPE_HEADER) or b"").decode()
    payload = json.loads(record.value())

    with engine.begin() as conn:
        first_time = conn.execute(
            text("INSERT INTO processed_event (event_id) VALUES (:event_id) "
                 "ON CONFLICT DO NOTHING"),
            {"event_id": event_id},
        ).rowcount
        if first_time == 0:
            return False  # already applied: a concurrent twin waited for our commit, then lost
        effect(conn, event_type, payload)
    return True


def consume(engine: Engine, consumer: Any, *, max_records: int, timeout_seconds: float = 10.0,
            effect: Effect = apply_effect) -> int:
    """Poll `consumer` (already subscribed or assigned) and handle records one by one,
    committing each record's offset only after its database transaction committed.

    Stops after `max_records` records or `timeout_seconds`. If handling a record raises, its
    offset is not committed, the consumer is moved back to it and the exception propagates:
    the record will be delivered again, by this consumer too.

    Returns:
        How many records were handled (duplicates included).
    """
    handled = 0
    deadline = time.monotonic() + timeout_seconds
    while handled < max_records:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        record = consumer.poll(min(0.2, remaining))
        if record is None:
            continue
        if record.error():
            if record.error().code() == KafkaError._PARTITION_EOF:
                continue
            raise KafkaException(record.error())
        try:
            handle_record(engine, record, effect=effect)
        except BaseException:
            # poll() has already moved the position past this record: without the seek, the
            # next consume() on this consumer would start after it and commit past it.
            with contextlib.suppress(KafkaException):  # (the partition was revoked meanwhile)
                consumer.seek(TopicPartition(record.topic(), record.partition(),
                                             record.offset()))
            raise
        consumer.commit(offsets=[TopicPartition(record.topic(), record.partition(),
                                                record.offset() + 1)], asynchronous=False)
        handled += 1
    return handled
