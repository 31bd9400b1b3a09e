"""Stage idempotent-consumer: the event id from the header, the marker and the effect in one
transaction, duplicates and racing twins applied once, offsets committed after the database."""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from typing import Any

import pytest
from _kafka_support import CommitWatch, deliver
from _support import CONSUMER, require_table
from confluent_kafka import KafkaError, TopicPartition
from sqlalchemy import Engine, text

from dojo.checks import CheckFailure, call, first_line, in_thread, raised, sqlstate, table
from dojo.checks.faults import duplicate_and_reorder, run_concurrently, slow_sql
from dojo.checks.observers import record_sql

pytestmark = pytest.mark.stage("idempotent-consumer")

PLACED, CHANGED = "order.placed.v1", "order.total-changed.v1"
# Lesson sections the failures point to.
MARKER = f"{CONSUMER}#marker-and-effect-in-one-transaction"
DUPLICATES = f"{CONSUMER}#duplicates-are-the-normal-case"
THE_KEY = f"{CONSUMER}#choosing-the-de-duplication-key"
RACE = f"{CONSUMER}#why-check-then-act-is-a-race"
TWINS = f"{CONSUMER}#two-consumers-one-event-what-the-database-does"
OFFSETS = f"{CONSUMER}#offsets-kafka-transactions-and-what-they-do-not-cover"
RACE_ROUNDS = 2  # exists-then-insert is caught in round 1: slowed SQL lines the twins up


def placed(customer: str, total: int, **extra: Any) -> dict[str, Any]:
    return {"order_id": str(uuid.uuid4()), "customer_id": customer, "total_cents": total,
            **extra}


def stats(engine: Engine) -> dict[str, tuple[int, int]]:
    with engine.connect() as conn:
        return {str(r[0]): (r[1], r[2]) for r in conn.execute(text(
            "SELECT customer_id, orders_placed, total_cents FROM customer_stats"))}


def processed(engine: Engine) -> set[str]:
    with engine.connect() as conn:
        return {str(r[0]) for r in conn.execute(text("SELECT event_id FROM processed_event"))}


def state(engine: Engine) -> str:
    rows = [{"customer_id": c, "orders_placed": o, "total_cents": t}
            for c, (o, t) in stats(engine).items()]
    return ("customer_stats:\n" + table(rows, ("customer_id", "orders_placed", "total_cents")) +
            "\nprocessed_event: " + (", ".join(sorted(processed(engine))) or "(empty)"))


def test_processed_event_table(outbox):
    require_table(outbox, "processed_event", "idempotent-consumer")
    with outbox.connect() as conn:
        rows = conn.execute(text("""
            SELECT format_type(a.atttypid, a.atttypmod) AS type,
                   EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = a.attrelid
                           AND i.indisunique AND i.indpred IS NULL
                           AND i.indnkeyatts = 1 AND i.indkey[0] = a.attnum) AS is_unique
            FROM pg_attribute a WHERE a.attrelid = 'processed_event'::regclass
              AND a.attname = 'event_id' AND NOT a.attisdropped""")).all()
    if not (rows and rows[0].type in ("uuid", "text") and rows[0].is_unique):
        raise CheckFailure(
            "processed_event remembers which events were applied. Its event_id must be unique on "
            "its own, so the database — not a check in your code — decides who is first.",
            expected="processed_event(event_id uuid PRIMARY KEY, processed_at timestamptz …)",
            actual=f"event_id column: {rows[0].type if rows else 'missing'}, unique: "
                   f"{rows[0].is_unique if rows else '-'}", lesson=MARKER)


def test_duplicates_apply_once(outbox, learner, kafka):
    require_table(outbox, "processed_event", "idempotent-consumer")
    consumer = learner.module("consumer")
    a, b = str(uuid.uuid4()), str(uuid.uuid4())
    events = [(str(uuid.uuid4()), PLACED, placed(c, total))
              for c, total in ((a, 100), (a, 200), (b, 300), (b, 400))]
    messages = deliver(kafka, duplicate_and_reorder(events, copies=3, seed=11))
    calls: list[str] = []  # outside any transaction: what a rollback cannot take back

    def effect(conn: Any, event_type: str, payload: Any) -> None:
        calls.append(payload["order_id"])
        consumer.apply_effect(conn, event_type, payload)

    results = [call(consumer.handle_record, outbox, m, effect=effect) for m in messages]
    want = {a: (2, 300), b: (2, 700)}
    if stats(outbox) == want and results.count(True) == 4 and len(calls) != 4:
        raise CheckFailure(
            f"Each of 4 events was delivered 3 times, and the effect was called {len(calls)} "
            "times. The database ends up right (the duplicates' transactions rolled back), but "
            "an effect reaches further than this transaction: an e-mail, a call to another "
            "service, a cache. The marker decides, then the effect runs — only for a new event.",
            expected="effect called 4 times, once per event",
            actual=f"effect called {len(calls)} times "
                   f"({len(set(calls))} distinct orders)",
            evidence=state(outbox), lesson=DUPLICATES,
            fix="INSERT the marker … ON CONFLICT DO NOTHING first; if it inserted no row return "
                "False before calling effect")
    if not (stats(outbox) == want and results.count(True) == 4):
        again = raised_or_value(consumer.handle_record, outbox, messages[0])
        if again is False and results.count(True) > 4:
            raise CheckFailure(
                "Each of 4 events was delivered 3 times, as 3 records at different offsets (what "
                "a relay that re-sends after a crash produces). Handed the very same record "
                "again, handle_record said duplicate; handed the same event at another offset, "
                "it applied it again: it deduplicates on the record's position (topic, "
                "partition, offset), which only catches a re-read of one record, never the "
                "relay's duplicates.",
                expected=f"customer_stats {want}; handle_record True 4 times, False 8 times",
                actual=f"True {results.count(True)} times; the same record again → False",
                evidence=state(outbox), lesson=THE_KEY,
                fix="deduplicate on the event-id header: the id of the outbox row, the same in "
                    "every copy")
        raise CheckFailure(
            "Each of 4 events was delivered 3 times, shuffled (at-least-once delivery does this "
            "after a relay crash or a consumer rebalance). The effect must happen once per event.",
            expected=f"customer_stats {want}; handle_record True 4 times, False 8 times",
            actual=f"customer_stats {stats(outbox)}; True {results.count(True)} times",
            evidence=state(outbox), lesson=DUPLICATES)


