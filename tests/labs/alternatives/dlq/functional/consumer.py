"""Payment consumer, written as plain functions around a small context object."""

from __future__ import annotations

import hashlib
import os
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicPartition
from deadletter import DeadLetterWriteFailed, Failure, publish_dead_letter
from payments import (
    SYSTEM_CLOCK,
    Clock,
    Downstream,
    KeyParked,
    PaymentEvent,
    PermanentError,
    Settings,
    apply_payment,
    parse_event,
)
from sqlalchemy import Connection, Engine, text


def consumer_config(base: dict[str, Any], settings: Settings) -> dict[str, Any]:
    cfg = dict(base)
    cfg.update({"group.id": settings.group_id, "enable.auto.commit": False,
                "max.poll.interval.ms": settings.max_poll_interval_ms})
    return cfg


def producer_config(base: dict[str, Any]) -> dict[str, Any]:
    cfg = dict(base)
    cfg.update({"acks": "all", "linger.ms": 0})
    return cfg


def _book(conn: Connection, event: PaymentEvent) -> bool:
    row = conn.execute(text("INSERT INTO processed_events (event_id) VALUES (:e) "
                            "ON CONFLICT (event_id) DO NOTHING RETURNING event_id"),
                       {"e": event.event_id}).first()
    if row is None:
        return False
    apply_payment(conn, event)
    return True


def apply_once(engine: Engine, event: PaymentEvent) -> bool:
    with engine.begin() as conn:
        return _book(conn, event)


class _Stop(Exception):
    pass


class _Hold(Exception):
    pass


@dataclass
class _Ctx:
    consumer: Any
    producer: Any
    engine: Engine
    downstream: Downstream
    settings: Settings
    clock: Clock
    metrics: Any
    should_stop: Callable[[], bool]
    rng: random.Random


def _wait(ctx: _Ctx, retry: int) -> float:
    p = ctx.settings.retry
    nominal = min(p.max_backoff_seconds, p.initial_backoff_seconds * p.multiplier ** (retry - 1))
    return nominal * ctx.rng.uniform(1 - p.jitter, 1 + p.jitter)


def _sha(value: bytes | None) -> str:
    return hashlib.sha256(value or b"").hexdigest()


def _is_replay(msg: Any) -> bool:
    return any(k == "x-replay-count" for k, _ in (msg.headers() or []))


def _park_state(ctx: _Ctx, key: bytes) -> tuple[int, str | None] | None:
    with ctx.engine.connect() as conn:
        row = conn.execute(text("SELECT waiting, head_sha FROM parked_keys WHERE key_hex = :k"),
                           {"k": key.hex()}).first()
        conn.rollback()
    return None if row is None else (row[0], row[1])


def _already_counted(conn: Connection, key_hex: str, partition: int, offset: int) -> bool:
    last = conn.execute(text("SELECT last_offset FROM parked_key_offsets "
                             "WHERE key_hex = :k AND src_partition = :p"),
                        {"k": key_hex, "p": partition}).scalar()
    return last is not None and last >= offset


def _mark_offset(conn: Connection, key_hex: str, partition: int, offset: int) -> None:
    conn.execute(text("INSERT INTO parked_key_offsets (key_hex, src_partition, last_offset) "
                      "VALUES (:k, :p, :o) ON CONFLICT (key_hex, src_partition) "
                      "DO UPDATE SET last_offset = EXCLUDED.last_offset"),
                 {"k": key_hex, "p": partition, "o": offset})


def _park(ctx: _Ctx, msg: Any, delta: int, head: str | None) -> None:
    k = msg.key().hex()
    with ctx.engine.begin() as conn:
        conn.execute(text("INSERT INTO parked_keys (key_hex, waiting, head_sha) "
                          "VALUES (:k, 0, NULL) ON CONFLICT (key_hex) DO NOTHING"), {"k": k})
        conn.execute(text("SELECT 1 FROM parked_keys WHERE key_hex = :k FOR UPDATE"), {"k": k})
        if _already_counted(conn, k, msg.partition(), msg.offset()):
            return
        conn.execute(text("UPDATE parked_keys SET waiting = waiting + :d, "
                          "head_sha = COALESCE(:h, head_sha) WHERE key_hex = :k"),
                     {"k": k, "d": delta, "h": head})
        _mark_offset(conn, k, msg.partition(), msg.offset())


def _release(conn: Connection, msg: Any) -> None:
    """In the booking's own transaction: one fewer of the key waits."""
    k = msg.key().hex()
    conn.execute(text("SELECT 1 FROM parked_keys WHERE key_hex = :k FOR UPDATE"), {"k": k})
    if _already_counted(conn, k, msg.partition(), msg.offset()):
        return
    conn.execute(text("UPDATE parked_keys SET waiting = GREATEST(waiting - 1, 0), "
                      "head_sha = NULL WHERE key_hex = :k"), {"k": k})
    _mark_offset(conn, k, msg.partition(), msg.offset())
    conn.execute(text("DELETE FROM parked_keys WHERE key_hex = :k AND waiting = 0"), {"k": k})


