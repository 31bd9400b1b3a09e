"""The payment consumer, with parked keys kept per dead-lettered message.

A key is parked while dead_lettered_messages has an unreleased row for it. Its head is the
oldest such row; only a replayed copy whose value matches the head is processed, and when
it is booked the head is released IN THE SAME TRANSACTION as the booking, so a crash can
never leave a booked head unreleased (or a released head unbooked).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicPartition
from deadletter import (
    REPLAY_COUNT,
    DeadLetterWriteFailed,
    Failure,
    fingerprint,
    publish_dead_letter,
)
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
    return base | {"group.id": settings.group_id, "enable.auto.commit": False,
                   "max.poll.interval.ms": settings.max_poll_interval_ms}


def producer_config(base: dict[str, Any]) -> dict[str, Any]:
    return base | {"acks": -1}  # -1 == all


def _book(conn: Connection, event: PaymentEvent) -> bool:
    claimed = conn.execute(text(
        "INSERT INTO processed_events (event_id) VALUES (:id) "
        "ON CONFLICT (event_id) DO NOTHING RETURNING event_id"), {"id": event.event_id}).first()
    if claimed is None:
        return False
    apply_payment(conn, event)
    return True


def apply_once(engine: Engine, event: PaymentEvent) -> bool:
    with engine.begin() as conn:
        return _book(conn, event)


@dataclass(frozen=True)
class Head:
    partition: int
    offset: int
    sha: str


class _Stop(Exception):
    pass


class _GatewayDown(Exception):
    pass


class Loop:
    def __init__(self, consumer: Any, producer: Any, engine: Engine, downstream: Downstream,
                 settings: Settings, clock: Clock, metrics: Any,
                 should_stop: Callable[[], bool]) -> None:
        self.c, self.p, self.db, self.gw = consumer, producer, engine, downstream
        self.s, self.clock, self.metrics, self.should_stop = settings, clock, metrics, should_stop
        self.rng = random.SystemRandom()
        self.next_probe: float | None = None  # set while the circuit is open

    # -- loop ---------------------------------------------------------------------------
    def run(self) -> None:
        pending = None
        try:
            while not self.should_stop():
                if pending is not None:
                    pending = self.while_open(pending)
                    continue
                msg = self.c.poll(0.2)
                if msg is None:
                    continue
                if msg.error():
                    if msg.error().code() == KafkaError._PARTITION_EOF:
                        continue
                    raise KafkaException(msg.error())
                pending = self.one(msg)
        except _Stop:
            return

    def while_open(self, msg: Any) -> Any:
        early = self.c.poll(0.1)
        if early is not None and not early.error():
            self.c.seek(TopicPartition(early.topic(), early.partition(), early.offset()))
        assert self.next_probe is not None
        remaining = self.next_probe - self.clock.monotonic()
        if remaining > 0:
            self.clock.sleep(min(remaining, 0.5))
            return msg
        try:
            self.gw.ping()
        except Exception:  # noqa: BLE001
            self.next_probe = self.clock.monotonic() + self.s.breaker.open_seconds
            return msg
        self.next_probe = None
        self.c.resume(self.c.assignment())
        return self.one(msg)

    # -- one record ---------------------------------------------------------------------
    def one(self, msg: Any) -> Any:
        head = self.head_of(msg)
        replayed = any(k == REPLAY_COUNT for k, _ in (msg.headers() or []))
        if head is not None and not (replayed and head.sha == fingerprint(msg.value())):
            now = self.clock.now()
            self.to_dlt(msg, Failure(KeyParked(
                f"key {msg.key()!r} waits for an earlier message in the dead-letter topic"),
                0, now, now))
            if not replayed:
                self.remember(msg)
            self.c.commit(message=msg, asynchronous=False)
            return None
        try:
            failure = self.attempt(msg, head)
        except _GatewayDown:
            self.c.pause(self.c.assignment())
            self.next_probe = self.clock.monotonic() + self.s.breaker.open_seconds
            return msg
        if failure is not None:
            self.to_dlt(msg, failure)
            if head is None and msg.key() is not None:
                self.remember(msg)  # a replayed head that failed again is still the head
        self.c.commit(message=msg, asynchronous=False)
        return None

    def attempt(self, msg: Any, head: Head | None) -> Failure | None:
        t0 = self.clock.now()
        try:
            event = parse_event(msg.value())
        except PermanentError as exc:
            return Failure(exc, 1, t0, t0)
        retry = self.s.retry
        until = self.clock.monotonic() + self.s.max_poll_interval_ms / 1000 / 2
        first_fail = None
        n = 0
        while True:
            n += 1
            try:
                self.gw.authorize(event)
                with self.db.begin() as conn:
                    _book(conn, event)
                    if head is not None:
                        self.release(conn, head, msg)
                return None
            except PermanentError as exc:
                now = self.clock.now()
                return Failure(exc, n, first_fail or now, now)
            except Exception as exc:  # noqa: BLE001 - transient or a bug: try again
                now = self.clock.now()
                first_fail = first_fail or now
                base = min(retry.max_backoff_seconds,
                           retry.initial_backoff_seconds * retry.multiplier ** (n - 1))
                pause = base * self.rng.uniform(1 - retry.jitter, 1 + retry.jitter)
                if n < retry.max_attempts and self.clock.monotonic() + pause <= until:
                    if self.should_stop():
                        raise _Stop from exc
                    self.clock.sleep(pause)
                    continue
                try:
                    self.gw.ping()
                except Exception:  # noqa: BLE001
                    raise _GatewayDown from exc
                return Failure(exc, n, first_fail, now)

    def to_dlt(self, msg: Any, failure: Failure) -> None:
        delay = self.s.retry.initial_backoff_seconds
        while True:
            try:
                publish_dead_letter(self.p, msg, failure, topic=self.s.dead_letter_topic,
                                    group_id=self.s.group_id, service=self.s.service,
                                    timeout_seconds=self.s.dead_letter_timeout_seconds)
            except DeadLetterWriteFailed as exc:
                if self.should_stop():
                    raise _Stop from exc
                self.clock.sleep(delay * self.rng.uniform(0.8, 1.2))
                delay = min(delay * 2, self.s.retry.max_backoff_seconds)
                continue
            if self.metrics is not None:
                self.metrics.dead_lettered(type(failure.error).__name__)
            return

    # -- parked keys --------------------------------------------------------------------
    def head_of(self, msg: Any) -> Head | None:
        if msg.key() is None:
            return None
        with self.db.connect() as conn:
            done = conn.execute(text(
                "SELECT 1 FROM dead_lettered_messages WHERE released_partition = :p "
                "AND released_offset = :o"), {"p": msg.partition(), "o": msg.offset()}).first()
            if done is not None:
                return None  # this very record released its head already (a redelivery)
            row = conn.execute(text(
                "SELECT src_partition, src_offset, value_sha256 FROM dead_lettered_messages "
                "WHERE record_key = :k AND released_offset IS NULL ORDER BY seq LIMIT 1"),
                {"k": msg.key()}).first()
        return None if row is None else Head(row[0], row[1], row[2])

    def remember(self, msg: Any) -> None:
        with self.db.begin() as conn:
            conn.execute(text(
                "INSERT INTO dead_lettered_messages "
                "(src_partition, src_offset, record_key, value_sha256) "
                "VALUES (:p, :o, :k, :sha) ON CONFLICT DO NOTHING"),
                {"p": msg.partition(), "o": msg.offset(), "k": msg.key(),
                 "sha": fingerprint(msg.value())})

    @staticmethod
    def release(conn: Connection, head: Head, msg: Any) -> None:
        conn.execute(text(
            "UPDATE dead_lettered_messages SET released_partition = :rp, released_offset = :ro "
            "WHERE src_partition = :p AND src_offset = :o AND released_offset IS NULL"),
            {"rp": msg.partition(), "ro": msg.offset(), "p": head.partition, "o": head.offset})
        conn.execute(text(
            "DELETE FROM dead_lettered_messages d WHERE d.record_key = :k AND NOT EXISTS ("
            "SELECT 1 FROM dead_lettered_messages w WHERE w.record_key = :k "
            "AND w.released_offset IS NULL)"), {"k": msg.key()})


def run(consumer: Any, producer: Any, engine: Engine, downstream: Downstream,
        settings: Settings, *, clock: Clock = SYSTEM_CLOCK, metrics: Any = None,
        should_stop: Callable[[], bool] = lambda: False) -> None:
    Loop(consumer, producer, engine, downstream, settings, clock, metrics, should_stop).run()