def test_event_id_comes_from_the_header(outbox, learner, kafka):
    require_table(outbox, "processed_event", "idempotent-consumer")
    consumer = learner.module("consumer")
    customer = str(uuid.uuid4())
    header_id = str(uuid.uuid4())
    first = placed(customer, 100, event_id=str(uuid.uuid4()))
    # The same event, re-sent by a relay that re-serialised the payload (a v2 writer that
    # puts a fresh id in it): the header still carries the event's own id.
    again = dict(first, event_id=str(uuid.uuid4()))
    change = {"order_id": first["order_id"], "customer_id": customer, "total_cents": 150,
              "previous_total_cents": 100}  # another event of the same order, no id inside
    # Last, the first event once more from a producer that spells UUIDs in upper case: the
    # same id (a UUID compares as one, not as text).
    messages = deliver(kafka, [(header_id, PLACED, first), (header_id, PLACED, again),
                               (str(uuid.uuid4()), CHANGED, change),
                               (header_id.upper(), PLACED, first)])
    outcomes = []
    for msg in messages:
        try:
            outcomes.append(call(consumer.handle_record, outbox, msg))
        except CheckFailure:
            raise  # a stub: not written yet
        except Exception as exc:  # reported with the evidence below
            outcomes.append(f"raised {type(exc).__name__}: {exc}")
    if outcomes[:3] == [True, False, True] and outcomes[3] is not False:
        raise CheckFailure(
            "The first event came once more, its event-id header spelled in upper case (another "
            "producer's UUID formatting), and handle_record applied it again. The event id is a "
            "UUID: parse it (uuid.UUID) and store it as one (processed_event.event_id uuid), so "
            "every spelling of one id is one marker.",
            expected="the same event in upper case → False (a duplicate)",
            actual=f"→ {outcomes[3]!r}; customer_stats {stats(outbox).get(customer)}",
            evidence=state(outbox), lesson=THE_KEY,
            fix="event_id = uuid.UUID(header_value.decode()) before the INSERT")
    if not (stats(outbox) == {customer: (1, 150)} and outcomes == [True, False, True, False]):
        raise CheckFailure(
            "The deduplication key is the event id in the record's `event-id` header: the relay "
            "sets it from the outbox row and it never changes. The payload is the event's data; "
            "its shape evolves (v2 adds, renames, re-generates fields), and a business id like "
            "order_id is shared by every event of that order.",
            expected="placed (header X) → True; the same event again (header X, payload with "
                     "another event_id) → False; total-changed of the same order (header Y) → "
                     "True; placed again (header X in upper case) → False",
            actual=f"{outcomes}", evidence=state(outbox), lesson=THE_KEY)
    refuses_a_record_without_event_id(outbox, consumer, kafka)


def refuses_a_record_without_event_id(engine: Engine, consumer: Any, kafka: Any) -> None:
    """A record with no event-id header has nothing to deduplicate on: refused, nothing
    written, the effect not called."""
    customer = str(uuid.uuid4())
    [message] = deliver_without_event_id(kafka, placed(customer, 250))
    before = processed(engine)
    calls: list[str] = []

    def effect(conn: Any, event_type: str, payload: Any) -> None:
        calls.append(event_type)
        consumer.apply_effect(conn, event_type, payload)

    outcome = raised_or_value(consumer.handle_record, engine, message, effect=effect)
    if not isinstance(outcome, Exception) or calls or processed(engine) != before:
        raise CheckFailure(
            "A record without an event-id header was "
            + ("applied" if calls else "accepted")
            + ": with no event id there is nothing to deduplicate on, so every redelivery of "
            "it would be applied again. handle_record must refuse it — raise (ValueError) — "
            "and write nothing; the record then goes wherever failed records go (the next "
            "lab's dead-letter topic).",
            expected="handle_record raises; no processed_event row; the effect not called",
            actual=(f"it returned {outcome!r}" if not isinstance(outcome, Exception) else
                    f"it raised {type(outcome).__name__}")
                   + f"; the effect was called {len(calls)} time(s); "
                   f"{len(processed(engine) - before)} new processed_event row(s)",
            evidence=state(engine), lesson=THE_KEY,
            fix="raise ValueError when the record has no event-id header, before the "
                "transaction — never make up an id" if calls else None)


def deliver_without_event_id(kafka: Any, payload: dict[str, Any]) -> list[Any]:
    """One real record with an event-type header and no event-id."""
    from confluent_kafka import TopicPartition

    topic = kafka.topic(1, hint="no-id")
    producer = kafka.producer(**{"linger.ms": 0})
    producer.produce(topic, value=json.dumps(payload).encode(), key=b"k",
                     headers=[("event-type", PLACED.encode())])
    producer.flush(10)
    reader = kafka.consumer()
    reader.assign([TopicPartition(topic, 0, 0)])
    deadline = time.monotonic() + 10
    try:
        while time.monotonic() < deadline:
            msg = reader.poll(0.2)
            if msg is not None and not msg.error():
                return [msg]
    finally:
        reader.close()
    raise RuntimeError("the check could not read back the record it wrote")


def raised_or_value(fn: Any, *args: Any, **kwargs: Any) -> Any:
    try:
        return call(fn, *args, **kwargs)
    except CheckFailure:
        raise
    except Exception as exc:  # shown as what happened
        return exc


def test_racing_consumers_apply_once(outbox, learner, kafka):
    require_table(outbox, "processed_event", "idempotent-consumer")
    consumer = learner.module("consumer")
    for round_no in range(1, RACE_ROUNDS + 1):
        customer = str(uuid.uuid4())
        [message] = deliver(kafka, [(str(uuid.uuid4()), PLACED, placed(customer, 500))])
        # Two consumers got the same event (a rebalance handed it over mid-processing).
        def handle(_: int, message: Any = message) -> Any:
            return call(consumer.handle_record, outbox, message)

        with record_sql(outbox, peek=0) as log, slow_sql(outbox, 0.05):
            outcomes = run_concurrently(handle, 2, timeout=20)
        errors = [o.error for o in outcomes if o.error is not None]
        values = [o.value for o in outcomes if o.error is None]
        checked_first = all(
            first_marker_statement(log.by_worker(f"worker {i}")) == "SELECT" for i in (0, 1))
        states = {sqlstate(e) for e in errors}
        if errors and states <= {"40001", "40P01"}:
            raise CheckFailure(
                f"Two consumers handled the same event at the same moment (round {round_no}) and "
                "the one that came second raised a serialization failure instead of returning "
                "False. Under SERIALIZABLE (or REPEATABLE READ), the twin's INSERT … ON CONFLICT "
                "DO NOTHING waits for the first commit and then cannot proceed: the data stays "
                "right, but the consumer crashes on an ordinary duplicate. At READ COMMITTED the "
                "twin's insert finds the committed marker, inserts nothing, and the handler "
                "returns False.",
                expected="one handle_record returns True, the other False, neither raises",
                actual="; ".join(f"{type(e).__name__} (SQLSTATE {sqlstate(e)}): "
                                 f"{first_line(e)[:100]}" for e in errors),
                evidence=state(outbox), lesson=TWINS,
                fix="run handle_record's transaction at READ COMMITTED (the default), or retry "
                    "the transaction on SQLSTATE 40001 — the retry then returns False")
        if errors:
            raise CheckFailure(
                f"Two consumers handled the same event at the same moment (round {round_no}) and "
                "one of them crashed."
                + (" Both checked processed_event first and inserted afterwards: a "
                   "check-then-act race — both saw 'not processed', both went on, and the second "
                   "insert hit the primary key." if checked_first else ""),
                expected="one handle_record returns True, the other False, neither raises",
                actual="; ".join(f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"
                                 for e in errors), evidence=state(outbox),
                lesson=RACE if checked_first else TWINS,
                fix="INSERT INTO processed_event … ON CONFLICT DO NOTHING first, and apply the "
                    "effect only if it inserted a row — the twin waits for the first commit and "
                    "inserts nothing" if checked_first else None)
        if not (sorted(values) == [False, True] and stats(outbox)[customer] == (1, 500)):
            raise CheckFailure(
                f"Two consumers handled the same event at once (round {round_no}); the effect "
                "must happen exactly once."
                + (" Both checked processed_event first (SELECT), both saw nothing and both "
                   "applied the effect: check-then-act. The marker insert must decide, and its "
                   "result must be read: a row inserted means first, none means duplicate."
                   if checked_first else ""),
                expected="True once, False once; orders_placed 1",
                actual=f"returned {values}; customer_stats {stats(outbox).get(customer)}",
                evidence=state(outbox) + "\n" + log.timeline(match="processed_event"),
                lesson=RACE if checked_first else TWINS,
                fix="INSERT INTO processed_event … ON CONFLICT DO NOTHING, and apply the effect "
                    "only when it inserted a row (its rowcount, or RETURNING)"
                if checked_first else None)


