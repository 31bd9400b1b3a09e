"""Stage publish: key = aggregate id, event id and type in headers, wait for the broker's
acknowledgement, then mark published only if the row is still unpublished."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from _kafka_support import (
    AckWatch,
    FailedReports,
    records_table,
    unknown_event_ids,
    unknown_ids_text,
)
from _support import (
    MISTAKES,
    READ,
    StatementClockWatch,
    db_now,
    insert_event,
    other_sessions,
    outbox_rows,
    require_table,
)
from confluent_kafka import Producer
from sqlalchemy import text

from dojo.checks import CheckFailure, call, in_thread, table
from dojo.checks.faults import SlowProducer
from dojo.checks.observers import SESSION_COLUMNS, open_transactions, read_topic
from dojo.checks.partitioning import partition_for

pytestmark = pytest.mark.stage("publish")
SEE = READ["publish"]
PRODUCER = "transactional-outbox#producer-settings"

ROW_COLUMNS = ("id", "aggregate_id", "aggregate_version", "published_at", "attempt_count")


# librdkafka accepts some properties under two names; setting the alias overrides the other.
ALIASES = (("bootstrap.servers", "metadata.broker.list"),
           ("linger.ms", "queue.buffering.max.ms"),
           ("message.timeout.ms", "delivery.timeout.ms"),
           ("acks", "request.required.acks"),
           ("retries", "message.send.max.retries"),
           ("max.in.flight.requests.per.connection", "max.in.flight"),
           ("compression.type", "compression.codec"),
           ("sasl.mechanism", "sasl.mechanisms"))
# The base the check hands over: the broker plus settings a caller chose (a message timeout
# and linger that are not librdkafka's defaults).
BASE_CHOICES = {"message.timeout.ms": 43210, "linger.ms": 7, "retries": 2147483647,
                "max.in.flight.requests.per.connection": 3}


def names_of(key: str) -> tuple[str, ...]:
    for group in ALIASES:
        if key in group:
            return group
    return (key,)


# The same choices under librdkafka's other names: a default a relay adds under one name must
# not override the base's setting under the other.
ALIAS_CHOICES = {"delivery.timeout.ms": 43210, "queue.buffering.max.ms": 7,
                 "message.send.max.retries": 2147483647, "max.in.flight": 3,
                 "compression.codec": "lz4"}


def alias_base(kafka: Any) -> dict[str, Any]:
    """The check's broker settings with every choice under its other librdkafka name."""
    base = kafka.producer_config()
    base["metadata.broker.list"] = base.pop("bootstrap.servers")
    base.pop("linger.ms", None)
    return base | ALIAS_CHOICES


def test_producer_is_idempotent_with_acks_all(learner, kafka):
    relay = learner.module("relay")
    for base in (kafka.producer_config(**BASE_CHOICES), alias_base(kafka)):
        require_producer_config(relay, base)


def require_producer_config(relay: Any, base: dict[str, Any]) -> None:
    given = dict(base)
    config = call(relay.producer_config, given)
    problems = []
    if given != base or config is given:
        problems.append("producer_config changed or returned the very dict it was given"
                        + (f" (it now holds {sorted(set(given) - set(base))} too)"
                           if set(given) - set(base) else "")
                        + ": the caller's base is shared (other producers, a consumer, the "
                          "next relay are built from it); return a new dict")
    if str(config.get("acks")).lower() not in ("all", "-1"):
        problems.append(f"acks = {config.get('acks')!r}: the broker must acknowledge only "
                        "once every in-sync replica has the record (acks=all)")
    if str(config.get("enable.idempotence")).lower() not in ("true", "1"):
        problems.append(f"enable.idempotence = {config.get('enable.idempotence')!r}: without "
                        "it, the client's own retries can write a record twice or reorder a "
                        "partition")
    in_flight = config.get("max.in.flight.requests.per.connection", config.get("max.in.flight"))
    if in_flight is not None and int(in_flight) > 5:
        problems.append(f"max.in.flight.requests.per.connection = {in_flight}: idempotence "
                        "keeps order only up to 5")
    dropped = {k: v for k, v in base.items() if k != "acks" and k not in config}
    changed = {k: (v, config[k]) for k, v in base.items()
               if k != "acks" and k in config and str(config[k]) != str(v)}
    aliased = [(k, v, alias, config[alias]) for k, v in base.items() if k != "acks"
               for alias in names_of(k) if alias != k and alias in config
               and str(config[alias]) != str(v)]
    if dropped or changed:
        problems.append(f"settings from the base config were changed or dropped: "
                        f"{changed or dropped} (keep what you are given: the checks choose the "
                        "broker and timeouts)")
    for key, value, alias, other in aliased:
        problems.append(f"{key} = {value!r} from the base config is overridden by {alias} = "
                        f"{other!r}: librdkafka reads {alias} as {key} under another name")
    if problems:
        raise CheckFailure(
            "producer_config(base) must return the base settings plus a producer whose "
            "acknowledgement means the record is safe.",
            expected="acks=all, enable.idempotence=true, base settings kept (under any of "
                     "their librdkafka names)",
            actual="; ".join(problems),
            evidence="base:\n" + "\n".join(f"  {key} = {value!r}"
                                           for key, value in sorted(base.items()))
                     + "\nproducer_config(base):\n" + "\n".join(
                         f"  {key} = {value!r}" for key, value in sorted(config.items())),
            lesson=f"{SEE} {PRODUCER}",
            fix=f"drop {', '.join(a for _, _, a, _ in aliased)}: the base already sets it"
                " under another name (a default of yours applies only when none of its names "
                "is in base)"
            if aliased and len(problems) == len(aliased) else None)
    Producer(config)  # librdkafka accepts it


