"""The relay, second design: the claim picks (SELECT … FOR UPDATE SKIP LOCKED) and leases
(UPDATE … WHERE id = ANY) in two statements of ONE short transaction, so the row locks of the
pick are held until the lease is written and the lease runs from the UPDATE's own clock.
Publishing polls the producer until every report is in or a deadline passes, then writes all
outcomes with two set-based statements in one short transaction.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from confluent_kafka import KafkaException
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
    """A copy of `base` with acks=all and idempotence on; nothing of `base` is touched."""
    config = dict(base)
    config["acks"] = "all"
    config["enable.idempotence"] = "true"
    return config


PICK_SQL = text("""
SELECT id FROM outbox_event
WHERE published_at IS NULL
  AND (lease_until IS NULL OR lease_until < clock_timestamp())
  AND (next_attempt_at IS NULL OR next_attempt_at <= clock_timestamp())
ORDER BY created_at
LIMIT :batch_size
FOR UPDATE SKIP LOCKED
""")

LEASE_SQL = text("""
UPDATE outbox_event
SET lease_until = clock_timestamp() + CAST(:lease_seconds AS double precision) * interval '1 second',
    attempt_count = attempt_count + 1
WHERE id = ANY(CAST(:ids AS uuid[]))
RETURNING id, aggregate_type, aggregate_id, event_type, aggregate_version, payload, headers,
          attempt_count, created_at
""")


def claim_batch(engine: Engine, *, batch_size: int, lease_seconds: float) -> list[ClaimedEvent]:
    """Lease up to `batch_size` of the oldest due rows; committed before it returns."""
    with engine.begin() as conn:
        ids = list(conn.execute(PICK_SQL, {"batch_size": batch_size}).scalars())
        if not ids:
            return []
        rows = conn.execute(LEASE_SQL, {"ids": ids,
                                        "lease_seconds": float(lease_seconds)}).all()
    rows = sorted(rows, key=lambda row: (row.created_at, str(row.id)))
    return [ClaimedEvent(id=row.id, aggregate_type=row.aggregate_type,
                         aggregate_id=str(row.aggregate_id), event_type=row.event_type,
                         aggregate_version=row.aggregate_version, payload=row.payload,
                         headers=dict(row.headers or {}), attempt_count=row.attempt_count)
            for row in rows]


def backoff_seconds(attempt_count: int, base: float, maximum: float) -> float:
    """base × 2^(attempt − 1), capped (exponent too), with ±10% jitter."""
    exponent = min(max(attempt_count - 1, 0), 60)
    delay = min(maximum, base * (2.0 ** exponent))
    return delay * random.uniform(0.9, 1.1)


MARK_SQL = text("""
UPDATE outbox_event
SET published_at = clock_timestamp(), lease_until = NULL
WHERE id = ANY(CAST(:ids AS uuid[])) AND published_at IS NULL
""")

FAIL_SQL = text("""
UPDATE outbox_event AS e
SET lease_until = NULL,
    last_error = f.error,
    next_attempt_at = clock_timestamp() + f.delay * interval '1 second'
FROM unnest(CAST(:ids AS uuid[]), CAST(:errors AS text[]), CAST(:delays AS double precision[]),
            CAST(:attempts AS integer[]))
     AS f(id, error, delay, attempts)
WHERE e.id = f.id AND e.published_at IS NULL AND e.attempt_count = f.attempts
""")


def publish_claimed(engine: Engine, producer: Any, topic: str, events: Sequence[ClaimedEvent],
                    *, ack_timeout_seconds: float = 30.0, backoff_base_seconds: float = 1.0,
                    backoff_max_seconds: float = 300.0) -> int:
    """Send, poll for the reports until all are in or the deadline passes, then record."""
    reports: dict[UUID, str | None] = {}

    def make_callback(event_id: UUID):
        def on_delivery(err: Any, msg: Any) -> None:
            reports[event_id] = None if err is None else str(err)
        return on_delivery

    for event in events:
        try:
            producer.produce(topic, key=event.aggregate_id.encode("utf-8"),
                             value=json.dumps(event.payload).encode("utf-8"),
                             headers=_kafka_headers(event),
                             on_delivery=make_callback(event.id))
        except (KafkaException, BufferError, ValueError, TypeError) as exc:
            reports[event.id] = f"produce failed: {type(exc).__name__}: {exc}"

    deadline = time.monotonic() + ack_timeout_seconds
    while len(reports) < len(events):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        producer.poll(min(remaining, 0.05))

    acknowledged = [event.id for event in events if event.id in reports
                    and reports[event.id] is None]
    failed = [event for event in events if reports.get(event.id, "missing") is not None]
    with engine.begin() as conn:
        if acknowledged:
            conn.execute(MARK_SQL, {"ids": acknowledged})
        if failed:
            conn.execute(FAIL_SQL, {
                "ids": [event.id for event in failed],
                "attempts": [event.attempt_count for event in failed],
                "errors": [(reports.get(event.id)
                            or f"no delivery report within {ack_timeout_seconds} s")[:2000]
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


def _kafka_headers(event: ClaimedEvent) -> list[tuple[str, bytes]]:
    own = {EVENT_ID_HEADER: str(event.id), EVENT_TYPE_HEADER: event.event_type,
           "aggregate-version": str(event.aggregate_version)}
    extra = {name: str(value) for name, value in (event.headers or {}).items()
             if name not in own}
    return [(name, value.encode("utf-8")) for name, value in {**own, **extra}.items()]
