"""The relay: claims unpublished outbox rows, sends them to Kafka, and marks what the broker
acknowledged. Several relays may run at once; a crash anywhere loses nothing (at-least-once).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from confluent_kafka import KafkaException
import math
import random

from sqlalchemy import Engine, bindparam, func, select, update

try:
    from .tables import outbox_event as ob
except ImportError:
    from tables import outbox_event as ob  # type: ignore[no-redef]

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


_ALIASES = {"acks": ("acks", "request.required.acks")}


def producer_config(base: dict[str, Any]) -> dict[str, Any]:
    config = {key: value for key, value in base.items()}
    for name in _ALIASES["acks"]:
        if name in config:
            config[name] = "all"
            break
    else:
        config["acks"] = "all"
    config.setdefault("enable.idempotence", True)
    config["enable.idempotence"] = True
    return config


def _claim_statement(batch_size: int, lease_seconds: float):
    now = func.clock_timestamp()
    pick = (select(ob.c.id)
            .where(ob.c.published_at.is_(None),
                   (ob.c.lease_until.is_(None)) | (ob.c.lease_until < now),
                   (ob.c.next_attempt_at.is_(None)) | (ob.c.next_attempt_at <= now))
            .order_by(ob.c.created_at)
            .limit(batch_size)
            .with_for_update(skip_locked=True)
            .cte("pick"))
    return (update(ob)
            .where(ob.c.id.in_(select(pick.c.id)))
            .values(lease_until=func.clock_timestamp()
                    + func.make_interval(0, 0, 0, 0, 0, 0, float(lease_seconds)),
                    attempt_count=ob.c.attempt_count + 1)
            .returning(ob.c.id, ob.c.aggregate_type, ob.c.aggregate_id, ob.c.event_type,
                       ob.c.aggregate_version, ob.c.payload, ob.c.headers, ob.c.attempt_count,
                       ob.c.created_at))


def claim_batch(engine: Engine, *, batch_size: int, lease_seconds: float) -> list[ClaimedEvent]:
    if batch_size < 1:
        return []
    with engine.begin() as conn:
        rows = list(conn.execute(_claim_statement(batch_size, lease_seconds)).mappings())
    rows.sort(key=lambda r: (r["created_at"], str(r["id"])))
    return [ClaimedEvent(id=r["id"], aggregate_type=r["aggregate_type"],
                         aggregate_id=str(r["aggregate_id"]), event_type=r["event_type"],
                         aggregate_version=r["aggregate_version"], payload=r["payload"],
                         headers=dict(r["headers"] or {}), attempt_count=r["attempt_count"])
            for r in rows]


def backoff_seconds(attempt_count: int, base: float, maximum: float) -> float:
    """base * 2^(n-1) capped, exponent bounded (ldexp overflows past ~2^1024), jitter +-20%."""
    exponent = min(max(attempt_count - 1, 0), 1000)
    try:
        delay = math.ldexp(base, exponent)
    except OverflowError:
        delay = math.inf
    return min(maximum, delay) * random.uniform(0.8, 1.2)


_MARK = (update(ob)
         .where(ob.c.id == bindparam("event_id"), ob.c.published_at.is_(None))
         .values(published_at=func.clock_timestamp(), lease_until=None, last_error=None,
                 next_attempt_at=None))
_FAIL = (update(ob)
         .where(ob.c.id == bindparam("event_id"), ob.c.published_at.is_(None),
                ob.c.attempt_count == bindparam("attempts"))
         .values(lease_until=None, last_error=bindparam("error"),
                 next_attempt_at=func.clock_timestamp()
                 + func.make_interval(0, 0, 0, 0, 0, 0, bindparam("delay"))))


def publish_claimed(engine: Engine, producer: Any, topic: str, events: Sequence[ClaimedEvent],
                    *, ack_timeout_seconds: float = 30.0, backoff_base_seconds: float = 1.0,
                    backoff_max_seconds: float = 300.0) -> int:
    reports: dict[str, Any] = {}

    def delivered(err: Any, msg: Any, event_id: str) -> None:
        reports[event_id] = err if err is not None else True

    refused: dict[str, str] = {}
    for event in events:
        event_id = str(event.id)
        headers = {name: str(value).encode() for name, value in event.headers.items()}
        headers[EVENT_ID_HEADER] = event_id.encode()
        headers[EVENT_TYPE_HEADER] = event.event_type.encode()
        try:
            producer.produce(topic=topic, key=event.aggregate_id, headers=headers,
                             value=json.dumps(event.payload, separators=(",", ":")),
                             callback=lambda err, msg, eid=event_id: delivered(err, msg, eid))
        except Exception as exc:  # noqa: BLE001 - one bad row never stops the batch
            refused[event_id] = f"produce refused: {exc!r}"
    producer.flush(ack_timeout_seconds)
    done = dict(reports)  # a later report is ignored: the row is recorded as failed

    ok = [{"event_id": event.id} for event in events if done.get(str(event.id)) is True]
    bad = []
    for event in events:
        key = str(event.id)
        if done.get(key) is True:
            continue
        why = refused.get(key) or (str(done[key]) if key in done
                                   else f"no delivery report after {ack_timeout_seconds}s")
        bad.append({"event_id": event.id, "attempts": event.attempt_count, "error": why[:4000],
                    "delay": backoff_seconds(event.attempt_count, backoff_base_seconds,
                                             backoff_max_seconds)})
    if ok or bad:
        with engine.begin() as conn:
            if ok:
                conn.execute(_MARK, ok)
            if bad:
                conn.execute(_FAIL, bad)
    return len(ok)


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