def first_marker_statement(statements: Any) -> str | None:
    """What a worker did first with processed_event: "SELECT" or "INSERT" (None: nothing)."""
    for st in statements:
        if re.search(r"\bprocessed_event\b", st.sql, re.IGNORECASE):
            verb = st.sql.lstrip().split(None, 1)[0].upper()
            return "SELECT" if verb in ("SELECT", "WITH") and "INSERT" not in st.sql.upper() \
                else "INSERT"
    return None


def test_failed_effect_rolls_back_the_marker(outbox, learner, kafka):
    require_table(outbox, "processed_event", "idempotent-consumer")
    consumer = learner.module("consumer")
    customer = str(uuid.uuid4())
    event_id = str(uuid.uuid4())
    [message] = deliver(kafka, [(event_id, PLACED, placed(customer, 700))])

    def effect_that_fails(conn: Any, event_type: str, payload: Any) -> None:
        consumer.apply_effect(conn, event_type, payload)  # some of the work happened…
        raise RuntimeError("the effect failed halfway (injected by the check)")

    error: BaseException | None = None
    try:
        call(consumer.handle_record, outbox, message, effect=effect_that_fails)
    except RuntimeError as exc:
        error = exc
    after_failure = state(outbox)
    marked = event_id in processed(outbox)
    if not (error is not None and not marked and customer not in stats(outbox)):
        raise CheckFailure(
            "The effect failed, so nothing may remain: no marker, no half effect, and the error "
            "propagates so the record is not committed and comes again. If the marker commits in "
            "its own transaction, the redelivery finds it and skips: the event is LOST. The marker "
            "and the effect must be in the same transaction.",
            expected="handle_record raises; processed_event without the event; customer_stats "
                     "untouched",
            actual=f"{'raised' if error else 'did not raise'}; marker "
                   f"{'present' if marked else 'absent'}; customer_stats "
                   f"{stats(outbox).get(customer)}", evidence=after_failure,
            lesson=MARKER)
    require_integrity_error_propagates(outbox, consumer, message, event_id, customer)
    seen: dict[str, Any] = {}

    def effect_that_looks(conn: Any, event_type: str, payload: Any) -> None:
        consumer.apply_effect(conn, event_type, payload)
        seen["on its connection"] = marker_count(conn, event_id)
        with outbox.connect() as other:  # another session: only committed rows
            seen["committed"] = marker_count(other, event_id)

    applied = call(consumer.handle_record, outbox, message, effect=effect_that_looks)
    if not (applied is True and stats(outbox)[customer] == (1, 700)):
        raise CheckFailure(
            "Redelivered after the failure, the event must be processed now.",
            expected="True; orders_placed 1, total 700",
            actual=f"{applied}; {stats(outbox).get(customer)}", evidence=state(outbox),
            lesson=MARKER)
    # One transaction: either the effect's connection already sees the (uncommitted) marker,
    # or — marker written after the effect — both rows were written by the same transaction.
    with outbox.connect() as conn:
        xmins = conn.execute(text(
            "SELECT (SELECT xmin::text FROM processed_event WHERE event_id::text = :e), "
            "(SELECT xmin::text FROM customer_stats WHERE customer_id = CAST(:c AS uuid))"),
            {"e": event_id, "c": customer}).one()
    marker_first = seen.get("on its connection") == 1 and seen.get("committed") == 0
    together = xmins[0] is not None and xmins[0] == xmins[1]
    if not (marker_first or together):
        raise CheckFailure(
            "The effect did not run in the marker's transaction: handle_record gave effect() a "
            "connection of its own. Each commits separately, so a crash (or a failed commit) "
            "between the two leaves an effect without its marker — the redelivery applies it "
            "again — or a marker without its effect. Call effect(conn, …) with the same "
            "connection, inside the same `with engine.begin() as conn:` block, as the "
            "INSERT INTO processed_event.",
            expected="while the effect runs, its connection sees the uncommitted marker row "
                     "(and no other session does); or both rows written by one transaction",
            actual=f"marker rows seen on the effect's connection: "
                   f"{seen.get('on its connection')}, committed (seen by another session): "
                   f"{seen.get('committed')}; writing transaction (xmin) of the marker "
                   f"{xmins[0]}, of the customer_stats row {xmins[1]}",
            evidence=state(outbox), lesson=MARKER)


def require_integrity_error_propagates(engine: Engine, consumer: Any, message: Any,
                                       event_id: str, customer: str) -> None:
    """The effect's own write breaks a constraint (a NOT NULL column left empty): the database
    raises an IntegrityError, as it does for a duplicate marker. It is a failure, not a
    duplicate: handle_record raises and nothing remains."""

    def effect_that_breaks_a_constraint(conn: Any, event_type: str, payload: Any) -> None:
        consumer.apply_effect(conn, event_type, payload)
        conn.execute(text("INSERT INTO customer_stats (customer_id) VALUES (NULL)"))

    outcome = raised_or_value(consumer.handle_record, engine, message,
                              effect=effect_that_breaks_a_constraint)
    marked = event_id in processed(engine)
    if isinstance(outcome, BaseException) and not marked and customer not in stats(engine):
        return
    swallowed = outcome is False and not marked
    raise CheckFailure(
        "The effect's own INSERT broke a NOT NULL constraint (the check's effect wrote "
        "customer_stats without a customer_id): the database raised an IntegrityError, a "
        "failure like any other. "
        + ("handle_record returned False, \"a duplicate\", though no marker exists: an "
           "IntegrityError caught around the marker and the effect also catches the effect's "
           "own, consume() then commits the offset, and the event is lost without a trace."
           if swallowed else
           "It must propagate, and leave no marker and no half effect."),
        expected="handle_record raises the IntegrityError; processed_event without the event; "
                 "customer_stats untouched",
        actual=(f"returned {outcome!r}" if not isinstance(outcome, BaseException) else
                f"raised {first_line(outcome)}") + f"; marker "
               f"{'present' if marked else 'absent'}; customer_stats {stats(engine).get(customer)}",
        evidence=state(engine), lesson=MARKER,
        fix="decide \"duplicate\" from the marker insert alone (INSERT … ON CONFLICT DO NOTHING "
            "and its row count), and let every error of the effect propagate"
        if swallowed else None)


