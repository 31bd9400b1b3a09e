"""The relay: claims unpublished outbox rows, sends them to Kafka, and marks what the broker
acknowledged. Several relays may run at once; a crash anywhere loses nothing (at-least-once).
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
    """The relay's producer settings: a new dict of `base` (bootstrap servers and whatever else
    the caller chose, kept as given) plus the settings that make an acknowledgement mean
    something. With idempotence on, librdkafka keeps max.in.flight at most 5 itself."""
    return {
        **base,
        "acks": "all",  # the ack means every in-sync replica has the record
        "enable.idempotence": True,  # librdkafka's retries never duplicate or reorder
    }


# One short statement: pick the oldest claimable rows, skip those another relay is claiming,
# lease them and count the attempt. It commits before anything is sent.
CLAIM_SQL = text("""
WITH claimable AS (
    SELECT id
    FROM outbox_event
    WHERE published_at IS NULL
      AND (lease_until IS NULL OR lease_until < clock_timestamp())
      AND (next_attempt_at IS NULL OR next_attempt_at <= clock_timestamp())
    ORDER BY created_at
    LIMIT :batch_size
    FOR UPDATE SKIP LOCKED
)
UPDATE outbox_event e
SET lease_until = clock_timestamp() + make_interval(secs => :lease_seconds),
    attempt_count = e.attempt_count + 1
FROM claimable
WHERE e.id = claimable.id
RETURNING e.id, e.aggregate_type, e.aggregate_id, e.event_type, e.aggregate_version,
          e.payload, e.headers, e.attempt_count, e.created_at
""")


def claim_batch(engine: Engine, *, batch_size: int, lease_seconds: float) -> list[ClaimedEvent]:
    """Lease up to `batch_size` unpublished, due rows (oldest first) in one short transaction.

    Rows leased by another relay whose lease has not expired, and rows backing off until
    `next_attempt_at`, are not claimed. Returns the claimed events, oldest first.
    """
    with engine.begin() as conn:
        rows = conn.execute(CLAIM_SQL, {"batch_size": batch_size,
                                        "lease_seconds": lease_seconds}).all()
    rows.sort(key=lambda row: row.created_at)  # RETURNING has no order of its own
    return [ClaimedEvent(id=row.id, aggregate_type=row.aggregate_type,
                         aggregate_id=str(row.aggregate_id), event_type=row.event_type,
                         aggregate_version=row.aggregate_version, payload=row.payload,
                         headers=dict(row.headers or {}), attempt_count=row.attempt_count)
            for row in rows]


def backoff_seconds(attempt_count: int, base: float, maximum: float) -> float:
    """base, 2×base, 4×base … after the 1st, 2nd, 3rd … failed attempt, never above maximum."""
    # Doubling stops at the maximum, so no exponent needs a cap: 2 ** (attempt_count − 1)
    # overflows, and any fixed cap binds before the maximum for a small enough base. At most
    # ~2100 doublings take even the smallest positive float past the largest.
    delay, doublings = base, max(attempt_count - 1, 0)
    while doublings > 0 and 0 < delay < maximum:
        delay, doublings = delay * 2, doublings - 1
    return min(maximum, delay) * random.uniform(0.9, 1.1)


def publish_claimed(engine: Engine, producer: Any, topic: str, events: Sequence[ClaimedEvent],
                    *, ack_timeout_seconds: float = 30.0, backoff_base_seconds: float = 1.0,
                    backoff_max_seconds: float = 300.0) -> int:
    """Send claimed events (key = aggregate id), wait for the broker's acknowledgements, then
    mark the acknowledged ones published and record the failures with a backoff.

    Returns:
        How many events the broker acknowledged.
    """
    outcome: dict[UUID, str | None] = {}  # None: acknowledged; text: why not
    call = {"over": False}

    def late_mark(event_id: UUID) -> None:
        # a report after the call's timeout: the row was recorded as failed; mark it now,
        # conditionally (never moves another relay's mark)
        with engine.begin() as conn:
            conn.execute(text("UPDATE outbox_event SET published_at = clock_timestamp(), "
                              "lease_until = NULL WHERE id = :id AND published_at IS NULL"),
                         {"id": event_id})

    for event in events:
        def on_delivery(err: Any, msg: Any, event_id: UUID = event.id) -> None:
            if call["over"]:
                if err is None:
                    late_mark(event_id)
                return
            outcome[event_id] = None if err is None else str(err)

        try:
            producer.produce(
                topic,
                key=event.aggregate_id.encode(),
                value=json.dumps(event.payload).encode(),
                headers=_kafka_headers(event),
                on_delivery=on_delivery,
            )
        except (KafkaException, BufferError) as exc:
            outcome[event.id] = f"{type(exc).__name__}: {exc}"

    deadline = time.monotonic() + ack_timeout_seconds
    while any(event.id not in outcome for event in events):
        left = deadline - time.monotonic()
        if left <= 0:
            break
        producer.poll(min(left, 0.1))
    call["over"] = True
    for event in events:
        outcome.setdefault(event.id, f"no acknowledgement within {ack_timeout_seconds} s")

    acknowledged = [event_id for event_id, error in outcome.items() if error is None]
    for event_id in acknowledged:  # each mark in its own short transaction
        with engine.begin() as conn:
            conn.execute(
                text("UPDATE outbox_event SET published_at = clock_timestamp(), "
                     "lease_until = NULL WHERE id = :id AND published_at IS NULL"),
                {"id": event_id},
            )
    failures = [event for event in events if outcome[event.id] is not None]
    if failures:
        with engine.begin() as conn:
            for event in failures:
                conn.execute(
                    text("UPDATE outbox_event SET lease_until = NULL, last_error = :error, "
                         "next_attempt_at = clock_timestamp() + make_interval(secs => :delay) "
                         "WHERE id = :id AND published_at IS NULL "
                         "AND attempt_count = :attempts"),
                    {"id": event.id, "error": outcome[event.id][:2000],
                     "attempts": event.attempt_count,
                     "delay": backoff_seconds(event.attempt_count, backoff_base_seconds,
                                              backoff_max_seconds)},
                )
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
    headers = [(EVENT_ID_HEADER, str(event.id).encode()),
               (EVENT_TYPE_HEADER, event.event_type.encode())]
    if "aggregate-version" not in event.headers:  # ours, unless the row brings its own
        headers.append(("aggregate-version", str(event.aggregate_version).encode()))
    headers += [(name, str(value).encode()) for name, value in event.headers.items()
                if name not in (EVENT_ID_HEADER, EVENT_TYPE_HEADER)]  # never the deduped id
    return headers
