"""The relay with set-based SQL: the claim is an UPDATE over ARRAY(SELECT … FOR UPDATE SKIP
LOCKED); after the flush, all acknowledged rows are marked by one UPDATE and all failed rows
backed off by one UPDATE over unnest() — both in one short transaction.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from confluent_kafka import KafkaError, KafkaException
from sqlalchemy import Engine, text

EVENT_ID_HEADER = "event-id"
EVENT_TYPE_HEADER = "event-type"


@dataclass(frozen=True)
class ClaimedEvent:
    """One outbox row a relay has leased and must now send."""

    id: UUID
    aggregate_type: str
    aggregate_id: str
    event_type: str
    aggregate_version: int
    payload: Any
    headers: dict[str, Any] = field(default_factory=dict)
    attempt_count: int = 1


def producer_config(base: dict[str, Any]) -> dict[str, Any]:
    """A copy of `base` with the two settings that make an acknowledgement durable and
    librdkafka's own retries duplicate-free (acks -1 is librdkafka's spelling of "all")."""
    config = dict(base)
    config["acks"] = -1
    config["enable.idempotence"] = True
    return config


CLAIM_SQL = text("""
UPDATE outbox_event
SET lease_until = clock_timestamp() + make_interval(secs => :lease_seconds),
    attempt_count = attempt_count + 1
WHERE id = ANY(ARRAY(
    SELECT id FROM outbox_event
    WHERE published_at IS NULL
      AND (lease_until IS NULL OR lease_until < clock_timestamp())
      AND (next_attempt_at IS NULL OR next_attempt_at <= clock_timestamp())
    ORDER BY created_at
    LIMIT :batch_size
    FOR UPDATE SKIP LOCKED))
RETURNING id, aggregate_type, aggregate_id, event_type, aggregate_version, payload, headers,
          attempt_count, created_at
""")

MARK_SQL = text("""
UPDATE outbox_event
SET published_at = clock_timestamp(), lease_until = NULL
WHERE id = ANY(CAST(:ids AS uuid[])) AND published_at IS NULL
""")

BACKOFF_SQL = text("""
UPDATE outbox_event AS e
SET lease_until = NULL,
    last_error = f.error,
    next_attempt_at = clock_timestamp() + make_interval(secs => f.delay)
FROM unnest(CAST(:ids AS uuid[]), CAST(:errors AS text[]), CAST(:delays AS float8[]),
            CAST(:attempts AS integer[]))
     AS f(id, error, delay, attempts)
WHERE e.id = f.id AND e.published_at IS NULL AND e.attempt_count = f.attempts
""")


def claim_batch(engine: Engine, *, batch_size: int, lease_seconds: float) -> list[ClaimedEvent]:
    """Lease up to `batch_size` due rows in one statement; returned oldest first."""
    with engine.begin() as conn:
        rows = sorted(conn.execute(CLAIM_SQL, {"batch_size": batch_size,
                                               "lease_seconds": lease_seconds}),
                      key=lambda row: row.created_at)
    return [ClaimedEvent(id=row.id, aggregate_type=row.aggregate_type,
                         aggregate_id=str(row.aggregate_id), event_type=row.event_type,
                         aggregate_version=row.aggregate_version, payload=row.payload,
                         headers=row.headers or {}, attempt_count=row.attempt_count)
            for row in rows]


def backoff_seconds(attempt_count: int, base: float, maximum: float) -> float:
    """base·2^(n−1) for the n-th failed attempt, capped; ldexp keeps it exact and cheap."""
    exponent = min(max(attempt_count - 1, 0), 64)
    return min(maximum, math.ldexp(base, exponent))


def publish_claimed(engine: Engine, producer: Any, topic: str, events: Sequence[ClaimedEvent],
                    *, ack_timeout_seconds: float = 30.0, backoff_base_seconds: float = 1.0,
                    backoff_max_seconds: float = 300.0) -> int:
    """Send the batch, wait up to `ack_timeout_seconds` for its delivery reports, then mark
    and back off in one short transaction. Returns how many the broker acknowledged."""
    reports: dict[UUID, KafkaError | None] = {}
    refused: dict[UUID, str] = {}
    for event in events:
        try:
            producer.produce(
                topic, json.dumps(event.payload).encode(), event.aggregate_id.encode(),
                headers=[(EVENT_ID_HEADER, str(event.id)),
                         (EVENT_TYPE_HEADER, event.event_type),
                         *((name, value if isinstance(value, str) else json.dumps(value))
                           for name, value in event.headers.items())],
                callback=lambda err, msg, event_id=event.id: reports.__setitem__(event_id, err),
            )
        except (KafkaException, BufferError) as exc:
            refused[event.id] = repr(exc)

    producer.flush(ack_timeout_seconds)
    snapshot = dict(reports)

    acknowledged = [event.id for event in events
                    if event.id in snapshot and snapshot[event.id] is None]
    failed = [event for event in events if event.id not in acknowledged]
    with engine.begin() as conn:
        if acknowledged:
            conn.execute(MARK_SQL, {"ids": acknowledged})
        if failed:
            conn.execute(BACKOFF_SQL, {
                "ids": [event.id for event in failed],
                "attempts": [event.attempt_count for event in failed],
                "errors": [(refused.get(event.id) or
                            (str(snapshot[event.id]) if event.id in snapshot else
                             f"no acknowledgement after {ack_timeout_seconds} s"))[:2000]
                           for event in failed],
                "delays": [backoff_seconds(event.attempt_count, backoff_base_seconds,
                                           backoff_max_seconds) for event in failed],
            })
    return len(acknowledged)


def relay_once(engine: Engine, producer: Any, topic: str, *, batch_size: int = 100,
               lease_seconds: float = 30.0, ack_timeout_seconds: float = 30.0,
               backoff_base_seconds: float = 1.0, backoff_max_seconds: float = 300.0) -> int:
    """One relay pass: claim a batch, publish it, mark it. Returns how many were published."""
    events = claim_batch(engine, batch_size=batch_size, lease_seconds=lease_seconds)
    if not events:
        return 0
    return publish_claimed(engine, producer, topic, events,
                           ack_timeout_seconds=ack_timeout_seconds,
                           backoff_base_seconds=backoff_base_seconds,
                           backoff_max_seconds=backoff_max_seconds)