def marker_count(conn: Any, event_id: str) -> int:
    return int(conn.execute(text("SELECT count(*) FROM processed_event "
                                 "WHERE event_id::text = :e"), {"e": event_id}).scalar_one())


def produce_events(kafka: Any, topic: str, events: list[tuple[str, str, Any]]) -> None:
    import json

    producer = kafka.producer(**{"linger.ms": 0})
    for event_id, event_type, payload in events:
        producer.produce(topic, key=b"k", value=json.dumps(payload).encode(), headers=[
            ("event-id", event_id.encode()), ("event-type", event_type.encode())])
    if producer.flush(10):
        raise RuntimeError(f"the check could not write its records to {topic}")


def committed_offset(consumer: Any, topic: str) -> int | None:
    deadline = time.monotonic() + 1.5
    offset = None
    while time.monotonic() < deadline:
        [tp] = consumer.committed([TopicPartition(topic, 0)], timeout=5)
        offset = tp.offset if tp.offset >= 0 else None
        if offset is not None:
            return offset
        time.sleep(0.1)
    return offset


def group_consumer(kafka: Any, topic: str, group: str) -> Any:
    """A consumer in `group`, assigned partition 0 directly (committed offsets still apply;
    no group join, so no rebalance wait)."""
    consumer = kafka.consumer(group)
    consumer.assign([TopicPartition(topic, 0)])
    return consumer


def test_offset_is_committed_after_the_database_commit(outbox, learner, kafka):
    require_table(outbox, "processed_event", "idempotent-consumer")
    consumer_module = learner.module("consumer")
    topic = kafka.topic(1, hint="commit")
    customer = str(uuid.uuid4())
    events = [(str(uuid.uuid4()), PLACED, placed(customer, 100)) for _ in range(3)]
    # The tail of the partition is two duplicates (redelivered by a relay): they are handled
    # (and counted) like any record, and their offsets committed too.
    produce_events(kafka, topic, events + events[1:])
    group = kafka.group_id("commit")
    kafka_consumer = group_consumer(kafka, topic, group)
    watch = CommitWatch(kafka_consumer, outbox)
    started = time.monotonic()
    handled = call(consumer_module.consume, outbox, watch, max_records=5, timeout_seconds=4)
    took = time.monotonic() - started
    if watch.violations:
        raise CheckFailure(
            "consume() committed a Kafka offset before the database transaction of that record "
            "had committed. If the process dies between the two, Kafka thinks the record is done "
            "and it is never redelivered: the event is lost. Commit the offset only after the "
            "database commit (a crash then redelivers, and the marker makes that harmless).",
            expected="at every offset commit, every record below it already in processed_event",
            actual=f"{len(watch.violations)} offset commit(s) ahead of the database",
            evidence=table(watch.violations, ("partition", "committed up to", "records below it",
                                           "processed_event rows")),
            lesson=OFFSETS)
    offset = committed_offset(kafka_consumer, topic)
    if handled != 5:
        raise CheckFailure(
            "consume(max_records=5) was given 5 records, 2 of them duplicates, and returned "
            f"{handled!r} after {took:.1f} s. It counts every record it handled, duplicates "
            "included: a duplicate is handled work (read, checked, its offset committed). "
            "Counting only new events makes max_records wait for records that never come.",
            expected="consume returns 5 at once",
            actual=f"returned {handled!r} after {took:.1f} s (timeout_seconds=4)",
            evidence=f"commits seen: {watch.commits}", lesson=OFFSETS,
            fix="count each record once handle_record returned, whatever it returned")
    if offset == 3 and len(watch.commits) == 3:
        raise CheckFailure(
            "consume() handled 5 records, the last 2 of them duplicates, and committed only the "
            "offsets of the 3 new ones. Each record's offset is committed once its transaction "
            "committed, duplicates too: otherwise the group's committed offset stays behind the "
            "duplicates, a restart reads them again, and the consumer's lag never reaches 0.",
            expected="committed offset 5 (next to read)",
            actual=f"committed offset {offset}; {len(watch.commits)} commit(s)",
            evidence=f"commits seen: {watch.commits}", lesson=OFFSETS,
            fix="commit after every record handle_record returned for, True or False")
    if not (handled == 5 and offset == 5):
        behind = handled == 5 and offset == 4
        raise CheckFailure(
            "After handling 5 records, the group's committed offset must say so (next to read: 5), "
            "or a restarted consumer handles them all again."
            + (" It is the last handled record's own offset: Kafka's committed offset is the "
               "next record to read, so a restart re-reads the last record every time, and the "
               "group's lag never reaches 0." if behind else ""),
            expected="consume returns 5; committed offset 5",
            actual=f"consume returned {handled!r}; committed offset {offset}",
            evidence=f"commits seen: {watch.commits}", lesson=OFFSETS,
            fix="commit(message=record) (it commits offset + 1), or "
                "TopicPartition(topic, partition, record.offset() + 1)" if behind else None)
    if watch.asynchronous:
        raise CheckFailure(
            "consume() committed offsets asynchronously: commit() returned before the broker "
            "had stored the offset. A consumer that stops or dies right after has not committed "
            "what it reports as handled, and a commit that fails is never seen.",
            expected="every commit waits for the broker (asynchronous=False)",
            actual=f"{len(watch.asynchronous)} of {len(watch.commits)} commit(s) asynchronous",
            evidence=f"commits seen: {watch.commits}", lesson=OFFSETS,
            fix="commit(message=record, asynchronous=False)")


def test_consume_goes_on_past_the_end_of_a_partition(outbox, learner, kafka):
    require_table(outbox, "processed_event", "idempotent-consumer")
    consume_goes_on_past_partition_eof(outbox, learner.module("consumer"), kafka)


def test_consume_stops_only_at_max_records_or_its_timeout(outbox, learner, kafka):
    require_table(outbox, "processed_event", "idempotent-consumer")
    consume_stops_at_its_timeout_while_records_trickle(outbox, learner.module("consumer"),
                                                       kafka)


class EofWatch:
    """Around a consumer with enable.partition.eof: notes when it has reported the end of a
    partition to the code polling it."""

    def __init__(self, consumer: Any) -> None:
        self._consumer = consumer
        self.eof = threading.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._consumer, name)

    def _saw(self, msg: Any) -> None:
        if msg is not None and msg.error() is not None and \
                msg.error().code() == KafkaError._PARTITION_EOF:
            self.eof.set()

    def poll(self, *args: Any, **kwargs: Any) -> Any:
        msg = self._consumer.poll(*args, **kwargs)
        self._saw(msg)
        return msg

    def consume(self, *args: Any, **kwargs: Any) -> list[Any]:
        msgs = self._consumer.consume(*args, **kwargs)
        for msg in msgs:
            self._saw(msg)
        return msgs


