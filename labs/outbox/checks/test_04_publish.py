"""Stage publish: key = aggregate id, event id and type in headers, wait for the broker's
acknowledgement, then mark published only if the row is still unpublished."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from _kafka_support import records_table
from _support import (
    MISTAKES,
    READ,
    insert_event,
    outbox_rows,
    require_table,
)
from confluent_kafka import Producer

from dojo.checks import CheckFailure, call, in_thread, table
from dojo.checks.faults import SlowProducer
from dojo.checks.observers import read_topic
from dojo.checks.partitioning import partition_for

pytestmark = pytest.mark.stage("publish")
SEE = READ["publish"]

ROW_COLUMNS = ("id", "aggregate_id", "aggregate_version", "published_at", "attempt_count")


def test_producer_is_idempotent_with_acks_all(learner, kafka):
    relay = learner.module("relay")
    base = kafka.producer_config()
    config = call(relay.producer_config, dict(base))
    problems = []
    if str(config.get("acks")).lower() not in ("all", "-1"):
        problems.append(f"acks = {config.get('acks')!r}: the broker must acknowledge only "
                        "once every in-sync replica has the record (acks=all)")
    if str(config.get("enable.idempotence")).lower() not in ("true", "1"):
        problems.append(f"enable.idempotence = {config.get('enable.idempotence')!r}: without "
                        "it, the client's own retries can write a record twice or reorder a "
                        "partition")
    in_flight = config.get("max.in.flight.requests.per.connection")
    if in_flight is not None and int(in_flight) > 5:
        problems.append(f"max.in.flight.requests.per.connection = {in_flight}: idempotence "
                        "keeps order only up to 5")
    changed = {k: (v, config.get(k)) for k, v in base.items()
               if k != "acks" and config.get(k) != v}
    if changed:
        problems.append(f"settings from the base config were changed or dropped: {changed} "
                        "(keep what you are given: the checks choose the broker and timeouts)")
    if problems:
        raise CheckFailure(
            "producer_config(base) must return the base settings plus a producer whose "
            "acknowledgement means the record is safe.",
            expected="acks=all, enable.idempotence=true, base settings kept",
            actual=f"{len(problems)} problem(s)", evidence="\n".join(problems),
            lesson=SEE)
    Producer(config)  # librdkafka accepts it


def seed_aggregates(engine: Any, aggregates: int, versions: int,
                    headers: dict[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    """aggregates × versions rows, created in version order; event id → row."""
    import uuid

    rows = {}
    ago = float(aggregates * versions)
    aggregate_ids = [str(uuid.uuid4()) for _ in range(aggregates)]
    for v in range(1, versions + 1):
        for aggregate_id in aggregate_ids:
            payload = {"order_id": aggregate_id, "customer_id": str(uuid.uuid4()),
                       "total_cents": 100 * v}
            event_id = insert_event(engine, aggregate_id=aggregate_id, version=v,
                                    event_type="order.placed.v1" if v == 1 else
                                    "order.total-changed.v1", payload=payload,
                                    headers=headers, created_ago=ago)
            ago -= 1.0
            rows[event_id] = {"aggregate_id": aggregate_id, "version": v, "payload": payload}
    return rows


def test_key_is_the_aggregate_id(outbox, learner, kafka, relay_producer):
    require_table(outbox, "outbox_event", "publish")
    relay = learner.module("relay")
    topic = kafka.topic(3, hint="keys")
    rows = seed_aggregates(outbox, 4, 3)
    call(relay.relay_once, outbox, relay_producer(), topic, batch_size=100, lease_seconds=30)
    records = read_topic(kafka, topic, 3)
    wrong = []
    for rec in records:
        row = rows.get(rec.text("event-id") or "")
        want_key = row["aggregate_id"] if row else "?"
        got_key = rec.key.decode(errors="replace") if rec.key is not None else None
        if got_key != want_key:
            wrong.append({"event-id": rec.text("event-id"), "expected key": want_key,
                          "actual key": got_key, "partition": rec.partition})
    if not (records and not wrong):
        raise CheckFailure(
            "Every record's key must be its aggregate id (the order id as text). Kafka keeps "
            "order only inside a partition and the key picks the partition: with no key or a "
            "random key, an order's total-changed can overtake its placed event.",
            expected="key = aggregate_id for each of the 12 records",
            actual=f"{len(wrong)} record(s) with another key" if records else "no records",
            evidence=table(wrong, ("event-id", "expected key", "actual key", "partition")) if wrong
            else records_table(records), lesson=SEE)
    by_aggregate: dict[str, list[tuple[int, int, int]]] = {}
    for rec in records:
        row = rows[rec.text("event-id") or ""]
        by_aggregate.setdefault(row["aggregate_id"], []).append(
            (rec.partition, rec.offset, row["version"]))
    disorder = {}
    for aggregate_id, placed in by_aggregate.items():
        partitions = {p for p, _, _ in placed}
        versions = [v for _, _, v in sorted(placed)]
        if partitions != {partition_for(aggregate_id.encode(), 3)} or versions != [1, 2, 3]:
            disorder[aggregate_id] = placed
    if disorder:
        raise CheckFailure(
            "Each aggregate's events must sit in one partition, in version order.",
            expected="per aggregate: one partition (murmur2 of the key), versions 1, 2, 3 by "
                     "offset",
            actual=f"{len(disorder)} aggregate(s) out of order",
            evidence="\n".join(f"{a}: (partition, offset, version) {p}"
                                for a, p in disorder.items()),
            lesson=SEE)


def test_headers_carry_event_id_and_type(outbox, learner, kafka, relay_producer):
    require_table(outbox, "outbox_event", "publish")
    relay = learner.module("relay")
    topic = kafka.topic(1, hint="headers")
    trace = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    rows = seed_aggregates(outbox, 2, 2, headers={"traceparent": trace})
    call(relay.relay_once, outbox, relay_producer(), topic, batch_size=100, lease_seconds=30)
    records = read_topic(kafka, topic, 1)
    events = {r["id"]: r for r in outbox_rows(outbox)}
    problems = []
    for rec in records:
        event_id = rec.text("event-id")
        row = events.get(event_id or "")
        if row is None:
            problems.append(f"offset {rec.offset}: header event-id = {event_id!r} matches no "
                            "outbox row id")
            continue
        if rec.text("event-type") != row["event_type"]:
            problems.append(f"offset {rec.offset}: header event-type = "
                            f"{rec.text('event-type')!r}, row says {row['event_type']!r}")
        try:
            value = json.loads(rec.value or b"")
        except ValueError:
            value = rec.value
        if value != row["payload"]:
            problems.append(f"offset {rec.offset}: value {value!r} is not the row's payload "
                            f"{row['payload']!r}")
        if rec.text("traceparent") != trace:
            problems.append(f"offset {rec.offset}: the row's headers column "
                            f"{{'traceparent': …}} did not travel as a Kafka header")
    if not (len(records) == len(rows) and not problems):
        raise CheckFailure(
            "A consumer deduplicates on the event id and routes on the event type without "
            "parsing the payload, so both travel in headers; the payload is the value, unchanged; "
            "the row's headers column (trace context here) becomes Kafka headers too.",
            expected=f"{len(rows)} records with headers event-id = row id, event-type = row "
                     "event_type, traceparent; value = payload JSON",
            actual=f"{len(records)} records, {len(problems)} problem(s)",
            evidence="\n".join(problems[:10]) + "\n" + records_table(records),
            lesson=SEE)


def test_marks_only_acknowledged_records(outbox, learner, kafka, relay_producer):
    require_table(outbox, "outbox_event", "publish")
    relay = learner.module("relay")
    topic = kafka.topic(1, hint="acks")
    for i in range(5):
        insert_event(outbox, created_ago=5.0 - i)
    # The producer batches for 400 ms: records stay in its queue unless the relay waits.
    producer = relay_producer(**{"linger.ms": 400})
    published = call(relay.relay_once, outbox, producer, topic, batch_size=100,
                     lease_seconds=30)
    waiting = len(producer)
    marked = outbox_rows(outbox, "published_at IS NOT NULL")
    in_topic = {r.text("event-id") for r in read_topic(kafka, topic, 1)}
    unacked = [r for r in marked if r["id"] not in in_topic]
    if (marked and waiting) or unacked:
        raise CheckFailure(
            "relay_once marked rows published before the broker acknowledged them. If the "
            "process dies now, or the broker rejects the records, those events are lost: the "
            "database says sent, Kafka never had them. Wait for the acknowledgement "
            "(producer.flush(), or the delivery callbacks) and mark only what was acknowledged.",
            expected="when relay_once returns, no record is still waiting for its "
                     "acknowledgement, and every row marked published is in the topic",
            actual=f"{waiting} record(s) still in the producer's queue, {len(marked)} row(s) "
                   f"marked, {len(unacked)} of them not in the topic",
            evidence=table(marked, ROW_COLUMNS), lesson=MISTAKES)
    if not (published == 5 and len(marked) == 5):
        raise CheckFailure(
            "All 5 rows were acknowledged, so relay_once should mark and report all 5.",
            expected="relay_once returns 5; 5 rows published",
            actual=f"returned {published!r}; {len(marked)} rows published",
            evidence=table(outbox_rows(outbox), ROW_COLUMNS), lesson=SEE)


def test_late_mark_keeps_the_first_publish(outbox, learner, kafka, relay_producer):
    require_table(outbox, "outbox_event", "publish")
    relay = learner.module("relay")
    topic = kafka.topic(1, hint="late")
    event_id = insert_event(outbox)
    slow = SlowProducer(relay_producer(), delay=0.8)
    first = in_thread(relay.relay_once, outbox, slow, topic, batch_size=10, lease_seconds=0.3)
    if not slow.first_send.wait(10):
        if first.join(5):
            first.result(0)  # what it raised (a stub's NotWritten too)
        raise CheckFailure("relay_once never sent the row it claimed.",
                           expected="a produce() call within 10 s",
                           actual="none" if first.alive else f"it returned {first.value!r}",
                           lesson=SEE)
    time.sleep(0.4)  # relay A's 0.3 s lease has expired while its send is still in flight
    second = call(relay.relay_once, outbox, relay_producer(), topic, batch_size=10,
                  lease_seconds=30)
    [after_b] = outbox_rows(outbox)
    first.result(15)
    [after_a] = outbox_rows(outbox)
    if not (second == 1 and after_b["published_at"] is not None):
        raise CheckFailure(
            "Relay A's lease expired mid-send, so relay B should have claimed, sent and marked "
            "the row.",
            expected="relay B publishes it (returns 1)", actual=f"relay B returned {second!r}",
            evidence=table([after_b], ROW_COLUMNS), lesson=SEE)
    if after_a["published_at"] != after_b["published_at"]:
        raise CheckFailure(
            "Relay A's lease ran out while its send was slow; relay B re-sent the event and "
            "marked it. Then A's acknowledgement arrived and A marked it again, moving "
            "published_at. Mark with a conditional update — "
            "UPDATE … SET published_at = … WHERE id = :id AND published_at IS NULL — so the first "
            "mark wins and the publish age stays true.",
            expected=f"published_at stays {after_b['published_at']} (B's mark)",
            actual=f"published_at became {after_a['published_at']} after A's late mark",
            evidence=f"event {event_id}", lesson=SEE)
