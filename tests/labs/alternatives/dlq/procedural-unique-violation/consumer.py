"""The payment-event consumer, written as a few plain functions around one loop.

Per record: if its key is held, it follows its head into the DLT; otherwise parse,
authorise, book (retrying transient failures in place, inside a deadline of half the poll
interval); dead-letter what cannot work; commit only after the booking committed or the
DLT acknowledged. When the retries run out and the gateway's ping fails too, the record is
held, the assignment paused, and the gateway probed every open_seconds.
"""

from __future__ import annotations

import enum
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicPartition
from deadletter import (
    REPLAY_COUNT,
    DeadLetterWriteFailed,
    Failure,
    publish_dead_letter,
    sha256_of,
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
from sqlalchemy.exc import IntegrityError

UNIQUE_VIOLATION = "23505"


def consumer_config(base: dict[str, Any], settings: Settings) -> dict[str, Any]:
    config = dict(base)
    config.update({
        "group.id": settings.group_id,
        "enable.auto.commit": "false",
        "enable.auto.offset.store": "false",  # nothing is stored behind our back either
        "max.poll.interval.ms": str(settings.max_poll_interval_ms),
    })
    return config


def producer_config(base: dict[str, Any]) -> dict[str, Any]:
    config = dict(base)
    config.update({"acks": "all", "linger.ms": 0, "enable.idempotence": True})
    return config


# -- booking ------------------------------------------------------------------------------

def apply_once(engine: Engine, event: PaymentEvent) -> bool:
    """Claim the event id and book it in one transaction. The claim is a plain INSERT: a
    twin's INSERT waits on our uncommitted key, then fails with unique_violation and its
    whole transaction (nothing booked yet) rolls back."""
    try:
        with engine.begin() as conn:
            conn.execute(text("INSERT INTO processed_events (event_id, account, kind) "
                              "VALUES (:id, :account, :kind)"),
                         {"id": event.event_id, "account": event.account, "kind": event.kind})
            apply_payment(conn, event)
    except IntegrityError as exc:
        if getattr(exc.orig, "sqlstate", None) == UNIQUE_VIOLATION and \
                "processed_events" in str(exc.orig):
            return False
        raise
    return True


# -- retry schedule ----------------------------------------------------------------------

def waits(policy: RetryPolicy, rng: random.Random) -> Iterator[float]:
    """The waits before retry 1, 2, …: min(cap, initial·mult^(n−1)) × U[1−j, 1+j]."""
    nominal = policy.initial_backoff_seconds
    while True:
        capped = nominal if nominal < policy.max_backoff_seconds else policy.max_backoff_seconds
        yield capped * rng.uniform(1.0 - policy.jitter, 1.0 + policy.jitter)
        nominal *= policy.multiplier


class Outcome(enum.Enum):
    BOOKED = "booked"
    FAILED = "failed"
    HOLD = "hold"
    STOPPED = "stopped"


@dataclass
class Result:
    outcome: Outcome
    failure: Failure | None = None


@dataclass
class Context:
    consumer: Any
    producer: Any
    engine: Engine
    downstream: Downstream
    settings: Settings
    clock: Clock
    metrics: Any
    should_stop: Callable[[], bool]
    rng: random.Random


def attempt_record(ctx: Context, event: PaymentEvent) -> Result:
    policy = ctx.settings.retry
    deadline = ctx.clock.monotonic() + ctx.settings.max_poll_interval_ms / 2000.0
    schedule = waits(policy, ctx.rng)
    first_failed: float | None = None
    tries = 0
    while True:
        tries += 1
        try:
            ctx.downstream.authorize(event)
            apply_once(ctx.engine, event)
            return Result(Outcome.BOOKED)
        except PermanentError as error:
            at = ctx.clock.now()
            return Result(Outcome.FAILED, Failure(error, tries, first_failed or at, at))
        except Exception as error:  # noqa: BLE001 - transient, or a bug: both may pass later
            at = ctx.clock.now()
            if first_failed is None:
                first_failed = at
            wait = next(schedule)
            if tries < policy.max_attempts and ctx.clock.monotonic() + wait <= deadline:
                if ctx.should_stop():
                    return Result(Outcome.STOPPED)
                ctx.clock.sleep(wait)
                continue
            try:
                ctx.downstream.ping()
            except Exception:  # noqa: BLE001 - down for everyone: hold, do not dead-letter
                return Result(Outcome.HOLD)
            return Result(Outcome.FAILED, Failure(error, tries, first_failed, at))


def write_dead_letter(ctx: Context, msg: Any, failure: Failure) -> bool:
    """True once the DLT acknowledged; False when told to stop first."""
    schedule = waits(ctx.settings.retry, ctx.rng)
    while True:
        try:
            publish_dead_letter(ctx.producer, msg, failure,
                                topic=ctx.settings.dead_letter_topic,
                                group_id=ctx.settings.group_id, service=ctx.settings.service,
                                timeout_seconds=ctx.settings.dead_letter_timeout_seconds)
        except DeadLetterWriteFailed:
            if ctx.should_stop():
                return False
            ctx.clock.sleep(next(schedule))
            continue
        if ctx.metrics is not None:
            ctx.metrics.dead_lettered(failure.error.__class__.__name__)
        return True


# -- held accounts (order per key) ---------------------------------------------------------

def replayed(msg: Any) -> bool:
    return any(name == REPLAY_COUNT for name, _ in (msg.headers() or ()))


def held_state(ctx: Context, msg: Any) -> tuple[int, bytes | None] | None:
    if msg.key() is None:
        return None
    with ctx.engine.connect() as conn:
        row = conn.execute(text("SELECT pending, head_sha256 FROM held_accounts "
                                "WHERE record_key = :k"), {"k": msg.key()}).one_or_none()
    return None if row is None else (row.pending, row.head_sha256)


_GUARD = "(held_accounts.guard_partition <> :p OR held_accounts.guard_offset < :o)"


def hold_more(ctx: Context, msg: Any, added: int, head: bytes | None) -> None:
    """The key's record went to the DLT: `added` more wait; `head` (if given) comes first."""
    with ctx.engine.begin() as conn:
        conn.execute(text(
            "INSERT INTO held_accounts AS h (record_key, pending, head_sha256, guard_partition, "
            "guard_offset) VALUES (:k, :n, :head, :p, :o) "
            "ON CONFLICT (record_key) DO UPDATE SET pending = h.pending + :n, "
            "head_sha256 = COALESCE(:head, h.head_sha256), guard_partition = :p, "
            "guard_offset = :o, updated_at = now() WHERE " + _GUARD.replace("held_accounts", "h")),
            {"k": msg.key(), "n": added, "head": head, "p": msg.partition(), "o": msg.offset()})


def release_one(ctx: Context, msg: Any) -> None:
    """A replayed record of the key was booked: one fewer waits, the next replayed is head."""
    with ctx.engine.begin() as conn:
        left = conn.execute(text(
            "UPDATE held_accounts SET pending = pending - 1, head_sha256 = NULL, "
            "guard_partition = :p, guard_offset = :o, updated_at = now() "
            "WHERE record_key = :k AND " + _GUARD + " RETURNING pending"),
            {"k": msg.key(), "p": msg.partition(), "o": msg.offset()}).scalar_one_or_none()
        if left is not None and left <= 0:
            conn.execute(text("DELETE FROM held_accounts WHERE record_key = :k AND pending <= 0"),
                         {"k": msg.key()})


# -- one record ----------------------------------------------------------------------------

def settle(ctx: Context, msg: Any) -> Outcome:
    """Bring `msg` to an end (booked or acknowledged by the DLT, then committed): BOOKED or
    FAILED. HOLD: gateway down for everyone. STOPPED: left uncommitted on purpose."""
    held = held_state(ctx, msg)
    if held is not None:
        pending, head = held
        if not (replayed(msg) and (head is None or head == sha256_of(msg.value()))):
            at = ctx.clock.now()
            parked = KeyParked(f"key {msg.key()!r} is held: an earlier message of it waits "
                               "in the dead-letter topic")
            if not write_dead_letter(ctx, msg, Failure(parked, 0, at, at)):
                return Outcome.STOPPED
            hold_more(ctx, msg, 0 if replayed(msg) else 1, None)
            ctx.consumer.commit(message=msg, asynchronous=False)
            return Outcome.FAILED
    try:
        event = parse_event(msg.value())
    except PermanentError as error:
        at = ctx.clock.now()
        result = Result(Outcome.FAILED, Failure(error, 1, at, at))
    else:
        result = attempt_record(ctx, event)
    if result.outcome in (Outcome.HOLD, Outcome.STOPPED):
        return result.outcome
    if result.outcome is Outcome.FAILED:
        assert result.failure is not None
        if not write_dead_letter(ctx, msg, result.failure):
            return Outcome.STOPPED
        if msg.key() is not None:
            hold_more(ctx, msg, 0 if held is not None else 1, sha256_of(msg.value()))
    elif held is not None:
        release_one(ctx, msg)
    ctx.consumer.commit(message=msg, asynchronous=False)
    return result.outcome


def ride_out_outage(ctx: Context, msg: Any) -> Outcome:
    """Paused: poll (to stay in the group; a record fetched before the pause is put back),
    ping every open_seconds, and when the gateway answers, resume and start `msg` over."""
    probe_at = ctx.clock.monotonic() + ctx.settings.breaker.open_seconds
    while not ctx.should_stop():
        stray = ctx.consumer.poll(0.05)
        if stray is not None and stray.error() is None:
            ctx.consumer.seek(TopicPartition(stray.topic(), stray.partition(), stray.offset()))
        now = ctx.clock.monotonic()
        if now < probe_at:
            ctx.clock.sleep(min(probe_at - now, 1.0))
            continue
        try:
            ctx.downstream.ping()
        except Exception:  # noqa: BLE001 - still down
            probe_at = ctx.clock.monotonic() + ctx.settings.breaker.open_seconds
            continue
        ctx.consumer.resume(ctx.consumer.assignment())
        return Outcome.BOOKED  # the caller handles msg again, from its first attempt
    return Outcome.STOPPED


def run(consumer: Any, producer: Any, engine: Engine, downstream: Downstream,
        settings: Settings, *, clock: Clock = SYSTEM_CLOCK, metrics: Any = None,
        should_stop: Callable[[], bool] = lambda: False) -> None:
    """Consume settings.source_topic until should_stop() returns True."""
    ctx = Context(consumer, producer, engine, downstream, settings, clock, metrics,
                  should_stop, random.Random())
    in_hand = None
    while not should_stop():
        if in_hand is None:
            msg = consumer.poll(0.1)
            if msg is None:
                continue
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    continue
                raise KafkaException(err)
            in_hand = msg
        outcome = settle(ctx, in_hand)
        if outcome is Outcome.STOPPED:
            return
        if outcome is Outcome.HOLD:
            consumer.pause(consumer.assignment())
            if ride_out_outage(ctx, in_hand) is Outcome.STOPPED:
                return
            continue  # in_hand stays: tried again from its first attempt
        in_hand = None
