"""The payment-event consumer: applies each event once, dead-letters what can never be
applied, retries what might, and pauses while the gateway is down for everyone.

Per record, in order: park it if its key is parked; parse it; authorise it with the gateway
and book it, retrying transient failures in place; dead-letter it when that cannot work;
commit its offset only after it was booked or the DLT acknowledged it.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError, KafkaException
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
    RetryPolicy,
    Settings,
    apply_payment,
    parse_event,
)
from sqlalchemy import Engine, text

POLL_SECONDS = 0.1
PAUSED_POLL_SECONDS = 0.05
PAUSED_NAP_SECONDS = 1.0  # between polls while the circuit is open: far below the interval


def consumer_config(base: dict[str, Any], settings: Settings) -> dict[str, Any]:
    """The source consumer's config: `base` (bootstrap, tuning) kept, plus what this
    consumer needs: its group, manual commits, and the poll interval the retries fit in."""
    return {**base, "group.id": settings.group_id, "enable.auto.commit": False,
            "max.poll.interval.ms": settings.max_poll_interval_ms}


def producer_config(base: dict[str, Any]) -> dict[str, Any]:
    """The dead-letter producer's config: every replica acknowledges, and each record leaves
    at once (the consumer waits for its acknowledgement before it moves on)."""
    return {**base, "acks": "all", "linger.ms": 0}


def apply_once(engine: Engine, event: PaymentEvent) -> bool:
    """Book `event` unless it was booked before: the marker and the effect commit together.

    Returns:
        True when the effect was applied now, False for a duplicate.
    """
    with engine.begin() as conn:
        inserted = conn.execute(
            text("INSERT INTO processed_events (event_id) VALUES (:event_id) "
                 "ON CONFLICT DO NOTHING"), {"event_id": event.event_id}).rowcount
        if inserted == 0:
            return False  # a concurrent twin waited for our commit and lost, or a redelivery
        apply_payment(conn, event)
    return True


def backoff_seconds(policy: RetryPolicy, retry: int, rng: random.Random) -> float:
    """The wait before retry number `retry` (1, 2, …): bounded exponential, ± jitter."""
    nominal = min(policy.max_backoff_seconds,
                  policy.initial_backoff_seconds * policy.multiplier ** (retry - 1))
    return nominal * rng.uniform(1 - policy.jitter, 1 + policy.jitter)


class _Stopped(Exception):
    """should_stop() said so while a record was still unfinished: leave it uncommitted."""


class _Hold(Exception):
    """The gateway is down for everyone: keep the record, pause, and try it later."""


class CircuitBreaker:
    """Open while the gateway is down for everyone; a ping() every open_seconds probes it."""

    def __init__(self, open_seconds: float, clock: Clock) -> None:
        self.open_seconds = open_seconds
        self.clock = clock
        self.opened_at: float | None = None

    @property
    def is_open(self) -> bool:
        return self.opened_at is not None

    def open(self) -> None:
        self.opened_at = self.clock.monotonic()

    def close(self) -> None:
        self.opened_at = None

    def seconds_to_probe(self) -> float:
        assert self.opened_at is not None
        return max(0.0, self.opened_at + self.open_seconds - self.clock.monotonic())


class PaymentConsumer:
    """One consumer loop; `run()` below is its documented entry point."""

    def __init__(self, consumer: Any, producer: Any, engine: Engine, downstream: Downstream,
                 settings: Settings, clock: Clock, metrics: Any,
                 should_stop: Callable[[], bool]) -> None:
        self.consumer = consumer
        self.producer = producer
        self.engine = engine
        self.downstream = downstream
        self.settings = settings
        self.clock = clock
        self.metrics = metrics
        self.should_stop = should_stop
        self.breaker = CircuitBreaker(settings.breaker.open_seconds, clock)
        self.rng = random.Random()

    # -- the loop -------------------------------------------------------------------------
    def run(self) -> None:
        held = None
        try:
            while not self.should_stop():
                if held is not None:
                    held = self.wait_for_gateway(held)
                    continue
                msg = self.consumer.poll(POLL_SECONDS)
                if msg is None:
                    continue
                if msg.error():
                    if msg.error().code() == KafkaError._PARTITION_EOF:
                        continue
                    raise KafkaException(msg.error())
                held = self.handle(msg)
        except _Stopped:
            return

    def wait_for_gateway(self, held: Any) -> Any:
        """The circuit is open: keep polling (paused, so nothing arrives) to stay in the group,
        and ping the gateway every open_seconds. Returns the record still held, or None."""
        stray = self.consumer.poll(PAUSED_POLL_SECONDS)
        if stray is not None and not stray.error():  # fetched before the pause took hold
            from confluent_kafka import TopicPartition

            self.consumer.seek(TopicPartition(stray.topic(), stray.partition(), stray.offset()))
        wait = self.breaker.seconds_to_probe()
        if wait > 0:
            self.clock.sleep(min(wait, PAUSED_NAP_SECONDS))
            return held
        try:
            self.downstream.ping()
        except Exception:
            self.breaker.open()  # still down: another open period
            return held
        self.breaker.close()
        self.consumer.resume(self.consumer.assignment())
        return self.handle(held)

    # -- one record -----------------------------------------------------------------------
    def handle(self, msg: Any) -> Any:
        """Finish `msg` (booked or dead-lettered, then committed) and return None, or return
        it when the gateway is down and the consumer must hold it."""
        parked = self.parked_state(msg)
        if parked is not None and not self.may_leave_the_park(msg, parked):
            now = self.clock.now()
            error = KeyParked(f"key {msg.key()!r} is parked: an earlier message of this key "
                              "is in the dead-letter topic")
            self.dead_letter(msg, Failure(error, 0, now, now))
            self.note_parked(msg, waiting_delta=0 if self.is_replay(msg) else 1)
            self.commit(msg)
            return None
        try:
            failure = self.process(msg)
        except _Hold:
            self.consumer.pause(self.consumer.assignment())
            return msg
        if failure is not None:
            self.dead_letter(msg, failure)
            if msg.key() is not None:
                # a replayed head that failed again stays the head; a new failure parks its key
                self.note_parked(msg, waiting_delta=0 if parked is not None else 1,
                                 head=fingerprint(msg.value()))
        elif parked is not None:
            self.note_left_the_park(msg)
        self.commit(msg)
        return None

    def process(self, msg: Any) -> Failure | None:
        """Parse, authorise and book; None when booked (or already booked)."""
        first = self.clock.now()
        try:
            event = parse_event(msg.value())
        except PermanentError as error:
            return Failure(error, 1, first, first)
        policy = self.settings.retry
        budget = self.settings.max_poll_interval_ms / 1000 / 2  # well inside the poll interval
        started = self.clock.monotonic()
        attempt = 0
        while True:
            attempt += 1
            try:
                self.downstream.authorize(event)
                apply_once(self.engine, event)
                return None
            except PermanentError as error:
                return Failure(error, attempt, first, self.clock.now())
            except Exception as error:  # transient, or a bug a later attempt may not hit
                last = self.clock.now()
                delay = backoff_seconds(policy, attempt, self.rng)
                spent = self.clock.monotonic() - started
                if attempt < policy.max_attempts and spent + delay <= budget:
                    if self.should_stop():
                        raise _Stopped from error
                    self.clock.sleep(delay)
                    continue
                if self.gateway_is_down():
                    self.breaker.open()
                    raise _Hold from error
                return Failure(error, attempt, first, last)

    def gateway_is_down(self) -> bool:
        try:
            self.downstream.ping()
        except Exception:
            return True
        return False

    def dead_letter(self, msg: Any, failure: Failure) -> None:
        """Write to the DLT until the broker acknowledges it; never return before that."""
        retry = 0
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
                    raise _Stopped from error  # uncommitted: it is redelivered next time
                retry += 1
                self.clock.sleep(backoff_seconds(self.settings.retry, min(retry, 8), self.rng))
        if self.metrics is not None:
            self.metrics.dead_lettered(type(failure.error).__name__)

    def commit(self, msg: Any) -> None:
        self.consumer.commit(message=msg, asynchronous=False)

    # -- parked keys (stage order-per-key) --------------------------------------------------
    @staticmethod
    def is_replay(msg: Any) -> bool:
        return any(k == REPLAY_COUNT for k, _ in (msg.headers() or []))

    def parked_state(self, msg: Any) -> tuple[int, str | None] | None:
        if msg.key() is None:
            return None
        with self.engine.connect() as conn:
            row = conn.execute(text("SELECT waiting, head_fingerprint FROM parked_keys "
                                    "WHERE key = :key"), {"key": msg.key()}).first()
        return None if row is None else (row[0], row[1])

    def may_leave_the_park(self, msg: Any, parked: tuple[int, str | None]) -> bool:
        """Only a replayed copy of the key's head may go through; everything else waits."""
        _, head = parked
        return self.is_replay(msg) and (head is None or head == fingerprint(msg.value()))

    # A change of the parked state is claimed by the record's position in the source topic
    # (topic, partition, offset: offsets of two partitions do not compare, and a replayed copy
    # has a position of its own) in the same transaction: a redelivery claims nothing.
    @staticmethod
    def _claim(conn: Any, msg: Any) -> bool:
        return conn.execute(text(
            "INSERT INTO parked_key_changes (source_topic, source_partition, source_offset) "
            "VALUES (:topic, :partition, :offset) ON CONFLICT DO NOTHING"),
            {"topic": msg.topic(), "partition": msg.partition(),
             "offset": msg.offset()}).rowcount == 1

    def note_parked(self, msg: Any, *, waiting_delta: int, head: str | None = None) -> None:
        with self.engine.begin() as conn:
            if not self._claim(conn, msg):
                return  # counted by an earlier delivery of this record
            conn.execute(text(
                "INSERT INTO parked_keys (key, waiting, head_fingerprint) "
                "VALUES (:key, :delta, :head) "
                "ON CONFLICT (key) DO UPDATE SET "
                "waiting = parked_keys.waiting + EXCLUDED.waiting, "
                "head_fingerprint = COALESCE(EXCLUDED.head_fingerprint, "
                "parked_keys.head_fingerprint)"),
                {"key": msg.key(), "delta": waiting_delta, "head": head})

    def note_left_the_park(self, msg: Any) -> None:
        """A replayed message of a parked key was booked (or found booked): one fewer waits;
        the next replayed message is the new head; the key is free once none waits."""
        with self.engine.begin() as conn:
            if not self._claim(conn, msg):
                return
            left = conn.execute(text(
                "UPDATE parked_keys SET waiting = GREATEST(waiting - 1, 0), "
                "head_fingerprint = NULL WHERE key = :key RETURNING waiting"),
                {"key": msg.key()}).scalar()
            if left is not None and left <= 0:
                conn.execute(text("DELETE FROM parked_keys WHERE key = :key"),
                             {"key": msg.key()})


def run(consumer: Any, producer: Any, engine: Engine, downstream: Downstream,
        settings: Settings, *, clock: Clock = SYSTEM_CLOCK, metrics: Any = None,
        should_stop: Callable[[], bool] = lambda: False) -> None:
    """Consume settings.source_topic until should_stop() returns True.

    Args:
        consumer: a confluent-kafka Consumer built from consumer_config(), already assigned
            (or subscribed to) the source topic's partitions.
        producer: a confluent-kafka Producer built from producer_config(), for the DLT.
        engine: the database with schema.sql applied.
        downstream: the payment gateway (authorize, ping).
        settings: names, limits and policies.
        clock: every wait and timestamp goes through it.
        metrics: a metrics.DeadLetterMetrics, told about every acknowledged DLT write.
        should_stop: asked at least once per poll and before every wait; when it returns
            True, return soon, leaving an unfinished record uncommitted.
    """
    PaymentConsumer(consumer, producer, engine, downstream, settings, clock, metrics,
                    should_stop).run()
