"""Stage crash-safety: kill -9 at the worst moments, and a broker that is not there.
Nothing may be lost; sending twice is allowed (at-least-once)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from _kafka_support import records_table
from _support import (
    MISTAKES,
    READ,
    count,
    insert_event,
    outbox_rows,
    require_table,
)
from confluent_kafka import Producer

from dojo.checks import CheckFailure, call, table
from dojo.checks.faults import SlowProducer, run_in_subprocess, unreachable_bootstrap
from dojo.checks.observers import read_topic

pytestmark = pytest.mark.stage("crash-safety")
SEE = READ["crash-safety"]

CHILD = Path(__file__).with_name("_relay_child.py")
ROW_COLUMNS = ("id", "published_at", "lease_left", "attempt_count", "last_error")
LEASE = 1.0


def crash_relay(outbox: Any, database: Any, learner: Any, kafka: Any, topic: str,
                fault: str) -> Any:
    result = run_in_subprocess(f"{CHILD}:relay_child", database.url,
                               kafka.producer_config(), topic, fault, LEASE,
                               path=[learner.dir], timeout=30)
    return result


def recover(outbox: Any, learner: Any, relay_producer: Any, topic: str) -> list[str]:
    """Run relay_once (a fresh relay, after the crash) until nothing is pending or 6 s."""
    relay = learner.module("relay")
    log = []
    deadline = time.monotonic() + 6
    while time.monotonic() < deadline:
        pending = count(outbox, "SELECT count(*) FROM outbox_event WHERE published_at IS NULL")
        if not pending:
            break
        published = call(relay.relay_once, outbox, relay_producer(), topic, batch_size=10,
                         lease_seconds=30)
        if published:
            log.append(f"a new relay published {published} row(s)")
        time.sleep(0.1)
    return log


def lost_events(outbox: Any, kafka: Any, topic: str, ids: list[str]) -> tuple[list[str], Any]:
    records = read_topic(kafka, topic, 1)
    seen = {r.text("event-id") for r in records}
    return [i for i in ids if i not in seen], records


def test_kill_after_ack_before_mark_sends_again(outbox, database, learner, kafka,
                                                relay_producer):
    require_table(outbox, "outbox_event", "crash-safety")
    topic = kafka.topic(1, hint="crash-ack")
    ids = [insert_event(outbox, created_ago=3.0 - i) for i in range(3)]
    result = crash_relay(outbox, database, learner, kafka, topic, "after-ack")
    if not result.killed:
        raise CheckFailure(
            "The check ran relay_once in a child process and kills it with SIGKILL the moment "
            "the first broker acknowledgement reaches it. It never got that far.",
            expected="the child dies of SIGKILL after the first acknowledgement",
            actual=result.describe(),
            evidence="If relay_once returned normally, it did not wait for any acknowledgement "
                     "(flush() or delivery callbacks).", lesson=SEE)
    after_crash = outbox_rows(outbox)
    history = recover(outbox, learner, relay_producer, topic)
    lost, records = lost_events(outbox, kafka, topic, ids)
    unpublished = outbox_rows(outbox, "published_at IS NULL")
    if lost or unpublished:
        raise CheckFailure(
            "A relay was killed (kill -9) right after the broker acknowledged an event and before "
            "the database heard about it. The rows must still be unpublished with a lease, so "
            "that after the lease expires another relay sends them again: a duplicate in Kafka "
            "(the consumer deduplicates), never a loss.",
            expected=f"all {len(ids)} events in the topic (some twice) and every row published",
            actual=f"LOST {len(lost)} event(s) {lost}; {len(unpublished)} row(s) never published",
            evidence="rows right after the crash:\n" + table(after_crash, ROW_COLUMNS) +
                     "\nthen: " + ("; ".join(history) or "no relay_once published anything") +
                     "\nrows now:\n" + table(outbox_rows(outbox), ROW_COLUMNS) +
                     "\ntopic:\n" + records_table(records), lesson=SEE)


def test_kill_before_send_loses_nothing(outbox, database, learner, kafka, relay_producer):
    require_table(outbox, "outbox_event", "crash-safety")
    topic = kafka.topic(1, hint="crash-send")
    ids = [insert_event(outbox, created_ago=3.0 - i) for i in range(3)]
    result = crash_relay(outbox, database, learner, kafka, topic, "before-send")
    if not result.killed:
        raise CheckFailure(
            "The check kills the relay (SIGKILL) as it calls producer.produce() for the first "
            "time. It never called produce().",
            expected="the child dies of SIGKILL at the first produce()", actual=result.describe(),
            lesson=SEE)
    after_crash = outbox_rows(outbox)
    marked_early = [r for r in after_crash if r["published_at"] is not None]
    history = recover(outbox, learner, relay_producer, topic)
    lost, records = lost_events(outbox, kafka, topic, ids)
    if lost:
        raise CheckFailure(
            "The relay was killed before it sent anything, yet some rows were already marked "
            "published: those events are LOST — the database says sent, Kafka never had them, "
            "and no relay will ever try again. Mark a row only after the broker acknowledged it.",
            expected=f"all {len(ids)} events in the topic after the {LEASE:.0f} s lease expired",
            actual=f"LOST {len(lost)} event(s); {len(marked_early)} row(s) were marked published "
                   "before the send",
            evidence="rows right after the crash:\n" + table(after_crash, ROW_COLUMNS) +
                     "\nthen: " + ("; ".join(history) or "no relay_once published anything") +
                     "\ntopic:\n" + records_table(records), lesson=MISTAKES)


def test_unreachable_broker_marks_nothing(outbox, learner, kafka):
    require_table(outbox, "outbox_event", "crash-safety")
    relay = learner.module("relay")
    for i in range(3):
        insert_event(outbox, created_ago=3.0 - i)
    base = kafka.producer_config(**{"bootstrap.servers": unreachable_bootstrap(),
                                    "message.timeout.ms": 500, "log_level": 0})
    producer = Producer(call(relay.producer_config, base))
    started = time.monotonic()
    try:
        published = call(relay.relay_once, outbox, producer, "dojo.unreachable", batch_size=10,
                         lease_seconds=30, ack_timeout_seconds=5)
    finally:
        producer.flush(0)
    took = time.monotonic() - started
    rows = outbox_rows(outbox)
    marked = [r for r in rows if r["published_at"] is not None]
    if marked or published:
        raise CheckFailure(
            "The broker was unreachable (every record timed out after 0.5 s), yet rows were marked "
            "published: those events are lost. Only an acknowledgement may mark a row.",
            expected="relay_once returns 0 and no row has published_at",
            actual=f"relay_once returned {published!r}; {len(marked)} row(s) marked published",
            evidence=table(rows, ROW_COLUMNS), lesson=MISTAKES)
    unrecorded = [r for r in rows if r["attempt_count"] < 1 or not r["last_error"]]
    if unrecorded:
        raise CheckFailure(
            "Each failed send must leave a trace on its row: the attempt counted, the error kept "
            "(that is what an operator reads when the outbox backs up).",
            expected="every row: attempt_count 1, last_error with the delivery error",
            actual=f"{len(unrecorded)} row(s) without attempt_count or last_error",
            evidence=table(rows, ROW_COLUMNS), lesson=SEE)
    if took >= 10:
        raise CheckFailure(
            "relay_once kept waiting for a broker that is not there.",
            expected="it gives up after ack_timeout_seconds (5 s): well under 10 s",
            actual=f"it took {took:.1f} s", lesson=SEE)


def test_no_acknowledgement_in_time_is_a_failure(outbox, learner, kafka, relay_producer):
    require_table(outbox, "outbox_event", "crash-safety")
    relay = learner.module("relay")
    topic = kafka.topic(1, hint="slow-ack")
    for i in range(3):
        insert_event(outbox, created_ago=3.0 - i)
    # The broker takes 1 s to acknowledge; relay_once waits only ack_timeout_seconds=0.3.
    slow = SlowProducer(relay_producer(), delay=1.0)
    published = call(relay.relay_once, outbox, slow, topic, batch_size=10,
                     lease_seconds=30, ack_timeout_seconds=0.3)
    waiting = len(slow)
    rows = outbox_rows(outbox)
    marked = [r for r in rows if r["published_at"] is not None]
    if marked or published:
        raise CheckFailure(
            "The broker had not acknowledged any record when ack_timeout_seconds (0.3 s) ran out, "
            "yet rows were marked published. A record without its delivery report is not "
            "delivered: it may still fail (message.timeout.ms), and if the relay dies now it is "
            "lost. Treat every event as failed until its callback reports success: no callback "
            "before the timeout is a failure like an error in the callback.",
            expected="relay_once returns 0; no row has published_at; each records its attempt "
                     "and a last_error such as 'no acknowledgement within 0.3 s'",
            actual=f"relay_once returned {published!r}; {len(marked)} row(s) marked published "
                   f"while {waiting} record(s) were still waiting for their acknowledgement",
            evidence=table(rows, ROW_COLUMNS), lesson=SEE)
    unrecorded = [r for r in rows if r["attempt_count"] < 1 or not r["last_error"]]
    if unrecorded:
        raise CheckFailure(
            "No acknowledgement within ack_timeout_seconds is a failed send: record it on the row "
            "(last_error, the backoff) so an operator sees why the outbox backs up.",
            expected="every row: attempt_count 1, last_error set",
            actual=f"{len(unrecorded)} row(s) without attempt_count or last_error",
            evidence=table(rows, ROW_COLUMNS), lesson=SEE)
