"""The relay, marking as it goes. Each acknowledgement is written the moment its delivery
report arrives (one short, conditional UPDATE per record), so a relay that dies halfway through
a batch re-sends only what was not yet acknowledged. Waiting uses producer.poll() with a
deadline; a report that arrives after the deadline is ignored, and the records still without
one are recorded as failures with a backoff.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from confluent_kafka import KafkaException
from sqlalchemy import Engine, text

EVENT_ID_HEADER = "event-id"
EVENT_TYPE_HEADER = "event-type"
RELAY_NAME = f"{socket.gethostname()}:{os.getpid()}"


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
    """Every setting of `base`, plus acks=all and idempotence (which also caps in-flight
    requests and retries safely)."""
    return base | {"acks": "all", "enable.idempotence": "true"}


# Lease and count in one statement, then hand the rows back oldest first from SQL itself.
CLAIM_SQL = text("""
WITH picked AS (
    SELECT id
    FROM outbox_event
    WHERE published_at IS NULL
      AND (lease_until IS NULL OR lease_until < clock_timestamp())
      AND (next_attempt_at IS NULL OR next_attempt_at <= clock_timestamp())
    ORDER BY created_at
    LIMIT :batch_size
    FOR UPDATE SKIP LOCKED
), leased AS (
    UPDATE outbox_event AS o
    SET lease_until = clock_timestamp() + :lease_seconds * interval '1 second',
        attempt_count = o.attempt_count + 1,
        lease_owner = :owner
    FROM picked
    WHERE o.id = picked.id
    RETURNING o.*
)
SELECT id, aggregate_type, aggregate_id::text AS aggregate_id, event_type, aggregate_version,
       payload, headers, attempt_count
FROM leased
ORDER BY created_at, id
""")

MARK_SQL = text("""
UPDATE outbox_event
SET published_at = clock_timestamp(), lease_until = NULL, lease_owner = NULL,
    kafka_partition = :partition, kafka_offset = :offset
WHERE id = :id AND published_at IS NULL
""")

# The delay is computed in SQL from the row's own attempt count (capped exponent, ±10 %
# jitter, then the cap), on the database clock.
FAIL_SQL = text("""
UPDATE outbox_event
SET lease_until = NULL, lease_owner = NULL, last_error = :error,
    next_attempt_at = clock_timestamp() + LEAST(
        :max_delay,
        :base * power(2.0, LEAST(GREATEST(attempt_count - 1, 0), 60)) * (0.9 + 0.2 * random())
    ) * interval '1 second'
WHERE id = :id AND published_at IS NULL AND attempt_count = :attempts
""")


def claim_batch(engine: Engine, *, batch_size: int, lease_seconds: float) -> list[ClaimedEvent]:
    """Lease up to `batch_size` due rows, oldest first; the transaction commits on return."""
    with engine.begin() as conn:
        rows = conn.execute(CLAIM_SQL, {"batch_size": batch_size,
                                        "lease_seconds": float(lease_seconds),
                                        "owner": RELAY_NAME}).all()
    return [ClaimedEvent(id=row.id, aggregate_type=row.aggregate_type,
                         aggregate_id=row.aggregate_id, event_type=row.event_type,
                         aggregate_version=row.aggregate_version, payload=row.payload,
                         headers=dict(row.headers), attempt_count=row.attempt_count)
            for row in rows]


class _Batch:
    """Delivery bookkeeping for one publish_claimed call."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.open = True
        self.acknowledged: set[UUID] = set()
        self.errors: dict[UUID, str] = {}

    def reporter(self, event_id: UUID):
        def on_delivery(err: Any, msg: Any) -> None:
            if not self.open:
                return  # past the deadline: this event was already recorded as a failure
            if err is not None:
                self.errors[event_id] = str(err)
                return
            self.acknowledged.add(event_id)
            with self.engine.begin() as conn:
                conn.execute(MARK_SQL, {"id": event_id, "partition": msg.partition(),
                                        "offset": msg.offset()})
        return on_delivery


def publish_claimed(engine: Engine, producer: Any, topic: str, events: Sequence[ClaimedEvent],
                    *, ack_timeout_seconds: float = 30.0, backoff_base_seconds: float = 1.0,
                    backoff_max_seconds: float = 300.0) -> int:
    """Send each event, mark each one as its acknowledgement arrives, and record the rest as
    failures once `ack_timeout_seconds` have passed. Returns how many were acknowledged."""
    batch = _Batch(engine)
    waiting: set[UUID] = set()
    for event in events:
        try:
            producer.produce(topic, key=str(event.aggregate_id).encode(),
                             value=json.dumps(event.payload, separators=(",", ":")).encode(),
                             headers=_headers(event), on_delivery=batch.reporter(event.id))
            waiting.add(event.id)
        except (KafkaException, BufferError) as exc:
            batch.errors[event.id] = f"{type(exc).__name__}: {exc}"

    deadline = time.monotonic() + ack_timeout_seconds
    while waiting - batch.acknowledged - batch.errors.keys():
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        producer.poll(min(remaining, 0.1))
    batch.open = False

    failed = [event for event in events if event.id not in batch.acknowledged]
    if failed:
        with engine.begin() as conn:
            for event in failed:
                error = batch.errors.get(
                    event.id, f"no delivery report within {ack_timeout_seconds} s")
                conn.execute(FAIL_SQL, {"id": event.id, "error": error[:2000],
                                        "attempts": event.attempt_count,
                                        "base": float(backoff_base_seconds),
                                        "max_delay": float(backoff_max_seconds)})
    return len(batch.acknowledged)


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


def _headers(event: ClaimedEvent) -> dict[str, bytes]:
    """The row's headers, then event-id and event-type (which win over a row header with the
    same name)."""
    headers = {name: (value if isinstance(value, str) else json.dumps(value)).encode()
               for name, value in event.headers.items()}
    headers[EVENT_ID_HEADER] = str(event.id).encode()
    headers[EVENT_TYPE_HEADER] = event.event_type.encode()
    return headers
