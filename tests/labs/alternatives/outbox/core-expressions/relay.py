"""The relay, written with SQLAlchemy Core. Claim: lock the oldest due rows with SELECT … FOR
UPDATE SKIP LOCKED, then lease them with an UPDATE — two statements in one short transaction
that commits before anything is sent. Publish: produce with delivery callbacks, flush with the
ack timeout, then mark acknowledged rows and back off failed ones in one short transaction.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from confluent_kafka import KafkaException
from sqlalchemy import (BigInteger, Column, DateTime, Engine, Float, Integer, MetaData, Table,
                        Text, Uuid, and_, bindparam, func, or_, select, update)
from sqlalchemy.dialects.postgresql import JSONB

EVENT_ID_HEADER = "event-id"
EVENT_TYPE_HEADER = "event-type"
JITTER = 0.2  # ±20 % around the exponential delay

_outbox = Table(
    "outbox_event", MetaData(),
    Column("id", Uuid, primary_key=True),
    Column("aggregate_type", Text),
    Column("aggregate_id", Text),
    Column("event_type", Text),
    Column("aggregate_version", BigInteger),
    Column("payload", JSONB),
    Column("headers", JSONB),
    Column("created_at", DateTime(timezone=True)),
    Column("published_at", DateTime(timezone=True)),
    Column("lease_until", DateTime(timezone=True)),
    Column("attempt_count", Integer),
    Column("last_error", Text),
    Column("next_attempt_at", DateTime(timezone=True)),
    Column("published_partition", Integer),
    Column("published_offset", BigInteger),
)


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
    """`base` untouched, plus acks=all and idempotence."""
    config = dict(base)
    config.update({"acks": "all", "enable.idempotence": True})
    return config


def _seconds(name: str, value: float) -> Any:
    """`value` seconds as an interval, on the database side."""
    return func.make_interval(0, 0, 0, 0, 0, 0, bindparam(name, value, type_=Float))


def claim_batch(engine: Engine, *, batch_size: int, lease_seconds: float) -> list[ClaimedEvent]:
    """Lease up to `batch_size` unpublished, due rows, oldest first, in one transaction."""
    now = func.clock_timestamp()
    due = (
        select(_outbox.c.id)
        .where(_outbox.c.published_at.is_(None),
               or_(_outbox.c.lease_until.is_(None), _outbox.c.lease_until < now),
               or_(_outbox.c.next_attempt_at.is_(None), _outbox.c.next_attempt_at <= now))
        .order_by(_outbox.c.created_at)
        .limit(batch_size)
        .with_for_update(skip_locked=True)
    )
    with engine.begin() as conn:
        ids = list(conn.execute(due).scalars())
        if not ids:
            return []
        # The rows are locked by this transaction: nobody else can lease them before we commit.
        rows = conn.execute(
            update(_outbox)
            .where(_outbox.c.id.in_(ids))
            .values(lease_until=now + _seconds("lease", lease_seconds),
                    attempt_count=_outbox.c.attempt_count + 1)
            .returning(_outbox.c.id, _outbox.c.aggregate_type, _outbox.c.aggregate_id,
                       _outbox.c.event_type, _outbox.c.aggregate_version, _outbox.c.payload,
                       _outbox.c.headers, _outbox.c.attempt_count, _outbox.c.created_at)
        ).all()
    position = {event_id: index for index, event_id in enumerate(ids)}  # oldest first
    rows.sort(key=lambda row: position[row.id])
    return [ClaimedEvent(id=row.id, aggregate_type=row.aggregate_type,
                         aggregate_id=row.aggregate_id, event_type=row.event_type,
                         aggregate_version=row.aggregate_version, payload=row.payload,
                         headers=dict(row.headers or {}), attempt_count=row.attempt_count)
            for row in rows]


def next_delay(attempts: int, base: float, maximum: float) -> float:
    """base × 2^(attempts − 1) with ±20 % jitter, never above maximum."""
    exponential = base * 2.0 ** min(max(attempts - 1, 0), 62)
    return min(maximum, exponential * random.uniform(1 - JITTER, 1 + JITTER))


def publish_claimed(engine: Engine, producer: Any, topic: str, events: Sequence[ClaimedEvent],
                    *, ack_timeout_seconds: float = 30.0, backoff_base_seconds: float = 1.0,
                    backoff_max_seconds: float = 300.0) -> int:
    """Send, wait for the acknowledgements, then mark. Returns how many were acknowledged."""
    acked: dict[UUID, tuple[int, int]] = {}
    errors: dict[UUID, str] = {}

    def reporter(event_id: UUID):
        def on_delivery(err: Any, msg: Any) -> None:
            if err is None:
                acked[event_id] = (msg.partition(), msg.offset())
            else:
                errors[event_id] = str(err)
        return on_delivery

    for event in events:
        try:
            producer.produce(topic, key=event.aggregate_id.encode("utf-8"),
                             value=json.dumps(event.payload).encode("utf-8"),
                             headers=_headers(event), on_delivery=reporter(event.id))
        except (KafkaException, BufferError) as exc:
            errors[event.id] = f"refused by the producer: {exc}"

    producer.flush(ack_timeout_seconds)
    failed = [event for event in events if event.id not in acked]

    with engine.begin() as conn:
        if acked:
            conn.execute(
                update(_outbox)
                .where(_outbox.c.id == bindparam("event_id"), _outbox.c.published_at.is_(None))
                .values(published_at=func.clock_timestamp(), lease_until=None,
                        published_partition=bindparam("partition"),
                        published_offset=bindparam("offset")),
                [{"event_id": event_id, "partition": partition, "offset": offset}
                 for event_id, (partition, offset) in acked.items()],
            )
        if failed:
            conn.execute(
                update(_outbox)
                .where(and_(_outbox.c.id == bindparam("event_id"),
                            _outbox.c.published_at.is_(None),
                            _outbox.c.attempt_count == bindparam("attempts")))
                .values(lease_until=None, last_error=bindparam("error"),
                        next_attempt_at=func.clock_timestamp() + func.make_interval(
                            0, 0, 0, 0, 0, 0, bindparam("delay", type_=Float))),
                [{"event_id": event.id, "attempts": event.attempt_count,
                  "error": errors.get(event.id,
                                      f"no delivery report within {ack_timeout_seconds} s"),
                  "delay": next_delay(event.attempt_count, backoff_base_seconds,
                                      backoff_max_seconds)}
                 for event in failed],
            )
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


def _headers(event: ClaimedEvent) -> list[tuple[str, bytes]]:
    """event-id and event-type, then one header per key of the row's headers (strings as they
    are, other JSON values in their JSON form)."""
    headers = [(EVENT_ID_HEADER, str(event.id).encode("utf-8")),
               (EVENT_TYPE_HEADER, event.event_type.encode("utf-8"))]
    for name, value in event.headers.items():
        text_value = value if isinstance(value, str) else json.dumps(value)
        headers.append((name, text_value.encode("utf-8")))
    return headers