def consume_goes_on_past_partition_eof(engine: Engine, consumer_module: Any,
                                       kafka: Any) -> None:
    """A consumer that reports partition ends (enable.partition.eof) reaches the end of an
    empty partition first; two records arrive after that. consume(max_records=2) handles
    them: the end of a partition is where the log is now, not where consuming ends."""
    topic = kafka.topic(1, hint="eof")
    consumer = kafka.consumer(kafka.group_id("eof"), **{"enable.partition.eof": True})
    consumer.assign([TopicPartition(topic, 0, 0)])
    watch = EofWatch(consumer)
    customer = str(uuid.uuid4())
    job = in_thread(consumer_module.consume, engine, watch, max_records=2, timeout_seconds=5)
    watch.eof.wait(4)
    reported = watch.eof.is_set()
    produce_events(kafka, topic, [(str(uuid.uuid4()), PLACED, placed(customer, 100))
                                  for _ in range(2)])
    job.join(10)
    handled = job.result(0)
    if handled != 2 or stats(engine).get(customer) != (2, 200):
        raise CheckFailure(
            "The consumer it was given reports the end of a partition (enable.partition.eof): "
            "consume() met that end before any record, and 2 records arrived after it. "
            "consume(max_records=2, timeout_seconds=5) must handle them: a partition's end is "
            "only where the log is now, and on a topic of several partitions one of them ends "
            "while the others still have records.",
            expected="consume returns 2; both records applied",
            actual=f"consume returned {handled!r}"
                   + ("" if reported else " (no end-of-partition event reached it)")
                   + f"; customer_stats {stats(engine).get(customer)}",
            evidence=state(engine), lesson=OFFSETS,
            fix="skip a message whose error is KafkaError._PARTITION_EOF and poll on; stop only "
                "at max_records or timeout_seconds")


class PollWatch:
    """Around a consumer: when each poll()/consume() was called (monotonic seconds) and how
    long it may wait — its timeout argument (None, or a negative one, is for ever)."""

    def __init__(self, consumer: Any) -> None:
        self._consumer = consumer
        self.calls: list[tuple[float, float]] = []  # (called at, may wait)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._consumer, name)

    def _note(self, timeout: Any) -> None:
        wait = float("inf") if timeout is None or float(timeout) < 0 else float(timeout)
        self.calls.append((time.monotonic(), wait))

    def poll(self, timeout: Any = None) -> Any:
        self._note(timeout)
        return self._consumer.poll(-1 if timeout is None else timeout)

    def consume(self, num_messages: int = 1, timeout: Any = -1) -> list[Any]:
        self._note(timeout)
        return self._consumer.consume(num_messages=num_messages,
                                      timeout=-1 if timeout is None else timeout)

    def past(self, budget: float) -> list[tuple[float, float]]:
        """The calls that may wait past `budget` seconds after the first call (the caller's
        deadline is at most that: it was set before the first call), as (called at, may
        wait) in seconds from the first call."""
        if not self.calls:
            return []
        first = self.calls[0][0]
        return [(at - first, wait) for at, wait in self.calls
                if at - first + wait > budget + 0.01]


TRICKLE_TIMEOUT = 2.0  # consume's timeout_seconds in the trickle check
TRICKLE_EVERY = 0.3  # after the pause a record this often: far less than the timeout
TRICKLE_FOR = 7.0  # and for longer than the timeout plus any slack
# Before the deadline: a record at once and one 1.37 s later, nothing between. A consume that
# takes a quiet moment (an empty poll, a second without records) for the end returns early;
# one whose timeout restarts after each record is still running when the trickle resumes.
QUIET_TO = 1.37  # not a multiple of a round poll interval: poll(0.25) after it ends late
# A pause that spans the deadline, shorter than the timeout: a poll that may wait a whole
# timeout_seconds, begun just before the deadline, returns a record long after it.
# 3.2 s: an idle timeout of 2 s restarted by the record at 1.37 s is still waiting then, so it
# goes on into the trickle (3.45 s raced that idle end by 0.08 s)
PAUSE_TO = 3.2
RETURNED_EARLY = TRICKLE_TIMEOUT - 0.3  # a return before this is before the deadline


def trickle_times() -> list[float]:
    """When the feeder sends (seconds from its start): at 0 and 1.37 s, then every 0.3 s from
    3.2 s."""
    times = [n * TRICKLE_EVERY for n in range(int(TRICKLE_FOR / TRICKLE_EVERY))]
    return [0.0, QUIET_TO] + [PAUSE_TO + t for t in times if PAUSE_TO + t < TRICKLE_FOR]


def consume_stops_at_its_timeout_while_records_trickle(engine: Engine, consumer_module: Any,
                                                       kafka: Any) -> None:
    """timeout_seconds bounds the whole call: records arriving every 0.3 s must not keep a
    consume(timeout_seconds=2) running (an idle timeout, restarted after each record, would),
    no poll may wait past the deadline (a pause from 1.37 to 3.2 s spans it), and a quiet
    1.37 s before the deadline is not the end (nothing between the records at 0 and 1.37 s)."""
    topic = kafka.topic(1, hint="trickle")
    consumer = PollWatch(group_consumer(kafka, topic, kafka.group_id("trickle")))
    customer = str(uuid.uuid4())
    stop = threading.Event()
    handled_at: list[float] = []

    def effect(conn: Any, event_type: str, payload: Any) -> None:
        handled_at.append(time.monotonic())
        consumer_module.apply_effect(conn, event_type, payload)

    def trickle() -> None:
        producer = kafka.producer(**{"linger.ms": 0})
        begin = time.monotonic()
        for at in trickle_times():
            if stop.wait(max(0.0, begin + at - time.monotonic())):
                return
            producer.produce(topic, key=b"k", value=json.dumps(placed(customer, 1)).encode(),
                             headers=[("event-id", str(uuid.uuid4()).encode()),
                                      ("event-type", PLACED.encode())])
            producer.flush(5)

    feeder = threading.Thread(target=trickle, name="dojo-check-trickle", daemon=True)
    feeder.start()
    started = time.monotonic()
    try:
        job = in_thread(consumer_module.consume, engine, consumer, max_records=10_000,
                        timeout_seconds=TRICKLE_TIMEOUT, effect=effect)
        job.join(TRICKLE_FOR + 10)
        took = time.monotonic() - started
    finally:
        stop.set()
        feeder.join(10)
    handled = job.result(0) if not job.alive else None
    late = [t - started for t in handled_at if t - started > TRICKLE_TIMEOUT + 0.5]
    fed = (f"was fed records at 0 and {QUIET_TO:g} s, then every {TRICKLE_EVERY:g} s from "
           f"{PAUSE_TO:g} s")
    if not job.alive and took < RETURNED_EARLY:
        raise CheckFailure(
            f"consume(max_records=10000, timeout_seconds={TRICKLE_TIMEOUT:g}) {fed}, and "
            f"returned after {took:.2f} s, having handled {handled!r}: before max_records and "
            "before its timeout. A quiet moment is not the end of the stream — the next record "
            f"came at {QUIET_TO:g} s; a producer's pause, a rebalance or a slow group join all "
            "look like one. Stop only at max_records or timeout_seconds.",
            expected=f"consume runs until about {TRICKLE_TIMEOUT:g} s (its timeout)",
            actual=f"it returned {handled!r} after {took:.2f} s", lesson=OFFSETS,
            fix="when a poll comes back empty, poll again with the time left until the "
                "deadline; do not return")
    require_prompt_handling(handled_at, started, fed)
    overshot = bool(late) and not job.alive and took < TRICKLE_FOR
    if job.alive or took > TRICKLE_TIMEOUT + 1.0 or late:
        raise CheckFailure(
            f"consume(max_records=10000, timeout_seconds={TRICKLE_TIMEOUT:g}) {fed} and ran "
            f"for {took:.1f} s" + (" (still running)" if job.alive else "")
            + (f", handling a record {late[0]:.1f} s after its start" if late else "")
            + ". timeout_seconds bounds the whole call, measured from its start"
            + (": here the last poll began before the deadline and waited up to a whole "
               "timeout_seconds, so it returned the record that came after the pause — poll "
               "with the time left until the deadline, never more." if overshot else
               ": a timeout restarted after each record lets a steady trickle keep it running "
               "for ever."),
            expected=f"consume returns within about {TRICKLE_TIMEOUT:g} s, handling no record "
                     "after that",
            actual=f"it returned {handled!r} after {took:.1f} s" if not job.alive
            else f"still running after {took:.1f} s",
            lesson=OFFSETS,
            fix="poll(min(0.2, deadline - time.monotonic())) and stop once the deadline passed"
            if overshot else "compute one deadline = start + timeout_seconds before the loop "
                             "and poll with the time left until it")
    require_polls_within_the_deadline(consumer, fed)


