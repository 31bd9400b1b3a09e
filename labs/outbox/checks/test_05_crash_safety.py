"""Stage crash-safety: kill -9 at the worst moments, and a broker that is not there.
Nothing may be lost; sending twice is allowed (at-least-once)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from _kafka_support import HeldReports, records_table, unknown_event_ids, unknown_ids_text
from _support import (
    MISTAKES,
    READ,
    count,
    insert_event,
    outbox_rows,
    require_table,
)
from confluent_kafka import Producer
from sqlalchemy import text

from dojo.checks import CheckFailure, call, table
from dojo.checks.faults import SlowProducer, run_in_subprocess, unreachable_bootstrap
from dojo.checks.observers import read_topic

pytestmark = pytest.mark.stage("crash-safety")
SEE = READ["crash-safety"]

CHILD = Path(__file__).with_name("_relay_child.py")
ROW_COLUMNS = ("id", "published_at", "lease_left", "attempt_count", "last_error")
LEASE = 1.0
# relay_once with ack_timeout_seconds=0.3 over 3 unacknowledged records: one wait of 0.3 s plus
# its SQL stays well below this; a wait per record takes 3 × 0.3 s.
WAITS_ONCE_WITHIN = 0.65


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
    """The events not in the topic. Records are identified by their event-id header; when
    some carry one that names no row, "lost" cannot be told, and the failure says why."""
    records = read_topic(kafka, topic, 1)
    seen = {r.text("event-id") for r in records}
    lost = [i for i in ids if i not in seen]
    unknown = unknown_event_ids(records, ids)
    if lost and unknown:
        raise CheckFailure(
            f"The topic holds {len(unknown)} record(s) whose event-id header names no outbox "
            "row, so the check cannot tell which events arrived. The event-id header must be the "
            "row's id: consumers deduplicate on it (see the publish stage).",
            expected="header event-id = the outbox row's id, on every record",
            actual=f"{len(unknown)} record(s) with another or no event-id",
            evidence=unknown_ids_text(unknown), lesson=READ["publish"])
    return lost, records


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
    if marked:
        raise CheckFailure(
            "The broker was unreachable (every record timed out after 0.5 s), yet rows were marked "
            "published: those events are lost. Only an acknowledgement may mark a row.",
            expected="relay_once returns 0 and no row has published_at",
            actual=f"relay_once returned {published!r}; {len(marked)} row(s) marked published",
            evidence=table(rows, ROW_COLUMNS), lesson=MISTAKES)
    if published:
        raise CheckFailure(
            "The broker was unreachable and no record was acknowledged; no row was marked, yet "
            "relay_once reported events as published. It must return how many the broker "
            "acknowledged, not how many it handed to produce(): the count is what a relay loop "
            "and its metrics trust.",
            expected="relay_once returns 0",
            actual=f"relay_once returned {published!r}; 0 rows marked published",
            evidence=table(rows, ROW_COLUMNS), lesson=SEE)
    require_failures_recorded(rows, "the delivery error")
    if took >= 10:
        raise CheckFailure(
            "relay_once kept waiting for a broker that is not there.",
            expected="it gives up after ack_timeout_seconds (5 s): well under 10 s",
            actual=f"it took {took:.1f} s", lesson=SEE)


def require_failures_recorded(rows: list[dict[str, Any]], what: str) -> None:
    unrecorded = [r for r in rows if r["attempt_count"] < 1 or not r["last_error"]]
    if unrecorded:
        raise CheckFailure(
            "Each failed send must leave a trace on its row: the attempt counted, the error kept "
            "(that is what an operator reads when the outbox backs up).",
            expected=f"every row: attempt_count 1, last_error with {what}",
            actual=f"{len(unrecorded)} row(s) without attempt_count or last_error",
            evidence=table(rows, ROW_COLUMNS), lesson=SEE)
    leased = [r for r in rows if r["lease_left"] is not None and r["lease_left"] > 0]
    if leased:
        raise CheckFailure(
            "A failed row must give up its lease (lease_until = NULL) when the failure is "
            "recorded: while the lease lasts no relay claims it, so the retry waits for the "
            "lease (30 s here) instead of the backoff.",
            expected="every failed row: lease_until NULL (or past)",
            actual=f"{len(leased)} row(s) still leased",
            evidence=table(rows, ROW_COLUMNS), lesson=READ["backoff"])


def test_no_acknowledgement_in_time_is_a_failure(outbox, learner, kafka, relay_producer):
    require_table(outbox, "outbox_event", "crash-safety")
    relay = learner.module("relay")
    topic = kafka.topic(1, hint="slow-ack")
    for i in range(3):
        insert_event(outbox, created_ago=3.0 - i)
    # The broker takes 1 s to acknowledge; relay_once waits only ack_timeout_seconds=0.3.
    slow = SlowProducer(relay_producer(), delay=1.0)
    started = time.monotonic()
    published = call(relay.relay_once, outbox, slow, topic, batch_size=10,
                     lease_seconds=30, ack_timeout_seconds=0.3)
    took = time.monotonic() - started
    waiting = len(slow)
    rows = outbox_rows(outbox)
    marked = [r for r in rows if r["published_at"] is not None]
    if marked and took >= 0.9:
        raise CheckFailure(
            f"relay_once waited {took:.1f} s for acknowledgements although ack_timeout_seconds "
            "was 0.3, then marked the rows. The timeout is what keeps a stalled broker from "
            "holding the relay (and its leases) for as long as it stalls: when it runs out, the "
            "records without a delivery report are failures, recorded and retried later.",
            expected="relay_once returns within about 0.3 s; returns 0; no row published",
            actual=f"it returned after {took:.1f} s with {len(marked)} row(s) marked",
            evidence=table(rows, ROW_COLUMNS), lesson=SEE,
            fix="wait once, producer.flush(ack_timeout_seconds) (or poll() until a deadline), "
                "then treat every record without a report as failed")
    if marked:
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
    if published:
        raise CheckFailure(
            "No record was acknowledged within ack_timeout_seconds (0.3 s) and no row was "
            "marked, yet relay_once reported events as published. It must return how many the "
            "broker acknowledged, not how many it handed to produce().",
            expected="relay_once returns 0",
            actual=f"relay_once returned {published!r}; 0 rows marked published",
            evidence=table(rows, ROW_COLUMNS), lesson=SEE,
            fix="count the delivery reports without an error, not the produce() calls")
    if took > WAITS_ONCE_WITHIN:
        raise CheckFailure(
            f"relay_once returned 0 and marked nothing, as it should, but only after {took:.2f} s "
            f"with ack_timeout_seconds=0.3: about {took / 0.3:.0f} times the timeout for a batch "
            "of 3 records none of which was acknowledged in time. The timeout bounds the wait of "
            "the whole batch: a wait per record (produce, then flush, for each) lets one slow "
            "broker hold the relay and its leases for batch_size × the timeout.",
            expected=f"relay_once returns within about 0.3 s (at most {WAITS_ONCE_WITHIN} s)",
            actual=f"it returned after {took:.2f} s",
            evidence=table(rows, ROW_COLUMNS), lesson=SEE,
            fix="produce every event of the batch first, then wait once: "
                "producer.flush(ack_timeout_seconds), or poll() until one deadline")
    require_failures_recorded(rows, "a last_error such as 'no acknowledgement within 0.3 s'")
    acknowledged_rows_beside_a_late_one_are_marked(outbox, relay, topic, relay_producer)


def acknowledged_rows_beside_a_late_one_are_marked(engine: Any, relay: Any, topic: str,
                                                    relay_producer: Any) -> None:
    """Four rows in one batch; the broker acknowledges three at once and never reports the
    second (flush() returns 1 after the timeout): the three are published, the second fails."""
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM outbox_event"))
    ids = [insert_event(engine, created_ago=4.0 - i) for i in range(4)]
    producer = HeldReports(relay_producer(), {ids[1]})
    published = call(relay.relay_once, engine, producer, topic, batch_size=10,
                     lease_seconds=30, ack_timeout_seconds=0.4)
    rows = outbox_rows(engine)
    wrong = [r for r in rows if (r["published_at"] is None) != (r["id"] == ids[1])]
    if published != 3 or wrong:
        acked_failed = [r for r in wrong if r["id"] != ids[1]]
        raise CheckFailure(
            "Of four records in one batch the broker acknowledged three at once; the second "
            "got no delivery report within ack_timeout_seconds (0.4 s), so flush() returned 1. "
            + (f"{len(acked_failed)} acknowledged row(s) were not marked published: a record "
               "left in the queue says nothing about the others, whose reports did arrive. "
               "They back off and are sent again for nothing, and relay_once under-reports. "
               if acked_failed else "")
            + "Each event's fate is its own report: delivered, failed, or none by the timeout.",
            expected="relay_once returns 3; the three acknowledged rows published, the second "
                     "failed (last_error, no lease)",
            actual=f"returned {published!r}; {len(wrong)} row(s) on the wrong side",
            evidence=table(rows, ROW_COLUMNS), lesson=SEE,
            fix="decide per event from its delivery report, never from flush()'s return value"
            if acked_failed else None)
