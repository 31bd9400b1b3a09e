"""The relay: claims unpublished outbox rows, sends them to Kafka, and marks what the broker
acknowledged. Several relays may run at once; a crash anywhere must lose nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from sqlalchemy import Engine

EVENT_ID_HEADER = "event-id"
EVENT_TYPE_HEADER = "event-type"


@dataclass(frozen=True)
class ClaimedEvent:
    """Given: one outbox row a relay has leased and must now send."""

    id: UUID
    aggregate_type: str
    aggregate_id: str
    event_type: str
    aggregate_version: int
    payload: Any
    headers: dict[str, Any] = field(default_factory=dict)
    attempt_count: int = 1


def producer_config(base: dict[str, Any]) -> dict[str, Any]:
    """The relay's producer settings: every setting of `base` kept as given, plus the ones that
    make an acknowledgement mean the record is safe."""
    raise NotImplementedError(
        "producer_config: return {**base, ...} with acks=all and enable.idempotence=True")


def claim_batch(engine: Engine, *, batch_size: int, lease_seconds: float) -> list[ClaimedEvent]:
    """Lease up to `batch_size` unpublished, due rows (oldest first) in one short transaction:
    set lease_until = now + lease_seconds and attempt_count + 1, commit, return them.

    Skip rows another relay holds (a lease that has not expired, or a row lock) and rows whose
    next_attempt_at is in the future. Returns the claimed events, oldest first.
    """
    raise NotImplementedError(
        "claim_batch: one UPDATE outbox_event … FROM (SELECT id … WHERE published_at IS NULL "
        "… ORDER BY created_at LIMIT :batch_size FOR UPDATE SKIP LOCKED) … RETURNING …, in its "
        "own `with engine.begin()` block")


def publish_claimed(engine: Engine, producer: Any, topic: str, events: Sequence[ClaimedEvent],
                    *, ack_timeout_seconds: float = 30.0, backoff_base_seconds: float = 1.0,
                    backoff_max_seconds: float = 300.0) -> int:
    """Send claimed events (key = aggregate id; headers event-id, event-type and the row's
    headers; value = the payload as JSON), wait for the broker's acknowledgements, then mark
    the acknowledged rows published (only if still unpublished) and record each failure:
    last_error, and next_attempt_at = now + base × 2^(attempts − 1), at most the maximum.

    Returns:
        How many events the broker acknowledged.
    """
    raise NotImplementedError(
        "publish_claimed: producer.produce(...) each event with an on_delivery callback, "
        "producer.flush(ack_timeout_seconds), then one short transaction that marks the "
        "acknowledged rows and records the failed ones")


def relay_once(engine: Engine, producer: Any, topic: str, *, batch_size: int = 100,
               lease_seconds: float = 30.0, ack_timeout_seconds: float = 30.0,
               backoff_base_seconds: float = 1.0, backoff_max_seconds: float = 300.0) -> int:
    """Given: one relay pass — claim a batch, publish it. Returns how many were published."""
    events = claim_batch(engine, batch_size=batch_size, lease_seconds=lease_seconds)
    if not events:
        return 0
    return publish_claimed(engine, producer, topic, events,
                           ack_timeout_seconds=ack_timeout_seconds,
                           backoff_base_seconds=backoff_base_seconds,
                           backoff_max_seconds=backoff_max_seconds)