PROMPT = 1.2  # the record fed at 0 s is handled by then: before the one at 1.37 s is fed


def require_prompt_handling(handled_at: list[float], started: float, fed: str) -> None:
    """A record that arrives while consume() waits is handled when the poll returns it, not
    when a batch has filled or the timeout ended: consume(num_messages=…, timeout=time left)
    holds the record fed at 0 s until the deadline."""
    first = handled_at[0] - started if handled_at else None
    if first is not None and first <= PROMPT:
        return
    raise CheckFailure(
        f"consume(max_records=10000, timeout_seconds={TRICKLE_TIMEOUT:g}) {fed}. The record "
        f"fed at 0 s was "
        + (f"handled only {first:.2f} s after the call began" if first is not None else
           "never handled")
        + ": a record that has arrived waits for nothing else. A consume that asks the "
        "consumer for a whole batch with the time left (consume(num_messages=max_records, "
        "timeout=remaining)) gets nothing back until the batch is full or the time is up, "
        "so every record waits until the deadline and is handled after it.",
        expected=f"the record fed at 0 s handled within {PROMPT:g} s of the call's start "
                 f"(before the next one, fed at {QUIET_TO:g} s)",
        actual=f"first record handled after {first:.2f} s" if first is not None
        else "no record handled",
        lesson=OFFSETS,
        fix="poll with a short timeout (poll(min(0.2, time left))) or consume(num_messages=…, "
            "timeout=min(0.2, time left)), and handle what it returns at once"
        if first is not None else None)


def require_polls_within_the_deadline(consumer: PollWatch, fed: str) -> None:
    """No poll()/consume() of the call may wait past its deadline: a record it returns then
    is handled after timeout_seconds (the trickle's gap can hide that; the calls' own
    timeouts do not)."""
    past = consumer.past(TRICKLE_TIMEOUT)
    if not past:
        return
    at, wait = past[0]
    raise CheckFailure(
        f"consume(max_records=10000, timeout_seconds={TRICKLE_TIMEOUT:g}) {fed}. "
        f"{len(past)} of its {len(consumer.calls)} calls to the consumer could wait past the "
        f"deadline, {TRICKLE_TIMEOUT:g} s after its first poll: the first of them was made "
        f"{at:.2f} s in, with a timeout of {wait:g} s. A record that arrives during that "
        "wait is returned — and handled — after timeout_seconds; the call's budget is the "
        "deadline, so each poll waits at most the time left until it.",
        expected=f"every poll()/consume() timeout ends by {TRICKLE_TIMEOUT:g} s after the "
                 "first poll",
        actual=f"a poll at {at:.2f} s that may wait {wait:g} s (until {at + wait:.2f} s)",
        evidence="\n".join(f"poll at {a:.2f} s, timeout {w:g} s" for a, w in past[:8]),
        lesson=OFFSETS,
        fix="poll(min(0.2, deadline - time.monotonic())) with one deadline = start + "
            "timeout_seconds, and stop once it has passed")


class EffectFailure(ValueError, KeyError, TypeError, RuntimeError):
    """The check's injected effect failure: whichever of these a consume catches, it is one."""


def test_failed_record_offset_is_not_committed(outbox, learner, kafka):
    require_table(outbox, "processed_event", "idempotent-consumer")
    consumer_module = learner.module("consumer")
    topic = kafka.topic(1, hint="redeliver")
    customer = str(uuid.uuid4())
    events = [(str(uuid.uuid4()), PLACED, placed(customer, 100)) for _ in range(3)]
    produce_events(kafka, topic, events)
    group = kafka.group_id("redeliver")
    failing_order = events[1][2]["order_id"]
    failed: list[str] = []

    def effect(conn: Any, event_type: str, payload: Any) -> None:
        consumer_module.apply_effect(conn, event_type, payload)
        if payload.get("order_id") == failing_order and not failed:
            failed.append(failing_order)
            raise EffectFailure("the effect failed (injected by the check)")

    first = group_consumer(kafka, topic, group)
    # expected: the injected failure, propagated
    error = raised(consumer_module.consume, outbox, first, max_records=3, timeout_seconds=6,
                   effect=effect)
    offset = committed_offset(first, topic)
    first.close()
    if error is None:
        raise CheckFailure(
            "The second record's effect raised, but consume() carried on. A consumer that skips "
            "a failed record (and commits past it) loses it; stop, and let the record come again "
            "(a dead letter topic is the next lab). The error was a ValueError, KeyError, "
            "TypeError and RuntimeError at once: a consume that catches any of them (\"a record "
            "we can never handle\") skips this one, and a record without event-id with it.",
            expected="consume() raises the effect's error", actual="it returned normally",
            evidence=state(outbox), lesson=OFFSETS)
    if offset not in (None, 1):
        past = offset is not None and offset > 1
        raise CheckFailure(
            "The second record's effect failed, so consume() must stop with the error and leave "
            "that record's offset uncommitted: the next consumer of the group starts from it."
            + (" It went on to the records after it and committed their offsets: a committed "
               "offset covers every record before it, so the failed record is skipped for good "
               "— raising at the end does not bring it back." if past else
               " Offset 0 is the first record's own offset: the committed offset must be the "
               "next record to read (offset + 1)." if offset == 0 else ""),
            expected="committed offset 1 (the failed record is next)",
            actual=f"committed offset {offset}", evidence=state(outbox), lesson=OFFSETS,
            fix="stop at the first record whose handling raises: re-raise at once, before "
                "polling or committing anything after it" if past else None)
    second = group_consumer(kafka, topic, group)
    handled = call(consumer_module.consume, outbox, second, max_records=3 - (offset or 0),
                   timeout_seconds=5)
    if stats(outbox).get(customer) != (3, 300):
        raise CheckFailure(
            "A new consumer in the same group resumed from the committed offset; all three "
            "orders must now be counted, each once.",
            expected="orders_placed 3, total 300", actual=f"{stats(outbox).get(customer)} after "
            f"the second consume handled {handled}", evidence=state(outbox),
            lesson=OFFSETS)


