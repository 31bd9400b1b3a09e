"""The payment consumer as an explicit state machine: IDLE (polling) -> WORKING (one record)
-> either IDLE again (booked / dead-lettered, committed) or OPEN (gateway down for everyone:
record held, assignment paused, ping every open_seconds) -> WORKING again from attempt 1.

Booking is one SQL statement (marker, ledger entry and balance in a data-modifying CTE), so
there is no window between the idempotency marker and the effect at all.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicPartition
from deadletter import REPLAY_COUNT, DeadLetterWriteFailed, Failure, digest, publish_dead_letter
from payments import (
    SYSTEM_CLOCK,
    Clock,
    Downstream,
    KeyParked,
    PaymentEvent,
    PermanentError,
    Settings,
    parse_event,
)
from sqlalchemy import Engine, text

BOOK = text("""
WITH marker AS (
    INSERT INTO processed_events (id) VALUES (CAST(:event_id AS uuid))
    ON CONFLICT (id) DO NOTHING
    RETURNING id
), entry AS (
    INSERT INTO ledger_entries (event_id, account, amount_cents)
    SELECT id, :account, :amount FROM marker
    RETURNING account, amount_cents
)
INSERT INTO balances (account, balance_cents)
SELECT account, amount_cents FROM entry
ON CONFLICT (account) DO UPDATE SET balance_cents = balances.balance_cents + EXCLUDED.balance_cents
RETURNING 1
""")


def consumer_config(base: dict[str, Any], settings: Settings) -> dict[str, Any]:
    merged = {key: value for key, value in base.items()}
    merged["group.id"] = settings.group_id
    merged["enable.auto.commit"] = False
    merged["max.poll.interval.ms"] = settings.max_poll_interval_ms
    return merged


def producer_config(base: dict[str, Any]) -> dict[str, Any]:
    merged = {key: value for key, value in base.items()}
    merged["acks"] = "all"
    merged["linger.ms"] = 0
    merged["enable.idempotence"] = True  # a retried DLT write is not written twice
    return merged


def apply_once(engine: Engine, event: PaymentEvent) -> bool:
    """One statement: claim the event id and, only when the claim inserted a row, add the
    ledger entry and move the balance (the same rows payments.apply_payment writes). A twin
    blocks on our uncommitted marker and then inserts nothing, so it books nothing."""
    with engine.begin() as conn:
        booked = conn.execute(BOOK, {"event_id": event.event_id, "account": event.account,
                                     "amount": event.signed_cents}).first()
    return booked is not None


IDLE, WORKING, OPEN = "idle", "working", "open"


class _Interrupted(Exception):
    """should_stop() during a wait: leave the record uncommitted."""


class _DownForEveryone(Exception):
    pass


class StateMachine:
    def __init__(self, consumer: Any, producer: Any, engine: Engine, downstream: Downstream,
                 settings: Settings, clock: Clock, metrics: Any,
                 should_stop: Callable[[], bool]) -> None:
        self.consumer, self.producer, self.engine = consumer, producer, engine
        self.downstream, self.settings, self.clock = downstream, settings, clock
        self.metrics, self.should_stop = metrics, should_stop
        self.random = random.Random()
        self.state = IDLE
        self.record: Any = None
        self.probe_due = 0.0

    def run(self) -> None:
        try:
            while not self.should_stop():
                if self.state == IDLE:
                    self.idle()
                elif self.state == WORKING:
                    self.work()
                else:
                    self.open()
        except _Interrupted:
            return

    # IDLE: one poll
    def idle(self) -> None:
        msg = self.consumer.poll(0.1)
        if msg is None:
            return
        if msg.error() is not None:
            if msg.error().code() == KafkaError._PARTITION_EOF:
                return
            raise KafkaException(msg.error())
        self.record, self.state = msg, WORKING

    # OPEN: paused, probing
    def open(self) -> None:
        early = self.consumer.poll(0.05)
        if early is not None and early.error() is None:
            self.consumer.seek(TopicPartition(early.topic(), early.partition(), early.offset()))
        left = self.probe_due - self.clock.monotonic()
        if left > 0:
            self.clock.sleep(min(left, 1.0))
            return
        try:
            self.downstream.ping()
        except Exception:  # noqa: BLE001
            self.probe_due = self.clock.monotonic() + self.settings.breaker.open_seconds
            return
        self.consumer.resume(self.consumer.assignment())
        self.state = WORKING  # the held record, from its first attempt

    # WORKING: finish self.record
    def work(self) -> None:
        msg = self.record
        parked = self.parked(msg)
        is_replay = any(name == REPLAY_COUNT for name, _ in msg.headers() or [])
        if parked is not None:
            _, head = parked
            if not is_replay or (head is not None and head != digest(msg.value())):
                now = self.clock.now()
                self.dead_letter(msg, Failure(KeyParked(
                    f"key {msg.key()!r} is parked behind an earlier dead letter"), 0, now, now))
                self.park(msg, added=0 if is_replay else 1, head=None)
                self.finish(msg)
                return
        try:
            failure = self.attempts(msg)
        except _DownForEveryone:
            self.consumer.pause(self.consumer.assignment())
            self.probe_due = self.clock.monotonic() + self.settings.breaker.open_seconds
            self.state = OPEN
            return
        if failure is not None:
            self.dead_letter(msg, failure)
            if msg.key() is not None:
                self.park(msg, added=1 if parked is None else 0, head=digest(msg.value()))
        elif parked is not None:
            self.unpark_one(msg)
        self.finish(msg)

    def finish(self, msg: Any) -> None:
        self.consumer.commit(message=msg, asynchronous=False)
        self.record, self.state = None, IDLE

    def attempts(self, msg: Any) -> Failure | None:
        started_at = self.clock.now()
        try:
            event = parse_event(msg.value())
        except PermanentError as error:
            return Failure(error, 1, started_at, started_at)
        policy = self.settings.retry
        window_ends = self.clock.monotonic() + self.settings.max_poll_interval_ms / 2000
        waits = [min(policy.max_backoff_seconds,
                     policy.initial_backoff_seconds * policy.multiplier ** k)
                 for k in range(max(0, policy.max_attempts - 1))]
        first_failure: float | None = None
        for number in range(1, policy.max_attempts + 1):
            try:
                self.downstream.authorize(event)
                apply_once(self.engine, event)
                return None
            except PermanentError as error:
                now = self.clock.now()
                return Failure(error, number, first_failure or now, now)
            except Exception as error:  # noqa: BLE001 - transient or a bug
                now = self.clock.now()
                first_failure = first_failure if first_failure is not None else now
                last_error, last_at = error, now
                if number == policy.max_attempts:
                    break
                wait = waits[number - 1] * self.random.uniform(1 - policy.jitter,
                                                               1 + policy.jitter)
                if self.clock.monotonic() + wait > window_ends:
                    break
                if self.should_stop():
                    raise _Interrupted from error
                self.clock.sleep(wait)
        try:
            self.downstream.ping()
        except Exception as down:  # noqa: BLE001
            raise _DownForEveryone from down
        return Failure(last_error, number, first_failure, last_at)

    def dead_letter(self, msg: Any, failure: Failure) -> None:
        tries = 0
        while True:
            try:
                publish_dead_letter(self.producer, msg, failure,
                                    topic=self.settings.dead_letter_topic,
                                    group_id=self.settings.group_id,
                                    service=self.settings.service,
                                    timeout_seconds=self.settings.dead_letter_timeout_seconds)
                break
            except DeadLetterWriteFailed as error:
                if self.should_stop():
                    raise _Interrupted from error
                tries += 1
                self.clock.sleep(min(30.0, 0.5 * 2 ** min(tries, 6)) *
                                 self.random.uniform(0.8, 1.2))
        if self.metrics is not None:
            self.metrics.dead_lettered(type(failure.error).__name__)

    # -- parked accounts -------------------------------------------------------------------
    def parked(self, msg: Any) -> tuple[int, str | None] | None:
        if msg.key() is None:
            return None
        with self.engine.connect() as conn:
            row = conn.execute(text("SELECT in_dlt, head_digest FROM parked_accounts "
                                    "WHERE key_hex = :k"), {"k": msg.key().hex()}).first()
        return None if row is None else (row.in_dlt, row.head_digest)

    def park(self, msg: Any, *, added: int, head: str | None) -> None:
        with self.engine.begin() as conn:
            conn.execute(text("""
                INSERT INTO parked_accounts AS pa
                    (key_hex, in_dlt, head_digest, last_partition, last_offset)
                VALUES (:k, :added, :head, :p, :o)
                ON CONFLICT (key_hex) DO UPDATE SET
                    in_dlt = pa.in_dlt + EXCLUDED.in_dlt,
                    head_digest = COALESCE(EXCLUDED.head_digest, pa.head_digest),
                    last_partition = EXCLUDED.last_partition,
                    last_offset = EXCLUDED.last_offset
                WHERE pa.last_partition <> EXCLUDED.last_partition
                   OR pa.last_offset < EXCLUDED.last_offset"""),
                {"k": msg.key().hex(), "added": added, "head": head, "p": msg.partition(),
                 "o": msg.offset()})

    def unpark_one(self, msg: Any) -> None:
        with self.engine.begin() as conn:
            left = conn.execute(text("""
                UPDATE parked_accounts SET in_dlt = in_dlt - 1, head_digest = NULL,
                    last_partition = :p, last_offset = :o
                WHERE key_hex = :k AND (last_partition <> :p OR last_offset < :o)
                RETURNING in_dlt"""),
                {"k": msg.key().hex(), "p": msg.partition(), "o": msg.offset()}).scalar()
            if left is not None and left <= 0:
                conn.execute(text("DELETE FROM parked_accounts WHERE key_hex = :k"),
                             {"k": msg.key().hex()})


def run(consumer: Any, producer: Any, engine: Engine, downstream: Downstream,
        settings: Settings, *, clock: Clock = SYSTEM_CLOCK, metrics: Any = None,
        should_stop: Callable[[], bool] = lambda: False) -> None:
    StateMachine(consumer, producer, engine, downstream, settings, clock, metrics,
                 should_stop).run()