def seed_aggregates(engine: Any, aggregates: int, versions: int,
                    headers: dict[str, Any] | None = None,
                    payload_ids: bool = True) -> dict[str, dict[str, Any]]:
    """aggregates × versions rows, created in version order (1 of each, then 2 of each …);
    event id → row. See seed_plan."""
    return seed_plan(engine, [a for _ in range(versions) for a in range(aggregates)],
                     headers=headers, payload_ids=payload_ids)


# Which order writes its next version, in created_at order: uneven counts (3, 4, 3, 2
# versions), neither round-robin nor grouped. For every two of the four orders (whichever two
# share a partition), their events interleave and a higher version of one comes before a
# lower version of the other: a batch regrouped by order or key, or sorted by version, puts
# the pair in another order than the claim's.
INTERLEAVED = "A1 A2 C1 C2 D1 C3 D2 B1 C4 D3 B2 A3"


def seed_plan(engine: Any, plan: list[int], headers: dict[str, Any] | None = None,
              payload_ids: bool = True) -> dict[str, dict[str, Any]]:
    """One row per entry of `plan` (an aggregate's number: its next version), created in that
    order; event id → row. Without `payload_ids`, the payloads name their order in upper case
    (the payload is the event's data, whatever its spelling; the key comes from the row's
    aggregate_id)."""
    import uuid

    rows = {}
    ago = float(len(plan))
    aggregate_ids = {n: str(uuid.uuid4()) for n in dict.fromkeys(plan)}
    written: dict[int, int] = {}
    for n in plan:
        aggregate_id = aggregate_ids[n]
        v = written[n] = written.get(n, 0) + 1
        payload = {"order_id": aggregate_id if payload_ids else aggregate_id.upper(),
                   "customer_id": str(uuid.uuid4()), "total_cents": 100 * v}
        event_id = insert_event(engine, aggregate_id=aggregate_id, version=v,
                                event_type="order.placed.v1" if v == 1 else
                                "order.total-changed.v1", payload=payload,
                                headers=headers, created_ago=ago)
        ago -= 1.0
        rows[event_id] = {"aggregate_id": aggregate_id, "version": v, "payload": payload}
    return rows


def mark_failed_before(engine: Any, rows: dict[str, dict[str, Any]]) -> list[str]:
    """Make version 1 of the first order, 2 of the second and 3 of the third rows that failed
    once and are due again: a batch then mixes retried and fresh events of one order."""
    by_aggregate: dict[str, dict[int, str]] = {}
    for event_id, row in rows.items():
        by_aggregate.setdefault(row["aggregate_id"], {})[row["version"]] = event_id
    retried = [versions[v] for v, versions in zip((1, 2, 3), by_aggregate.values(), strict=False)]
    with engine.begin() as conn:
        conn.execute(text(
            "UPDATE outbox_event SET attempt_count = 1, last_error = 'broker unreachable', "
            "next_attempt_at = clock_timestamp() - interval '2.5 s' "
            "WHERE id = ANY(CAST(:ids AS uuid[]))"),
            {"ids": retried})
    return retried