AGAIN_RECORDS = 7  # on the partition before the first call
AGAIN_FIRST, AGAIN_SECOND = 2, 3  # max_records of the two calls that stop at max_records
AGAIN_FAILS = 5  # the record whose effect fails once, in the third call


def test_consume_again_starts_at_the_first_record_not_handled(outbox, learner, kafka):
    require_table(outbox, "processed_event", "idempotent-consumer")
    consumer_module = learner.module("consumer")
    topic = kafka.topic(1, hint="again")
    customer = str(uuid.uuid4())
    events = [(str(uuid.uuid4()), PLACED, placed(customer, 100 + n))
              for n in range(AGAIN_RECORDS)]
    produce_events(kafka, topic, events)
    number = {payload["order_id"]: n for n, (_, _, payload) in enumerate(events)}
    applied: list[int] = []
    failed: list[int] = []

    def effect(conn: Any, event_type: str, payload: Any) -> None:
        n = number[payload["order_id"]]
        if n == AGAIN_FAILS and not failed:
            failed.append(n)
            raise EffectFailure("the effect failed (injected by the check)")
        consumer_module.apply_effect(conn, event_type, payload)
        applied.append(n)

    # One consumer, as a service's loop keeps it: every call continues where the last stopped.
    consumer = group_consumer(kafka, topic, kafka.group_id("again"))
    calls: list[str] = []

    def run(max_records: int, want: list[int]) -> tuple[list[int], Any]:
        before = len(applied)
        error = raised(consumer_module.consume, outbox, consumer, max_records=max_records,
                       timeout_seconds=3, effect=effect)
        got = applied[before:]
        calls.append(f"consume(max_records={max_records}) applied records {got}"
                     + (f", then raised {type(error).__name__}" if error else "")
                     + f" (expected {want})")
        return got, error

    try:
        first, _ = run(AGAIN_FIRST, [0, 1])
        want = list(range(AGAIN_FIRST, AGAIN_FIRST + AGAIN_SECOND))
        second, _ = run(AGAIN_SECOND, want)
        if first == [0, 1] and second != want:
            skipped = not second or second[0] > want[0]
            raise CheckFailure(
                f"{AGAIN_RECORDS} records waited on the partition (records 0 … "
                f"{AGAIN_RECORDS - 1}). consume(max_records={AGAIN_FIRST}) handled records 0 "
                f"and 1; the next consume(max_records={AGAIN_SECOND}) on the same consumer "
                f"must go on with records {want}, and it applied {second}. A consumer's "
                "position moves when a record is fetched, not when it is committed: records "
                "fetched and then dropped (a batch from consume(num_messages=…) cut at "
                "max_records) never come again on this consumer — only a restart or a "
                "rebalance, reading from the committed offset, brings them back.",
                expected=f"the second call applies records {want}",
                actual="; ".join(calls), evidence=state(outbox), lesson=OFFSETS,
                fix="fetch no more than max_records − handled at a time (poll(), or "
                    "consume(num_messages=max_records - handled)), or seek back to the first "
                    "record not handled before returning" if skipped else None)
        # The third call's first record fails: it raises, and the call after it on the same
        # consumer must apply that record, not the one behind it.
        _, error = run(2, [])
        fourth, _ = run(2, [AGAIN_FAILS, AGAIN_FAILS + 1])
    finally:
        consumer.close()
    if error is None or fourth != [AGAIN_FAILS, AGAIN_FAILS + 1]:
        skipped = error is not None and bool(fourth) and AGAIN_FAILS not in fourth
        raise CheckFailure(
            f"The effect of record {AGAIN_FAILS} failed once; consume() must raise, and the next "
            f"consume() on the same consumer must apply record {AGAIN_FAILS} (it is not done) and "
            f"then {AGAIN_FAILS + 1}."
            + (f" It applied {fourth}: record {AGAIN_FAILS} was skipped. poll() had already "
               "moved the consumer's position past the record that raised, so the next call "
               "started behind it — and committing the next record's offset covers the failed "
               "one: it is lost for the whole group." if skipped else ""),
            expected=f"the third call raises; the fourth applies records "
                     f"{[AGAIN_FAILS, AGAIN_FAILS + 1]}",
            actual="; ".join(calls), evidence=state(outbox), lesson=OFFSETS,
            fix="before re-raising, consumer.seek(TopicPartition(record.topic(), "
                "record.partition(), record.offset())): the next poll returns that record "
                "again" if skipped else None)
    records_arriving_mid_call_stay_for_the_next(outbox, consumer_module, kafka)
    failure_rewinds_every_partition(outbox, consumer_module, kafka)
    interruption_rewinds_too(outbox, consumer_module, kafka)


ARRIVE_FIRST, ARRIVE_SECOND = 3, 2  # max_records of the two calls
ARRIVE_LATER = ARRIVE_FIRST + ARRIVE_SECOND - 1  # records written by record 0's effect


def records_arriving_mid_call_stay_for_the_next(engine: Engine, consumer_module: Any,
                                                kafka: Any) -> None:
    """One record waits when consume(max_records=3) starts; its effect writes four more to
    the partition (one batch), so they arrive while the call runs: a first fetch returns one
    record, a later one all four. The call handles records 0, 1, 2; the next
    consume(max_records=2) on the same consumer must handle 3 and 4. A consume() that asks
    each fetch for max_records (not max_records − handled) took record 3 too, and dropped it."""
    topic = kafka.topic(1, hint="arrive")
    customer = str(uuid.uuid4())
    events = [(str(uuid.uuid4()), PLACED, placed(customer, 400 + n))
              for n in range(1 + ARRIVE_LATER)]
    number = {payload["order_id"]: n for n, (_, _, payload) in enumerate(events)}
    produce_events(kafka, topic, events[:1])
    applied: list[int] = []

    def effect(conn: Any, event_type: str, payload: Any) -> None:
        n = number[payload["order_id"]]
        consumer_module.apply_effect(conn, event_type, payload)
        applied.append(n)
        if n == 0 and applied.count(0) == 1:  # the rest arrive now, in one batch
            producer = kafka.producer(**{"linger.ms": 100})
            for event_id, event_type_, later in events[1:]:
                producer.produce(topic, key=b"k", value=json.dumps(later).encode(), headers=[
                    ("event-id", event_id.encode()), ("event-type", event_type_.encode())])
            if producer.flush(10):
                raise RuntimeError(f"the check could not write its records to {topic}")

    consumer = group_consumer(kafka, topic, kafka.group_id("arrive"))
    try:
        first_error = raised(consumer_module.consume, engine, consumer,
                             max_records=ARRIVE_FIRST, timeout_seconds=3, effect=effect)
        first = list(applied)
        second_error = raised(consumer_module.consume, engine, consumer,
                              max_records=ARRIVE_SECOND, timeout_seconds=3, effect=effect)
    finally:
        consumer.close()
    second = applied[len(first):]
    want_first = list(range(ARRIVE_FIRST))
    want_second = list(range(ARRIVE_FIRST, ARRIVE_FIRST + ARRIVE_SECOND))
    if (first, second) == (want_first, want_second) and not (first_error or second_error):
        return
    dropped = first == want_first and sorted(set(want_second) - set(second))
    raise CheckFailure(
        f"One record waited when consume(max_records={ARRIVE_FIRST}) started; its effect wrote "
        f"{ARRIVE_LATER} more, which arrived together while the call ran. The call must handle "
        f"records {want_first}, and the next consume(max_records={ARRIVE_SECOND}) on the same "
        f"consumer records {want_second}."
        + (f" Record(s) {dropped} never came again: the call had fetched them too (after a "
           "fetch that returned fewer records than max_records, the next one asked for "
           "max_records again) and returned at max_records without them; the consumer's "
           "position had moved past them." if dropped else ""),
        expected=f"the first call applies {want_first}, the second {want_second}",
        actual=(f"first call applied {first}"
                + (f" and raised {first_line(first_error)}" if first_error else "")
                + f"; second call applied {second}"
                + (f" and raised {first_line(second_error)}" if second_error else "")),
        evidence=state(engine), lesson=OFFSETS,
        fix="ask each fetch for no more than max_records − handled (consume(num_messages="
            "max_records - handled), or poll()), or seek back to the first record not handled "
            "before returning" if dropped else None)


