"""The relay, written differently from the reference: the claim is two statements in one
transaction (pick with FOR UPDATE SKIP LOCKED, then lease the picked ids while their row locks
are still held); the relay waits with poll() until a deadline instead of flush(); the backoff
delay is computed in SQL from the row's own attempt_count, with ±10 % jitter.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from confluent_kafka import KafkaException
from sqlalchemy import Engine, text

EVENT_ID_HEADER = "event-id"
EVENT_TYPE_HEADER = "event-type"

_ACKS_ALIASES = ("acks", "request.required.acks")


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
    """A copy of `base`; acks=all unless base already chose it under either name."""
    config = dict(base)
    if not any(name in config for name in _ACKS_ALIASES):
        config["acks"] = -1
    config["enable.idempotence"] = "true"
    return config


_PICK = text("""
SELECT id FROM outbox_event
WHERE published_at IS NULL
  AND (lease_until IS NULL OR lease_until < clock_timestamp())
  AND (next_attempt_at IS NULL OR next_attempt_at <= clock_timestamp())
ORDER BY created_at
LIMIT :n
FOR UPDATE SKIP LOCKED
""")

_LEASE = text("""
UPDATE outbox_event
SET lease_until = clock_timestamp() + :lease * interval '1 second',
    attempt_count = attempt_count + 1
WHERE id = ANY(:ids)
RETURNING id, aggregate_type, aggregate_id, event_type, aggregate_version, payload, headers,
          attempt_count, created_at
""")


def claim_batch(engine: Engine, *, batch_size: int, lease_seconds: float) -> list[ClaimedEvent]:
    with engine.begin() as conn:
        ids = list(conn.execute(_PICK, {"n": batch_size}).scalars())
        rows = conn.execute(_LEASE, {"ids": ids, "lease": lease_seconds}).all() if ids else []
    rows = sorted(rows, key=lambda r: (r.created_at, str(r.id)))
    return [ClaimedEvent(id=r.id, aggregate_type=r.aggregate_type,
                         aggregate_id=str(r.aggregate_id), event_type=r.event_type,
                         aggregate_version=int(r.aggregate_version), payload=r.payload,
                         headers={str(k): str(v) for k, v in (r.headers or {}).items()},
                         attempt_count=int(r.attempt_count))
            for r in rows]


_MARK = text("UPDATE outbox_event SET published_at = clock_timestamp(), lease_until = NULL "
             "WHERE id = :id AND published_at IS NULL")

# delay = base * 2^(attempt_count-1), exponent capped before the power, capped at max,
# then jittered by ±10 %.
_FAIL = text("""
UPDATE outbox_event
SET lease_until = NULL,
    last_error = :error,
    next_attempt_at = clock_timestamp() + interval '1 second' *
        LEAST(CAST(:max AS float8),
              CAST(:base AS float8) * power(2.0::float8, LEAST(GREATEST(attempt_count - 1, 0), 60)))
        * (0.9 + 0.2 * random())
WHERE id = :id AND published_at IS NULL AND attempt_count = :attempts
""")


def publish_claimed(engine: Engine, producer: Any, topic: str, events: Sequence[ClaimedEvent],
                    *, ack_timeout_seconds: float = 30.0, backoff_base_seconds: float = 1.0,
                    backoff_max_seconds: float = 300.0) -> int:
    reports: dict[UUID, str | None] = {}
    errors: dict[UUID, str] = {}
    expected = 0

    def report(event_id: UUID):
        def on_delivery(err: Any, _msg: Any) -> None:
            reports[event_id] = None if err is None else str(err)
        return on_delivery

    for event in events:
        try:
            producer.produce(topic, value=json.dumps(event.payload).encode("utf-8"),
                             key=event.aggregate_id.encode("utf-8"),
                             headers=_headers(event), on_delivery=report(event.id))
            expected += 1
        except (KafkaException, BufferError, ValueError, TypeError) as exc:
            errors[event.id] = f"produce refused: {exc}"

    deadline = time.monotonic() + ack_timeout_seconds
    while len(reports) < expected:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        producer.poll(min(left, 0.1))

    acked = [e.id for e in events if e.id in reports and reports[e.id] is None]
    for e in events:
        if e.id not in errors and reports.get(e.id, "missing") is not None:
            errors[e.id] = reports.get(e.id) or f"no delivery report in {ack_timeout_seconds} s"

    with engine.begin() as conn:
        for event_id in acked:
            conn.execute(_MARK, {"id": event_id})
        attempts = {e.id: e.attempt_count for e in events}
        for event_id, error in errors.items():
            conn.execute(_FAIL, {"id": event_id, "error": error[:1000],
                                 "attempts": attempts[event_id],
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


def _headers(event: ClaimedEvent) -> list[tuple[str, bytes]]:
    own = [(name, value.encode("utf-8")) for name, value in event.headers.items()
           if name not in (EVENT_ID_HEADER, EVENT_TYPE_HEADER)]
    return [(EVENT_ID_HEADER, str(event.id).encode("ascii")),
            (EVENT_TYPE_HEADER, event.event_type.encode("utf-8"))] + own
