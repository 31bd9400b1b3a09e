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
from sqlalchemy import Column, Connection, DateTime, Engine, MetaData, Table, Uuid, text
from sqlalchemy.dialects.postgresql import insert

EVENT_ID_HEADER = "event-id"
EVENT_TYPE_HEADER = "event-type"

Effect = Callable[[Connection, str, dict[str, Any]], None]

_processed = Table(
    "processed_event", MetaData(),
    Column("event_id", Uuid, primary_key=True),
    Column("processed_at", DateTime(timezone=True)),
)


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


def _header(record: Any, name: str) -> bytes | None:
    for key, value in record.headers() or []:
        if key == name:
            return value
    return None


def handle_record(engine: Engine, record: Any, *, effect: Effect = apply_effect) -> bool:
    """Apply one record at most once in effect. The marker (processed_event) and the effect
    share one transaction; the marker insert uses ON CONFLICT DO NOTHING RETURNING, so of two
    concurrent twins exactly one gets a row back (the other waits for it, then gets none).

    Returns True when the effect was applied now, False for a duplicate. Raises ValueError
    without an `event-id` header, and whatever `effect` raises (nothing is recorded then).
    """
    raw_id = _header(record, EVENT_ID_HEADER)
    if raw_id is None:
        raise ValueError(f"record {record.topic()}[{record.partition()}]@{record.offset()} "
                         f"has no {EVENT_ID_HEADER} header")
    event_id = uuid.UUID(raw_id.decode("utf-8"))
    event_type = (_header(record, EVENT_TYPE_HEADER) or b"").decode("utf-8")
    payload = json.loads(record.value())

    claim_marker = (insert(_processed).values(event_id=event_id)
                    .on_conflict_do_nothing(index_elements=[_processed.c.event_id])
                    .returning(_processed.c.event_id))
    with engine.begin() as conn:
        if conn.execute(claim_marker).first() is None:
            return False
        effect(conn, event_type, payload)
    return True


def consume(engine: Engine, consumer: Any, *, max_records: int, timeout_seconds: float = 10.0,
            effect: Effect = apply_effect) -> int:
    """Poll and handle records one at a time; each offset is committed synchronously after its
    record's transaction committed. Stops after `max_records` records (duplicates count) or
    `timeout_seconds`; a failing record stops it (offset not committed) and re-raises."""
    deadline = time.monotonic() + timeout_seconds
    handled = 0
    while handled < max_records and (remaining := deadline - time.monotonic()) > 0:
        record = consumer.poll(min(0.25, remaining))
        if record is None:
            continue
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
