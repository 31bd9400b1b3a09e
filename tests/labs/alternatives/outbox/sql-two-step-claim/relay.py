"""The relay: claims unpublished outbox rows, sends them to Kafka, and marks what the broker
acknowledged. Several relays may run at once; a crash anywhere loses nothing (at-least-once).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

import time

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
    config = dict(base)
    config["enable.idempotence"] = "true"
    acks_name = "request.required.acks" if "request.required.acks" in config else "acks"
    config[acks_name] = -1
    return config


_PICK = text("""
SELECT id FROM outbox_event
WHERE published_at IS NULL
  AND (lease_until IS NULL OR lease_until < clock_timestamp())
  AND (next_attempt_at IS NULL OR next_attempt_at <= clock_timestamp())
ORDER BY created_at LIMIT :n FOR NO KEY UPDATE SKIP LOCKED
""")
_LEASE = text("""
UPDATE outbox_event
SET lease_until = clock_timestamp() + CAST(:lease AS float8) * interval '1 second',
    attempt_count = attempt_count + 1
WHERE id = ANY(:ids)
RETURNING id, aggregate_type, aggregate_id, event_type, aggregate_version, payload, headers,
          attempt_count, created_at
""")


def claim_batch(engine: Engine, *, batch_size: int, lease_seconds: float) -> list[ClaimedEvent]:
    if batch_size <= 0:
        return []
    with engine.connect() as conn:
        with conn.begin():  # pick and lease in one transaction: the pick's row locks hold
            ids = conn.execute(_PICK, {"n": batch_size}).scalars().all()
            rows = conn.execute(_LEASE, {"ids": list(ids), "lease": lease_seconds}).all() \
                if ids else []
    rows = sorted(rows, key=lambda r: r.created_at)
    return [ClaimedEvent(id=r.id, aggregate_type=r.aggregate_type,
                         aggregate_id=str(r.aggregate_id), event_type=r.event_type,
                         aggregate_version=r.aggregate_version, payload=r.payload,
                         headers=dict(r.headers or {}), attempt_count=r.attempt_count)
            for r in rows]


_MARK = text("UPDATE outbox_event SET published_at = clock_timestamp(), lease_until = NULL, "
             "last_error = NULL, next_attempt_at = NULL "
             "WHERE id = :id AND published_at IS NULL")
# backoff computed by the database: base * 2^(n-1), exponent capped far above any binding point
_FAIL = text("""
UPDATE outbox_event
SET lease_until = NULL, last_error = :err,
    next_attempt_at = clock_timestamp() + least(
        CAST(:max AS float8),
        CAST(:base AS float8) * power(2::float8, least(greatest(attempt_count - 1, 0), 900))
    ) * interval '1 second'
WHERE id = :id AND published_at IS NULL AND attempt_count = :attempts
""")


def publish_claimed(engine: Engine, producer: Any, topic: str, events: Sequence[ClaimedEvent],
                    *, ack_timeout_seconds: float = 30.0, backoff_base_seconds: float = 1.0,
                    backoff_max_seconds: float = 300.0) -> int:
    state = {"open": True}
    acked: set[UUID] = set()
    errors: dict[UUID, str] = {}
    deadline = time.monotonic() + ack_timeout_seconds

    def report(event_id: UUID):
        def on_delivery(err: Any, msg: Any) -> None:
            if not state["open"]:
                return  # late report: the row was recorded as failed and will be sent again
            if err is not None:
                errors[event_id] = str(err)
                return
            acked.add(event_id)
            with engine.begin() as conn:  # each acknowledged row marked in its own transaction
                conn.execute(_MARK, {"id": event_id})
        return on_delivery

    waiting = 0
    for event in events:
        headers = {EVENT_ID_HEADER: str(event.id), EVENT_TYPE_HEADER: event.event_type}
        for name, value in event.headers.items():
            if name not in headers:
                headers[name] = str(value)
        try:
            producer.produce(topic, json.dumps(event.payload).encode("utf-8"),
                             event.aggregate_id.encode("utf-8"),
                             headers=[(k, v.encode("utf-8")) for k, v in headers.items()],
                             on_delivery=report(event.id))
            waiting += 1
        except (KafkaException, BufferError, ValueError, TypeError) as exc:
            errors[event.id] = repr(exc)
    while len(acked) + len(errors) < len(events):
        left = deadline - time.monotonic()
        if left <= 0:
            break
        producer.poll(min(left, 0.05))
    state["open"] = False

    failed = [e for e in events if e.id not in acked]
    if failed:
        with engine.begin() as conn:
            for event in failed:
                conn.execute(_FAIL, {"id": event.id, "attempts": event.attempt_count,
                                     "err": errors.get(event.id, "no delivery report in time"),
                                     "base": backoff_base_seconds, "max": backoff_max_seconds})
    return len(acked)


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