SPREAD = 3  # records on each of the two partitions


def failure_rewinds_every_partition(engine: Engine, consumer_module: Any, kafka: Any) -> None:
    """Two partitions, three records each, all waiting before the call; the first record
    handled fails once. A consume() that fetched a batch (consume(num_messages=…)) holds
    records of both partitions when it raises: seeking back only the failed record's partition
    leaves the other one's position past records it never handled."""
    topic = kafka.topic(2, hint="again2")
    customer = str(uuid.uuid4())
    producer = kafka.producer(**{"linger.ms": 0})
    number: dict[str, tuple[int, int]] = {}
    for partition in (0, 1):
        for offset in range(SPREAD):
            event_id = str(uuid.uuid4())
            payload = placed(customer, 211 + 10 * partition + offset)
            number[payload["order_id"]] = (partition, offset)
            producer.produce(topic, partition=partition, key=b"k",
                             value=json.dumps(payload).encode(),
                             headers=[("event-id", event_id.encode()),
                                      ("event-type", PLACED.encode())])
    if producer.flush(10):
        raise RuntimeError(f"the check could not write its records to {topic}")
    applied: list[tuple[int, int]] = []
    failed: list[tuple[int, int]] = []

    def effect(conn: Any, event_type: str, payload: Any) -> None:
        where = number[payload["order_id"]]
        if not failed:
            failed.append(where)
            raise EffectFailure("the effect failed (injected by the check)")
        consumer_module.apply_effect(conn, event_type, payload)
        applied.append(where)

    consumer = kafka.consumer(kafka.group_id("again2"))
    consumer.assign([TopicPartition(topic, 0), TopicPartition(topic, 1)])
    try:
        error = raised(consumer_module.consume, engine, consumer, max_records=2 * SPREAD,
                       timeout_seconds=3, effect=effect)
        first = list(applied)
        again = raised(consumer_module.consume, engine, consumer, max_records=2 * SPREAD,
                       timeout_seconds=3, effect=effect)
    finally:
        consumer.close()
    missing = sorted(set(number.values()) - set(applied))
    if error is not None and again is None and not missing and len(applied) == 2 * SPREAD:
        return
    raise CheckFailure(
        f"Two partitions held {SPREAD} records each (partition, offset) before the first call; "
        f"the effect of the first record handled, {failed[0] if failed else '?'}, failed once. "
        "The next consume() on the same consumer must handle that record and every record it "
        "had not handled yet, on both partitions."
        + (f" Records {', '.join(map(str, missing))} were never handled: the call that raised had "
           "fetched them too, and the consumer's position on their partition had moved past "
           "them. Seeking back only the failed record's partition leaves the others' records "
           "fetched and dropped." if error is not None and missing else ""),
        expected=f"the first call raises at once; the second handles all {2 * SPREAD} "
                 "records, each once",
        actual=(f"first call: {'raised ' + type(error).__name__ if error else 'returned'}, "
                f"applied {first}; second call: "
                f"{'raised ' + first_line(again) if again else 'returned'}, applied "
                f"{applied[len(first):]}"),
        evidence=state(engine), lesson=OFFSETS,
        fix="before re-raising, seek every partition you fetched from back to its first record "
            "not handled (or fetch one record at a time with poll())"
        if error is not None and missing else None)


class EffectInterrupted(BaseException):
    """Not an Exception, like KeyboardInterrupt, SystemExit or asyncio.CancelledError: raised
    in the middle of a record (a task cancelled during its transaction)."""


def interruption_rewinds_too(engine: Engine, consumer_module: Any, kafka: Any) -> None:
    """Three records on one partition; the second one's effect is interrupted by a
    BaseException that is no Exception. consume() lets it through, and the next consume() on
    the same consumer applies that record and the one after it: whatever the handling raised,
    poll() had moved past the record."""
    topic = kafka.topic(1, hint="interrupt")
    customer = str(uuid.uuid4())
    events = [(str(uuid.uuid4()), PLACED, placed(customer, 300 + n)) for n in range(3)]
    produce_events(kafka, topic, events)
    number = {payload["order_id"]: n for n, (_, _, payload) in enumerate(events)}
    applied: list[int] = []
    interrupted: list[int] = []

    def effect(conn: Any, event_type: str, payload: Any) -> None:
        n = number[payload["order_id"]]
        if n == 1 and not interrupted:
            interrupted.append(n)
            raise EffectInterrupted("interrupted (injected by the check)")
        consumer_module.apply_effect(conn, event_type, payload)
        applied.append(n)

    consumer = group_consumer(kafka, topic, kafka.group_id("interrupt"))
    error: BaseException | None = None
    try:
        try:
            consumer_module.consume(engine, consumer, max_records=3, timeout_seconds=3,
                                    effect=effect)
        except EffectInterrupted as exc:
            error = exc
        first = list(applied)
        consumer_module.consume(engine, consumer, max_records=2, timeout_seconds=3,
                                effect=effect)
    finally:
        consumer.close()
    second = applied[len(first):]
    if error is not None and first == [0] and second == [1, 2]:
        return
    skipped = error is not None and first == [0] and 1 not in second
    raise CheckFailure(
        "Three records waited on a partition; the second one's effect was interrupted by a "
        "BaseException that is not an Exception (as KeyboardInterrupt, SystemExit or "
        "asyncio.CancelledError are). consume() must let it through, and the next consume() "
        "on the same consumer must apply records 1 and 2."
        + (" Record 1 was skipped: the rewind to the failed record ran only for an "
           "Exception (except Exception:), and poll() had already moved past it — a task "
           "cancelled mid-record would lose it on this consumer, and the next commit covers it "
           "for the whole group." if skipped else ""),
        expected="the first call applies [0] and raises; the second applies [1, 2]",
        actual=f"first call applied {first} and "
               + ("raised the interruption" if error is not None else "returned")
               + f"; second call applied {second}",
        evidence=state(engine), lesson=OFFSETS,
        fix="seek back in a handler that catches every exception (except BaseException: … "
            "raise, or try/finally) before re-raising" if skipped else None)
