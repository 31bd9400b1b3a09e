"""The payment-event consumer: applies each event once, dead-letters what can never be
applied, retries what might, and pauses while the gateway is down for everyone.

Per record, in order: (stage order-per-key: park it if its key is parked;) parse it;
authorise it with the gateway and book it, retrying transient failures in place;
dead-letter it when that cannot work; commit its offset only after it was booked or the DLT
acknowledged it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from payments import SYSTEM_CLOCK, Clock, Downstream, PaymentEvent, Settings
from sqlalchemy import Engine


def consumer_config(base: dict[str, Any], settings: Settings) -> dict[str, Any]:
    """The source consumer's config: every setting of `base` kept, plus what this consumer
    needs (its group, manual commits, the poll interval its retries fit in)."""
    raise NotImplementedError(
        "consumer_config: return {**base, 'group.id': settings.group_id, "
        "'enable.auto.commit': False, 'max.poll.interval.ms': settings.max_poll_interval_ms}")


def producer_config(base: dict[str, Any]) -> dict[str, Any]:
    """The dead-letter producer's config: every setting of `base` kept (acks and linger.ms
    may change), acks from every replica."""
    raise NotImplementedError(
        "producer_config: return {**base, 'acks': 'all', 'linger.ms': 0}")


def apply_once(engine: Engine, event: PaymentEvent) -> bool:
    """Book `event` unless it was booked before: the processed_events marker and the effect
    (payments.apply_payment) commit in one transaction.

    Returns:
        True when the effect was applied now, False for a duplicate.
    """
    raise NotImplementedError(
        "apply_once: for a first version, `with engine.begin() as conn: "
        "apply_payment(conn, event)` and return True; stage idempotent-effect adds the "
        "processed_events marker in the same transaction")


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
        clock: every wait and timestamp goes through it (clock.sleep, clock.now,
            clock.monotonic; never time.sleep).
        metrics: a metrics.DeadLetterMetrics (or None), told about every acknowledged DLT
            write (stage visibility).
        should_stop: ask it at least once per poll and before every wait; when it returns
            True, return soon, leaving an unfinished record uncommitted.
    """
    raise NotImplementedError(
        "run: loop until should_stop(): msg = consumer.poll(0.1); skip None and "
        "_PARTITION_EOF; parse_event(msg.value()); on a PermanentError dead-letter it; "
        "else downstream.authorize(event) and apply_once(engine, event), retrying other "
        "errors with backoff; then consumer.commit(message=msg, asynchronous=False)")