def test_key_is_the_aggregate_id(outbox, learner, kafka, relay_producer):
    require_table(outbox, "outbox_event", "publish")
    relay = learner.module("relay")
    topic = kafka.topic(3, hint="keys")
    rows = seed_plan(outbox, [ord(step[0]) for step in INTERLEAVED.split()],
                     payload_ids=False)
    mark_failed_before(outbox, rows)
    published = call(relay.relay_once, outbox, relay_producer(), topic, batch_size=100,
                     lease_seconds=30)
    records = read_topic(kafka, topic, 3)
    require_event_ids(records, list(rows))
    wrong = []
    for rec in records:
        row = rows.get(rec.text("event-id") or "")
        want_key = row["aggregate_id"] if row else "?"
        got_key = rec.key.decode(errors="replace") if rec.key is not None else None
        if got_key != want_key:
            wrong.append({"event-id": rec.text("event-id"), "expected key": want_key,
                          "actual key": got_key, "partition": rec.partition})
    if not (records and not wrong):
        from_payload = all(w["actual key"] == str(w["expected key"]).upper() for w in wrong)
        raise CheckFailure(
            "Every record's key must be its aggregate id (the order id as text). Kafka keeps "
            "order only inside a partition and the key picks the partition: with no key or a "
            "random key, an order's total-changed can overtake its placed event."
            + (" Here the key is the payload's order_id (the check's payloads spell it in upper "
               "case): the payload's shape belongs to each event type and version, the row's "
               "aggregate_id is the key." if from_payload else ""),
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
        if partitions != {partition_for(aggregate_id.encode(), 3)} or \
                versions != sorted(row["version"] for row in rows.values()
                                   if row["aggregate_id"] == aggregate_id):
            disorder[aggregate_id] = placed
    if disorder:
        retries_moved = all(partition_for(a.encode(), 3) == p for a, placed in disorder.items()
                            for p, _, _ in placed)
        raise CheckFailure(
            "Each aggregate's events must sit in one partition, in version order."
            + (" Three of the events had failed once before and were due again (version 1 of "
               "one order, 2 of another, 3 of a third): the batch was sent in another order "
               "than the claim's created_at order, so an order's retried event and its fresh "
               "ones changed places. Send the batch in the order claim_batch returned it."
               if retries_moved else ""),
            expected="per aggregate: one partition (murmur2 of the key), versions 1, 2, … by "
                     "offset",
            actual=f"{len(disorder)} aggregate(s) out of order",
            evidence="\n".join(f"{a}: (partition, offset, version) {p}"
                                for a, p in disorder.items()),
            lesson=SEE)
    require_claim_order_in_each_partition(records, rows)
    marked = outbox_rows(outbox, "published_at IS NOT NULL")
    if published != len(rows) or len(marked) != len(rows):
        raise CheckFailure(
            f"relay_once sent one batch holding 2 to 4 versions of each of 4 orders and the broker "
            f"acknowledged all {len(rows)} records, yet it "
            f"{'returned ' + repr(published) if published != len(rows) else ''}"
            f"{' and ' if published != len(rows) and len(marked) != len(rows) else ''}"
            f"{f'marked {len(marked)} row(s)' if len(marked) != len(rows) else ''}. A delivery "
            "report must be matched to its own event: several records of one batch share a key "
            "(one order's versions), so a report looked up by key, partition or position "
            "lands on the wrong event.",
            expected=f"relay_once returns {len(rows)}; all {len(rows)} rows published",
            actual=f"returned {published!r}; {len(marked)} row(s) published",
            evidence=table(outbox_rows(outbox), ROW_COLUMNS), lesson=SEE,
            fix="bind each record's event id to its own callback (on_delivery=lambda err, msg, "
                "event_id=event.id: …) and mark by those ids")


def require_claim_order_in_each_partition(records: Any, rows: dict[str, dict[str, Any]]) -> None:
    """Four orders over three partitions: two of them (at least) share one, their versions
    interleaved by created_at unevenly (INTERLEAVED). Sent in the claim's order, a partition
    holds them interleaved too; a batch regrouped by aggregate or key, or sorted by version,
    does not."""
    position = {event_id: n for n, event_id in enumerate(rows)}  # created_at order
    out_of_order = []
    for partition in sorted({rec.partition for rec in records}):
        here = sorted((rec for rec in records if rec.partition == partition),
                      key=lambda rec: rec.offset)
        order = [position[rec.text("event-id") or ""] for rec in here]
        if order != sorted(order):
            out_of_order += [{"partition": partition, "offset": rec.offset,
                              "order": rows[rec.text("event-id") or ""]["aggregate_id"][:8],
                              "version": rows[rec.text("event-id") or ""]["version"],
                              "created_at rank": position[rec.text("event-id") or ""] + 1}
                             for rec in here]
    if out_of_order:
        raise CheckFailure(
            "Each order's versions are in order, but a partition shared by several orders "
            "holds the batch in another order than the claim's: the relay regrouped (or "
            "sorted) the claimed events before sending them. The claim returns the oldest "
            "events first, and the batch is sent in that order, so what was written first is "
            "published first, whichever orders share a partition.",
            expected="in each partition, offsets follow the rows' created_at order",
            actual="a partition whose offsets do not follow created_at (rank 1 = oldest)",
            evidence=table(out_of_order, ("partition", "offset", "order", "version",
                                          "created_at rank"), limit=20),
            lesson=SEE, fix="produce the events in the order claim_batch returned them")


# The row's headers column: trace context, an empty value (a header that is there, empty) and
# text beyond ASCII (its UTF-8 bytes, not Latin-1, not JSON).
TRACE = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
ROW_HEADERS = {"traceparent": TRACE, "tenant": "", "x-note": "café ☕ Zürich"}


def test_headers_carry_event_id_and_type(outbox, learner, kafka, relay_producer):
    require_table(outbox, "outbox_event", "publish")
    relay = learner.module("relay")
    topic = kafka.topic(1, hint="headers")
    rows = seed_aggregates(outbox, 2, 2, headers=ROW_HEADERS)
    call(relay.relay_once, outbox, relay_producer(), topic, batch_size=100, lease_seconds=30)
    records = read_topic(kafka, topic, 1)
    events = {r["id"]: r for r in outbox_rows(outbox)}
    require_event_ids(records, list(events))
    problems: list[str] = []
    fixes: set[str] = set()
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
        for name, want in ROW_HEADERS.items():
            got = rec.header(name)
            if name not in rec.names() or (got is None and want):
                problems.append(f"offset {rec.offset}: the row's headers column "
                                f"{{{name!r}: {want!r}}} did not travel as a Kafka header"
                                + (" (its value is the empty string: still a header)"
                                   if not want else ""))
                if not want:
                    fixes.add("empty")
            elif (got or b"") == want.encode():
                continue
            elif got == json.dumps(want).encode() or got == json.dumps(
                    want, ensure_ascii=False).encode():
                problems.append(f"offset {rec.offset}: header {name} = {got!r}: the value "
                                "JSON-encoded, with its quotes")
                fixes.add("json")
            else:
                latin = want.encode("latin-1", "replace")
                problems.append(f"offset {rec.offset}: header {name} = {got!r}, the row says "
                                f"{want!r} (UTF-8: {want.encode()!r})"
                                + (": encoded as Latin-1, not UTF-8" if got == latin else ""))
                fixes.add("utf-8")
    if not (len(records) == len(rows) and not problems):
        fix = {"json": "send each value of the headers column as its text, UTF-8 encoded "
                       "(value.encode()), not json.dumps(value)",
               "empty": "send every key of the headers column, whatever its value: an empty "
                        "string is a header whose value is b''",
               "utf-8": "encode each value as UTF-8 (value.encode()); Latin-1 and other codecs "
                        "change or lose every character beyond ASCII"}
        raise CheckFailure(
            "A consumer deduplicates on the event id and routes on the event type without "
            "parsing the payload, so both travel in headers; the payload is the value, unchanged; "
            "the row's headers column becomes Kafka headers too, one per key, each value its "
            "string's UTF-8 bytes (here: trace context, an empty tenant, a note with é, ☕ "
            "and ü).",
            expected=f"{len(rows)} records with headers event-id = row id, event-type = row "
                     "event_type, traceparent, tenant = b'', x-note = "
                     f"{ROW_HEADERS['x-note'].encode()!r}; value = payload JSON",
            actual=f"{len(records)} records; " + "; ".join(
                sorted({problem.split(": ", 1)[-1] for problem in problems})[:3]),
            evidence="\n".join(problems[:10]) + "\n" + records_table(records),
            lesson=SEE,
            fix=fix[next(iter(fixes))] if len(fixes) == 1 else None)


def require_event_ids(records: Any, row_ids: list[str]) -> None:
    """Every record must say which outbox row it is (the event-id header): the other checks
    of this stage identify records by it."""
    unknown = unknown_event_ids(records, row_ids)
    if unknown:
        raise CheckFailure(
            f"{len(unknown)} of {len(records)} records carry an event-id header that names no "
            "outbox row: the header must be the row's id (the event id, as text). Consumers "
            "deduplicate on it, and this check identifies each record by it.",
            expected="header event-id = the outbox row's id, on every record",
            actual=f"{len(unknown)} record(s) with another or no event-id",
            evidence=unknown_ids_text(unknown), lesson=SEE)


def test_marks_only_acknowledged_records(outbox, learner, kafka, relay_producer):
    require_table(outbox, "outbox_event", "publish")
    relay = learner.module("relay")
    topic = kafka.topic(1, hint="acks")
    # Three orders' first events, then two of them changed: a batch of 3 takes the first
    # events only, and the later versions of the same orders wait for the next pass.
    first = seed_aggregates(outbox, 3, 1)
    later = {}
    for row in list(first.values())[:2]:
        later[insert_event(outbox, aggregate_id=row["aggregate_id"], version=2,
                           event_type="order.total-changed.v1")] = row["aggregate_id"]
    # The producer batches for 400 ms: records stay in its queue unless the relay waits.
    producer = relay_producer(**{"linger.ms": 400})
    published = call(relay.relay_once, outbox, producer, topic, batch_size=3,
                     lease_seconds=30)
    waiting = len(producer)
    marked = outbox_rows(outbox, "published_at IS NOT NULL")
    in_topic = {r.text("event-id") for r in read_topic(kafka, topic, 1)}
    never_sent = [r for r in marked if r["id"] in later]
    if never_sent:
        raise CheckFailure(
            f"relay_once claimed and sent 3 events, and marked {len(never_sent)} more row(s) "
            "published that it never claimed nor sent: later versions of the same orders. The "
            "mark must name the acknowledged events by their id; marking by aggregate id marks "
            "every event of that order, including ones written after the claim — lost.",
            expected="the 3 claimed rows published; the 2 later versions still unpublished "
                     "(attempt_count 0)",
            actual=f"{len(marked)} row(s) marked, {len(never_sent)} of them never sent",
            evidence=table(outbox_rows(outbox), ROW_COLUMNS), lesson=SEE,
            fix="mark WHERE id = ANY(:acknowledged_event_ids) AND published_at IS NULL")
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
    if not (published == 3 and sorted(r["id"] for r in marked) == sorted(first)):
        raise CheckFailure(
            "The 3 claimed rows were acknowledged, so relay_once should mark and report those 3.",
            expected="relay_once returns 3; the 3 claimed rows published",
            actual=f"returned {published!r}; {len(marked)} rows published",
            evidence=table(outbox_rows(outbox), ROW_COLUMNS), lesson=SEE)
    still_leased = [r for r in marked if r["lease_until"] is not None]
    if still_leased:
        raise CheckFailure(
            f"relay_once published the 3 claimed rows, and {len(still_leased)} of them still "
            "carry the claim's lease. The mark ends the relay's ownership: a published row has "
            "no lease (lease_until = NULL), so a row with a lease is one a relay is still "
            "sending — what an operator, a dashboard or the next check reads.",
            expected="the 3 published rows: lease_until NULL",
            actual=f"{len(still_leased)} published row(s) with lease_until set",
            evidence=table(outbox_rows(outbox), ROW_COLUMNS + ("lease_until",)), lesson=SEE,
            fix="UPDATE outbox_event SET published_at = clock_timestamp(), lease_until = NULL "
                "WHERE id = ANY(:ids) AND published_at IS NULL")
    marks_wait_for_the_acknowledgement(outbox, relay, kafka, topic)
    reports_are_matched_by_event_id(outbox, relay, topic, relay_producer)


def reports_are_matched_by_event_id(engine: Any, relay: Any, topic: str,
                                    relay_producer: Any) -> None:
    """Two orders with two versions each in one batch; one version of each gets a failed
    delivery report (version 1 of one, 2 of the other): its row stays unpublished, its twin of
    the same key is published."""
    with engine.begin() as conn:
        conn.execute(text("UPDATE outbox_event SET published_at = clock_timestamp() "
                          "WHERE published_at IS NULL"))
    rows = seed_aggregates(engine, 2, 2)
    by_version = {(row["aggregate_id"], row["version"]): event_id
                  for event_id, row in rows.items()}
    first, second = list(dict.fromkeys(row["aggregate_id"] for row in rows.values()))
    failing = {by_version[(first, 1)], by_version[(second, 2)]}
    published = call(relay.relay_once, engine, FailedReports(relay_producer(), failing), topic,
                     batch_size=10, lease_seconds=30, ack_timeout_seconds=10)
    found = outbox_rows(engine, "id = ANY(CAST(:ids AS uuid[]))", ids=list(rows))
    wrong = [r for r in found if (r["published_at"] is not None) == (r["id"] in failing)]
    if wrong or published != 2:
        failed_marked = [r for r in wrong if r["id"] in failing]
        raise CheckFailure(
            "One batch held two versions of each of two orders; the delivery report of one "
            "version of each order said the send failed (MSG_TIMED_OUT), the other's said "
            "delivered. "
            + (f"{len(failed_marked)} failed event(s) were marked published: never delivered "
               "as far as the relay knows, and no relay sends them again — lost. "
               if failed_marked else "")
            + "Records of one order share their key (and partition), so a report looked up "
              "by key, partition or position lands on another event: each report belongs to "
              "its own event id.",
            expected="relay_once returns 2; the two acknowledged rows published, the two "
                     "failed ones not",
            actual=f"returned {published!r}; {len(wrong)} row(s) on the wrong side",
            evidence=table([r | {"report": "failed" if r["id"] in failing else "delivered"}
                            for r in found], ROW_COLUMNS + ("report",)),
            lesson=SEE,
            fix="bind each record's event id to its own callback (on_delivery=lambda err, msg, "
                "event_id=event.id: …) and mark by those ids" if failed_marked else None)


def marks_wait_for_the_acknowledgement(engine: Any, relay: Any, kafka: Any, topic: str) -> None:
    """A broker that acknowledges 0.6 s after each send: at the moment the first
    acknowledgement reaches relay_once, no row may be published yet. Every UPDATE of
    outbox_event is held MARK_HOLD s before it runs: each published_at must be at least the
    database's clock when the statement that wrote it ran (so a mark that writes its rows one
    statement at a time in one transaction shows now(), the transaction's start)."""
    with engine.begin() as conn:
        conn.execute(text("UPDATE outbox_event SET published_at = clock_timestamp() "
                          "WHERE published_at IS NULL"))  # the rows of the first pass, done
    fresh = [insert_event(engine, created_ago=3.0 - i) for i in range(3)]
    acked_at: list[Any] = []  # the database clock when the first acknowledgement arrived

    def at_first_ack() -> list[dict[str, Any]]:
        acked_at.append(db_now(engine))
        return outbox_rows(engine, "id = ANY(CAST(:ids AS uuid[])) AND "
                                   "published_at IS NOT NULL", ids=fresh)

    watch = AckWatch(SlowProducer(kafka.producer(), delay=0.6), at_first_ack)
    with StatementClockWatch(engine, "published_at", fresh, MARK_HOLD) as clock:
        call(relay.relay_once, engine, watch, topic, batch_size=10, lease_seconds=30)
    early = watch.seen or []
    if early:
        raise CheckFailure(
            f"{len(early)} row(s) were already marked published when the first acknowledgement "
            "reached relay_once (the broker here acknowledges 0.6 s after each send). Marked "
            "before the broker has the record, an event is lost if the relay dies before the "
            "acknowledgement or the send fails: the row says published, so no relay sends it "
            "again — un-marking on a failed report cannot help a process that is dead.",
            expected="at the first acknowledgement, none of the 3 rows published yet",
            actual=f"{len(early)} row(s) published before any acknowledgement",
            evidence=table(early, ROW_COLUMNS), lesson=MISTAKES,
            fix="mark a row only after its delivery report says it was delivered (after "
                "flush(), or in the callback)")
    backdated = outbox_rows(engine, "id = ANY(CAST(:ids AS uuid[])) AND published_at < :acked",
                            ids=fresh, acked=acked_at[0]) if acked_at else []
    if backdated:
        raise CheckFailure(
            f"{len(backdated)} row(s) say they were published before the first acknowledgement "
            f"reached relay_once (at {acked_at[0]} on the database clock; the broker here "
            "acknowledges 0.6 s after each send). published_at is when the mark learned of "
            "the acknowledgement, on the database's clock (clock_timestamp() in the mark): a "
            "time from the record itself (its timestamp, taken at produce()) or from the "
            "relay's host is earlier by however slow the broker is, and the publish-age SLO "
            "then hides exactly that.",
            expected=f"every published_at ≥ {acked_at[0]}",
            actual=f"{len(backdated)} row(s) earlier",
            evidence=table(backdated, ROW_COLUMNS), lesson=SEE,
            fix="SET published_at = clock_timestamp() in the mark")
    require_marks_on_the_statement_clock(engine, clock, fresh)


MARK_HOLD = 0.2  # each UPDATE of outbox_event waits this long before it runs
MARK_SLACK = 0.05


def require_marks_on_the_statement_clock(engine: Any, clock: StatementClockWatch,
                                         fresh: list[str]) -> None:
    older = clock.older(MARK_SLACK)
    if not older:
        return
    statements = len({w["statement"] for w in clock.written.values()})
    began = all(w["= its transaction's start"] for w in older)
    raise CheckFailure(
        f"Each UPDATE of outbox_event was held {MARK_HOLD:g} s before it ran, and "
        f"{len(older)} of the {len(fresh)} acknowledged rows got a published_at older than "
        "the database's clock when the statement that marked it ran"
        + (" (each of them holds exactly the start of the transaction its UPDATE ran in, "
           "a transaction that began before that UPDATE: now(), CURRENT_TIMESTAMP and "
           f"transaction_timestamp() stay there while {statements} statements mark the rows "
           "one after the other)"
           if began else
           " (not its transaction's start either: a time taken before the statement ran, "
           "from this process's clock or an earlier query)")
        + ". published_at is when the mark ran, on the database's clock: an older time "
          "understates the publish age by however long the mark waited (a lock, a slow "
          "connection, the rows marked before it).",
        expected="every published_at ≥ the database's clock_timestamp() when the UPDATE that "
                 "set it ran",
        actual="; ".join(f"row {w['id'][:8]}: {w['before the statement ran']} before the "
                         f"marking statement {w['statement']} ran" for w in older),
        evidence=table(list(clock.written.values()),
                       ("id", "statement", "value", "ran", "began")),
        lesson=SEE,
        fix="SET published_at = clock_timestamp() in each marking UPDATE" if began else None)


def test_publish_claimed_holds_no_transaction_while_it_waits(outbox, learner, kafka):
    require_table(outbox, "outbox_event", "publish")
    relay = learner.module("relay")
    topic = kafka.topic(1, hint="waits")
    for i in range(3):
        insert_event(outbox, created_ago=3.0 - i)
    events = call(relay.claim_batch, outbox, batch_size=10, lease_seconds=30)
    # Looked at when the first acknowledgement is about to reach publish_claimed: it is then
    # waiting for the broker (flush() or poll()).
    watch = AckWatch(SlowProducer(kafka.producer(), delay=0.8),
                     lambda: other_sessions(outbox))
    call(relay.publish_claimed, outbox, watch, topic, events, ack_timeout_seconds=10)
    sessions = watch.seen or []
    held = open_transactions(sessions)
    if not watch.looked:
        raise CheckFailure(
            "publish_claimed returned without waiting for a single acknowledgement.",
            expected="publish_claimed waits for the delivery reports (flush() or poll())",
            actual="it returned before the first report reached it", lesson=SEE)
    if held:
        raise CheckFailure(
            "While publish_claimed waited for a slow broker (0.8 s per acknowledgement), a "
            "session of it sat in an open transaction. Whatever that transaction read or locked "
            "stays held, and a pooled connection is pinned, for as long as Kafka takes: a slow "
            "broker becomes a stuck database. Send and wait with no transaction open; open the "
            "marking transaction after the acknowledgements are in.",
            expected="no session in an open transaction while publish_claimed waits",
            actual=f"{len(held)} session(s) idle in transaction during the wait",
            evidence=table(sessions, SESSION_COLUMNS), lesson=f"{SEE} {MISTAKES}")


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
    late = first.result(0)
    if late != 1:
        raise CheckFailure(
            "Relay A's send was acknowledged by the broker, even though relay B marked the row "
            "first. publish_claimed returns how many events the broker acknowledged in this "
            "call, not how many rows its own mark changed: the record did leave (twice, which "
            "the consumer's dedupe absorbs), and a relay loop or a metric counting marked rows "
            "would report an acknowledged send as never published.",
            expected="relay A's relay_once returns 1 (one acknowledgement)",
            actual=f"it returned {late!r}", evidence=f"event {event_id}", lesson=SEE,
            fix="count the acknowledgements the delivery reports gave, not the UPDATE's "
                "rowcount")
    late_failure_leaves_a_published_row_alone(outbox, relay, topic, relay_producer)
    late_failure_leaves_a_live_lease_alone(outbox, relay, topic, relay_producer)
    acknowledged_after_the_lease_is_marked(outbox, relay, topic, relay_producer)
    acknowledged_after_a_reclaim_is_marked(outbox, relay, topic, relay_producer)


def acknowledged_after_the_lease_is_marked(engine: Any, relay: Any, topic: str,
                                           relay_producer: Any) -> None:
    """A lone relay whose 0.3 s lease runs out during a 0.8 s send: nobody else claimed the
    row, the broker acknowledged it, so it is published."""
    event_id = insert_event(engine)
    slow = SlowProducer(relay_producer(), delay=0.8)
    published = call(relay.relay_once, engine, slow, topic, batch_size=10, lease_seconds=0.3)
    [after] = outbox_rows(engine, "id = CAST(:id AS uuid)", id=event_id)
    if published != 1 or after["published_at"] is None:
        raise CheckFailure(
            "A relay's 0.3 s lease ran out while the broker took 0.8 s to acknowledge; no other "
            "relay claimed the row meanwhile. The broker has the record, so the row must be "
            "marked published: a mark that also requires an unexpired lease leaves it "
            "unpublished and claimable, and when every send outlasts the lease it is re-sent "
            "for ever. The lease decides who sends, not whether an acknowledgement counts.",
            expected="relay_once returns 1; the row published",
            actual=f"returned {published!r}; published_at {after['published_at']}",
            evidence=table([after], ROW_COLUMNS + ("lease_until",)), lesson=SEE,
            fix="mark WHERE id = :id AND published_at IS NULL, without a condition on "
                "lease_until" if published == 1 else None)


@dataclass
class Overtaken:
    """How relay B overtook relay A during A's slow send (see overtaken_during_send)."""
    a_result: Any               # what A's relay_once returned once it was let go
    b_result: Any               # what B's step returned
    after_b: dict[str, Any]     # the row right after B's step, before any UPDATE of A's


def overtaken_during_send(engine: Any, relay: Any, topic: str, relay_producer: Any, *,
                          delay: float, relay_b: Callable[[], Any],
                          **a_kwargs: Any) -> tuple[str, Overtaken | None]:
    """Relay A relays a new event through a producer whose send takes `delay` s. Once A's send
    has begun, A's lease is made to run out (fast-forwarded) and relay B takes its step
    (`relay_b()`, e.g. a claim or a whole relay_once) while every UPDATE of A's on
    outbox_event waits; A is let go after B's step, and joined. Returns the event id and what
    happened, or None when A never began a send (after re-raising what A raised)."""
    from sqlalchemy import event

    event_id = insert_event(engine)
    slow = SlowProducer(relay_producer(), delay=delay)
    first = in_thread(relay.relay_once, engine, slow, topic, batch_size=10, lease_seconds=30,
                      **a_kwargs)
    b_done, armed = threading.Event(), threading.Event()  # armed: A's claim is behind it
    a_thread = f"dojo-learner-{getattr(relay.relay_once, '__name__', 'call')}"

    def hold_a(conn: Any, cursor: Any, statement: str, *rest: Any) -> None:
        if armed.is_set() and threading.current_thread().name == a_thread and \
                re.search(r"\bupdate\s+(only\s+)?(public\.)?\"?outbox_event\b", statement,
                          re.IGNORECASE):
            b_done.wait(10)

    event.listen(engine, "before_cursor_execute", hold_a)
    try:
        if not slow.first_send.wait(10):
            first.join(5)
            first.result(0)
            return event_id, None
        armed.set()
        with engine.begin() as conn:  # A's lease has run out
            conn.execute(text("UPDATE outbox_event SET lease_until = clock_timestamp() - "
                              "interval '1 millisecond' WHERE id = CAST(:id AS uuid)"),
                         {"id": event_id})
        b_result = relay_b()
        [after_b] = outbox_rows(engine, "id = CAST(:id AS uuid)", id=event_id)
    finally:
        b_done.set()
        first.join(15)  # A's statements read the listener list: remove it once A is done
        event.remove(engine, "before_cursor_execute", hold_a)
    return event_id, Overtaken(first.result(0), b_result, after_b)


def acknowledged_after_a_reclaim_is_marked(engine: Any, relay: Any, topic: str,
                                           relay_producer: Any) -> None:
    """Relay A's lease runs out (fast-forwarded) during a 0.8 s send and relay B claims the
    row (a later attempt, a 30 s lease) but has not sent it yet when A's acknowledgement
    arrives (the check holds A's UPDATEs until B's claim is done). The broker has A's record:
    A's mark publishes the row, whoever holds the lease and whatever attempt it is on."""
    event_id, run = overtaken_during_send(
        engine, relay, topic, relay_producer, delay=0.8,
        relay_b=lambda: call(relay.claim_batch, engine, batch_size=10, lease_seconds=30))
    if run is None or len(run.b_result or []) != 1:
        return  # A sent nothing, or B did not claim it: the claim stage covers that
    published, after_b = run.a_result, run.after_b
    [after_a] = outbox_rows(engine, "id = CAST(:id AS uuid)", id=event_id)
    if published != 1 or after_a["published_at"] is None:
        raise CheckFailure(
            "Relay A's lease ran out during a slow send and relay B claimed the row (attempt "
            f"{after_b['attempt_count']}, a 30 s lease); before B sent anything, the broker "
            "acknowledged A's record. The record is in Kafka, so A's mark must publish the "
            "row: a mark that also requires A's attempt_count (or A's lease) to be still the "
            "row's refuses it, and when sends outlast the lease, relays that keep reclaiming "
            "the row refuse each other's marks and re-send it for ever. Only the failure "
            "update is fenced by the attempt; the mark is conditional on published_at alone.",
            expected="relay A's relay_once returns 1; the row published",
            actual=f"returned {published!r}; published_at {after_a['published_at']}",
            evidence=table([after_b | {"id": "after B's claim"}, after_a | {"id": "after A"}],
                           ("id",) + ROW_COLUMNS[1:] + ("lease_until",)),
            lesson=SEE,
            fix="mark WHERE id = :id AND published_at IS NULL, with no condition on "
                "attempt_count or lease_until" if published == 1 else None)


def late_failure_leaves_a_live_lease_alone(engine: Any, relay: Any, topic: str,
                                           relay_producer: Any) -> None:
    """Relay A's send gets no acknowledgement within its 0.5 s timeout; meanwhile its lease
    expired (fast-forwarded) and relay B claimed the row (a 30 s lease) and is sending it. A's
    failure, recorded after B's claim, must not clear B's lease nor set a backoff: a third
    relay would claim the row while B still sends it."""
    event_id, run = overtaken_during_send(
        engine, relay, topic, relay_producer, delay=3.0, ack_timeout_seconds=0.5,
        relay_b=lambda: call(relay.claim_batch, engine, batch_size=10, lease_seconds=30))
    if run is None or len(run.b_result or []) != 1 or run.after_b["lease_until"] is None:
        return  # A sent nothing, or B did not claim it: the claim stage covers that
    b_lease = run.after_b["lease_until"]     # as PostgreSQL's text, like a_lease below
    with engine.connect() as conn:
        a_lease, backoff = conn.execute(text(
            "SELECT lease_until::text, next_attempt_at FROM outbox_event "
            "WHERE id = CAST(:id AS uuid)"), {"id": event_id}).one()
    if a_lease != b_lease or backoff is not None:
        [after] = outbox_rows(engine, "id = CAST(:id AS uuid)", id=event_id)
        raise CheckFailure(
            "Relay A's send got no acknowledgement in time; by then its lease had expired and "
            "relay B had claimed the row (a 30 s lease) and was sending it. A's failure update "
            "then "
            + ("cleared B's lease" if a_lease != b_lease else "changed B's lease")
            + (" and set a backoff" if backoff is not None else "")
            + ": once the backoff passes, a third relay claims the row while B still owns it. "
              "A failure is recorded only by the relay that still holds the row: the claim "
              "counted a new attempt, so the attempt_count A claimed with no longer matches.",
            expected=f"lease_until stays {b_lease} (B's), next_attempt_at NULL",
            actual=f"lease_until {a_lease}, next_attempt_at {backoff}",
            evidence=table([after], ROW_COLUMNS + ("lease_until", "next_attempt_at",
                                                   "last_error")),
            lesson=SEE,
            fix="fence the failure update: … WHERE id = :id AND published_at IS NULL AND "
                "attempt_count = :attempt_count (the event's, from its claim)")


def late_failure_leaves_a_published_row_alone(engine: Any, relay: Any, topic: str,
                                              relay_producer: Any) -> None:
    """Relay A's send gets no acknowledgement within its 0.5 s timeout; meanwhile its lease has
    expired (fast-forwarded) and relay B published the row. A's failure, recorded after B's
    mark (the check holds A's UPDATEs until B is done), must not touch the published row."""
    event_id, run = overtaken_during_send(
        engine, relay, topic, relay_producer, delay=3.0, ack_timeout_seconds=0.5,
        relay_b=lambda: call(relay.relay_once, engine, relay_producer(), topic, batch_size=10,
                             lease_seconds=30))
    if run is None:
        return
    second, after_b = run.b_result, run.after_b
    [after_a] = outbox_rows(engine, "id = CAST(:id AS uuid)", id=event_id)
    if second != 1 or after_b["published_at"] is None:
        return  # B did not publish: nothing to compare (the first half covers B)
    if after_a["last_error"] is not None or after_a["next_attempt_at"] is not None:
        raise CheckFailure(
            "Relay A's send got no acknowledgement in time; by then its lease had expired and "
            "relay B had re-sent and marked the row. A then recorded its failure on the "
            "published row anyway: last_error and next_attempt_at now describe a failure of "
            "an event that was delivered, and an operator (or an alert on last_error) chases a "
            "problem that is not there. The failure update is conditional, like the mark.",
            expected="the published row keeps last_error NULL and next_attempt_at NULL",
            actual=f"last_error {str(after_a['last_error'])[:60]!r}, next_attempt_at "
                   f"{after_a['next_attempt_at']}",
            evidence=table([after_a], ROW_COLUMNS + ("last_error", "next_attempt_at")),
            lesson=SEE,
            fix="UPDATE … SET last_error = …, next_attempt_at = …, lease_until = NULL WHERE id = "
                ":id AND published_at IS NULL")