def _gateway_down(ctx: _Ctx) -> bool:
    try:
        ctx.downstream.ping()
        return False
    except Exception:
        return True


def _attempt(ctx: _Ctx, msg: Any, release: bool) -> Failure | None:
    first = ctx.clock.now()
    try:
        event = parse_event(msg.value())
    except PermanentError as e:
        return Failure(e, 1, first, first)
    policy = ctx.settings.retry
    ends_by = ctx.clock.monotonic() + ctx.settings.max_poll_interval_ms / 2000.0
    n = 0
    while True:
        n += 1
        try:
            ctx.downstream.authorize(event)
            with ctx.engine.begin() as conn:
                _book(conn, event)
                if release:
                    _release(conn, msg)
            return None
        except PermanentError as e:
            return Failure(e, n, first, ctx.clock.now())
        except Exception as e:
            failed_at = ctx.clock.now()
            if n < policy.max_attempts:
                pause = _wait(ctx, n)
                if ctx.clock.monotonic() + pause <= ends_by:
                    if ctx.should_stop():
                        raise _Stop from e
                    ctx.clock.sleep(pause)
                    continue
            if _gateway_down(ctx):
                raise _Hold from e
            return Failure(e, n, first, failed_at)


def _dead_letter(ctx: _Ctx, msg: Any, failure: Failure) -> None:
    tries = 0
    while True:
        try:
            publish_dead_letter(ctx.producer, msg, failure, topic=ctx.settings.dead_letter_topic,
                                group_id=ctx.settings.group_id, service=ctx.settings.service,
                                timeout_seconds=ctx.settings.dead_letter_timeout_seconds)
            break
        except DeadLetterWriteFailed as e:
            if ctx.should_stop():
                raise _Stop from e
            tries += 1
            ctx.clock.sleep(_wait(ctx, min(tries, 6)))
    if ctx.metrics is not None:
        ctx.metrics.dead_lettered(type(failure.error).__name__)


def _handle(ctx: _Ctx, msg: Any) -> bool:
    """True when finished and committed; False when the gateway is down (hold it)."""
    key = msg.key()
    state = _park_state(ctx, key) if key is not None else None
    fp = _sha(msg.value())
    replayed = _is_replay(msg)
    if state is not None and not (replayed and (state[1] is None or state[1] == fp)):
        now = ctx.clock.now()
        _dead_letter(ctx, msg, Failure(KeyParked(f"key {key!r} is parked behind an earlier "
                                                 "dead letter"), 0, now, now))
        _park(ctx, msg, 0 if replayed else 1, None)
        ctx.consumer.commit(message=msg, asynchronous=False)
        return True
    try:
        failure = _attempt(ctx, msg, release=state is not None)
    except _Hold:
        return False
    if failure is not None:
        _dead_letter(ctx, msg, failure)
        if key is not None:
            _park(ctx, msg, 0 if state is not None else 1, fp)
    ctx.consumer.commit(message=msg, asynchronous=False)
    return True


def run(consumer: Any, producer: Any, engine: Engine, downstream: Downstream,
        settings: Settings, *, clock: Clock = SYSTEM_CLOCK, metrics: Any = None,
        should_stop: Callable[[], bool] = lambda: False) -> None:
    ctx = _Ctx(consumer, producer, engine, downstream, settings, clock, metrics, should_stop,
               random.Random(os.urandom(32)))
    open_s = settings.breaker.open_seconds
    held = None
    probe_at = 0.0
    try:
        while not should_stop():
            if held is None:
                msg = consumer.poll(0.25)
                if msg is None:
                    continue
                if msg.error():
                    if msg.error().code() == KafkaError._PARTITION_EOF:
                        continue
                    raise KafkaException(msg.error())
            else:
                stray = consumer.poll(0.05)  # paused: stays in the group, fetches nothing
                if stray is not None and not stray.error():
                    consumer.seek(TopicPartition(stray.topic(), stray.partition(),
                                                 stray.offset()))
                left = probe_at - clock.monotonic()
                if left > 0:
                    if should_stop():
                        return
                    clock.sleep(min(left, 0.5))
                    continue
                if _gateway_down(ctx):
                    probe_at = clock.monotonic() + open_s
                    continue
                consumer.resume(consumer.assignment())
                msg, held = held, None
            if not _handle(ctx, msg):
                consumer.pause(consumer.assignment())
                held = msg
                probe_at = clock.monotonic() + open_s
    except _Stop:
        return
