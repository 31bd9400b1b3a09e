"""Stage idempotent-effect: the processed-event marker and the effect commit in one
PostgreSQL transaction (INSERT … ON CONFLICT DO NOTHING), so redeliveries, replays and
racing twins book once, and a failed effect leaves no marker behind."""

from __future__ import annotations

import uuid

import pytest
from _support import (
    READ,
    HookedProducer,
    applied_ids,
    balances,
    ledger,
    require_done,
)
from _tools import ScriptedDownstream, healthy, undecodable, with_label
from sqlalchemy import create_engine, text

from dojo.checks import CheckFailure, call, table
from dojo.checks.faults import InjectedFault, duplicate_and_reorder, fail_sql, run_concurrently
from dojo.checks.faults import slow_sql as slowed
from dojo.checks.observers import SESSION_COLUMNS, open_transactions, sessions

pytestmark = pytest.mark.stage("idempotent-effect")
SEE = READ["idempotent-effect"]


def payment(lab, account="acc-1", cents=1250):
    return lab.payments.PaymentEvent(str(uuid.uuid4()), account, "deposit", cents, "EUR")


def test_redelivered_and_replayed_events_are_booked_once(lab, ledger_db, clock):
    topics = lab.topics()
    settings = lab.settings(topics)
    events = [healthy(f"acc-{n % 3}", 100 * (n + 1)) for n in range(6)]
    twice = duplicate_and_reorder(events, copies=2, seed=7, key=lambda item: item.key)
    inputs = lab.produce(topics.source, twice)
    # a replay of two events that were booked already: same bytes, a replay-count header
    inputs += lab.produce(topics.source, events[:2], extra_headers=[("x-replay-count", b"1")])
    downstream = ScriptedDownstream(lab.payments, clock)
    run = lab.run(ledger_db, topics, settings, downstream, clock)
    require_done(run, inputs, downstream, read=SEE)
    booked = applied_ids(ledger_db)
    rows = [((e.event_id or "")[:8], e.account,
             sum(1 for i in inputs if i.item.event_id == e.event_id),
             len(booked.get(e.event_id or "", []))) for e in events]
    wrong = [r for r in rows if r[3] != 1]
    expected: dict[str | None, int] = {}
    for e in events:
        expected[e.account] = expected.get(e.account, 0) + e.cents
    if wrong or balances(ledger_db) != expected:
        raise CheckFailure(
            "Every event was delivered two or three times (a redelivery after a crash, a "
            "producer retry, a replay from the DLT). The effect must happen once: insert the "
            "event id into processed_events with ON CONFLICT DO NOTHING, and book only when that "
            "inserted a row, in the same transaction.",
            expected="1 ledger row per event, and balances equal to the sum of distinct events",
            actual=f"{len(wrong)} of {len(events)} events booked a wrong number of times; "
                   f"balances {balances(ledger_db)} (should be {expected})",
            evidence=table(rows, ("event", "account", "delivered", "ledger rows")), lesson=SEE)


def test_racing_twins_book_once(lab, ledger_db):
    consumer = lab.module("consumer")
    event = payment(lab)
    # Every statement on processed_events waits 0.3 s after running: the twins overlap.
    with slowed(ledger_db, 0.3, match=r"processed_events"):
        outcomes = run_concurrently(lambda _: call(consumer.apply_once, ledger_db, event), 4,
                                    timeout=20)
    rows = [r for r in ledger(ledger_db) if r.event_id == event.event_id]
    results = [("raised " + type(o.error).__name__) if o.error else repr(o.value)
               for o in outcomes]
    if not (len(rows) == 1 and all(o.error is None for o in outcomes) and
            [o.value for o in outcomes].count(True) == 1):
        raise CheckFailure(
            "Four consumers called apply_once() for the same event at the same moment (a "
            "rebalance hands a partition over while the old owner is still busy). Exactly "
            "one books it; the others wait on the marker row's lock and get False. A "
            "SELECT-then-INSERT lets two of them see 'not processed' together.",
            expected="one True, three False, one ledger row, no exception",
            actual=f"returned {results}; {len(rows)} ledger row(s)",
            evidence="INSERT INTO processed_events (event_id) VALUES (:id) ON CONFLICT DO "
                     "NOTHING — the second inserter blocks until the first commits, then "
                     "inserts nothing (rowcount 0)", lesson=SEE)


def _markers(engine):
    """How many rows processed_events holds (its columns are the learner's own)."""
    with engine.connect() as conn:
        return conn.execute(text("SELECT count(*) FROM processed_events")).scalar_one()


def _attempt(consumer, engine, event):
    try:
        return f"returned {call(consumer.apply_once, engine, event)!r}"
    except InjectedFault:
        return "raised the injected failure"


def test_failed_effect_leaves_no_marker(lab, ledger_db):
    consumer = lab.module("consumer")
    # 1. The effect's INSERT fails.
    event = payment(lab, "acc-1", 1250)
    with fail_sql(ledger_db, r"INSERT INTO ledger_entries", times=1) as failed:
        first = _attempt(consumer, ledger_db, event)
    again = call(consumer.apply_once, ledger_db, event)
    rows = [r for r in ledger(ledger_db) if r.event_id == event.event_id]
    if not (failed and len(rows) == 1 and again is True):
        raise CheckFailure(
            "The effect's INSERT failed (the check made it), so the event was not booked; the "
            "retry must book it. If the marker was committed on its own, the retry finds it, "
            "says 'duplicate' and the payment is LOST. The marker and the effect commit "
            "together or not at all.",
            expected="first call raises; second returns True; one ledger row",
            actual=f"first call {first}; second returned {again!r}; {len(rows)} ledger row(s)",
            lesson=SEE)

    # 2. Every statement runs, and the COMMIT of the transaction that wrote the ledger row
    #    fails: whatever committed anyway was in another transaction.
    event = payment(lab, "acc-2", 3377)
    before = _markers(ledger_db)
    with fail_sql(ledger_db, r"ledger_entries", at="commit", times=1) as failed:
        first = _attempt(consumer, ledger_db, event)
    left = _markers(ledger_db) - before
    booked_then = len([r for r in ledger(ledger_db) if r.event_id == event.event_id])
    again = call(consumer.apply_once, ledger_db, event)
    rows = [r for r in ledger(ledger_db) if r.event_id == event.event_id]
    if failed and (left or booked_then or again is not True or len(rows) != 1):
        raise CheckFailure(
            "The check let every statement of apply_once() run and failed the COMMIT of the "
            "transaction that wrote the ledger row. "
            + ("A processed_events row was left behind all the same: the marker was "
               "committed by a transaction of its own (another connection, another "
               "engine.begin()), and the retry took the event for a duplicate: the payment is "
               "LOST. Insert the marker on the connection that books the effect, in its "
               "transaction." if left else
               "Afterwards the event was not booked exactly once."),
            expected="first call raises; processed_events unchanged; second returns True; one "
                     "ledger row",
            actual=f"first call {first}; processed_events rows +{left}, ledger rows for the "
                   f"event {booked_then}; the retry returned {again!r}; {len(rows)} ledger "
                   "row(s) now",
            evidence="failed COMMIT after: " + " ".join(failed[0].split())[:160],
            lesson=SEE)


def _refuse_first_commit(engine, event_id):
    """A deferred constraint trigger on ledger_entries that refuses the first COMMIT booking
    `event_id` with SQLSTATE 23514 (check_violation), as a deferred foreign key or CHECK
    does: a real IntegrityError from PostgreSQL at COMMIT, after every statement ran. A
    sequence counts the refusals: it is not rolled back with the refused transaction."""
    with engine.begin() as conn:
        conn.execute(text("CREATE SEQUENCE dojo_refusals"))
        conn.execute(text(f"""
            CREATE FUNCTION dojo_refuse_once() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
              IF NEW.event_id = '{uuid.UUID(event_id)}' AND nextval('dojo_refusals') = 1 THEN
                RAISE EXCEPTION 'ledger entry refused at commit (deferred check)'
                  USING ERRCODE = 'check_violation';
              END IF;
              RETURN NULL;
            END $$"""))
        conn.execute(text(
            "CREATE CONSTRAINT TRIGGER dojo_refuse_once AFTER INSERT ON ledger_entries "
            "DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION dojo_refuse_once()"))


def test_a_commit_refused_as_an_integrity_error_is_not_a_duplicate(lab, ledger_db):
    consumer = lab.module("consumer")
    event = payment(lab, "acc-3", 2_024)
    _refuse_first_commit(ledger_db, event.event_id)
    before = _markers(ledger_db)
    try:
        first = f"returned {call(consumer.apply_once, ledger_db, event)!r}"
    except Exception as exc:  # what PostgreSQL raised, passed on (or wrapped): right
        first = f"raised {type(exc).__name__}"
    left = _markers(ledger_db) - before
    again = call(consumer.apply_once, ledger_db, event)
    rows = [r for r in ledger(ledger_db) if r.event_id == event.event_id]
    if first.startswith("returned") or left or again is not True or len(rows) != 1:
        raise CheckFailure(
            "PostgreSQL refused the COMMIT of the transaction that booked the payment with an "
            "integrity error (SQLSTATE 23514, as a deferred constraint does), after every "
            "statement had run. "
            + ("apply_once() returned instead of raising: it took an IntegrityError for "
               "'a duplicate'. Only the marker's conflict means duplicate (ON CONFLICT DO "
               "NOTHING inserted nothing, or a unique violation of processed_events' key); "
               "any other failure, at any statement or at COMMIT, must propagate, or the "
               "consumer commits the offset of a payment that was never booked: LOST."
               if first.startswith("returned") else
               "Afterwards the event was not booked exactly once by the retry."),
            expected="first call raises; processed_events unchanged; second returns True; one "
                     "ledger row",
            actual=f"first call {first}; processed_events rows +{left}; the retry returned "
                   f"{again!r}; {len(rows)} ledger row(s) now",
            lesson=SEE)


def test_no_transaction_is_open_across_a_remote_call(lab, ledger_database, clock):
    engine = ledger_database.engine
    observer = create_engine(ledger_database.url)
    topics = lab.topics()
    settings = lab.settings(topics)
    declined = with_label(healthy("acc-d", 901), "declined")
    flaky = healthy("acc-t", 1_313, label="transient")
    items = [healthy("acc-1", 1_111), declined, flaky, undecodable("acc-u"),
             healthy("acc-d", 4_242), healthy("acc-2", 2_222)]
    inputs = lab.produce(topics.source, items)
    seen: list[tuple[str, dict]] = []

    def look(moment):
        for session in open_transactions(sessions(observer)):
            seen.append((moment, session))

    def on_call(call):
        look(f"during {call.what}() ({call.outcome})")

    downstream = ScriptedDownstream(lab.payments, clock, {
        declined.event_id: ["declined"] * 5, flaky.event_id: ["timeout", "unavailable"]},
        on_call=on_call)
    producer = HookedProducer(lab.dlt_producer(), clock,
                              lambda n: look(f"as DLT write #{n + 1} was produced"))
    try:
        run = lab.run(engine, topics, settings, downstream, clock, producer=producer)
    finally:
        observer.dispose()
    require_done(run, inputs, downstream, read=SEE)
    if seen:
        moments = list(dict.fromkeys(moment for moment, _ in seen))
        calls = sum(1 for m in moments if m.startswith("during"))
        raise CheckFailure(
            "While the consumer waited for the gateway or for the DLT, one of its database "
            "sessions sat in an open transaction. A transaction held across a remote call "
            "keeps its locks (the processed_events row a twin waits for, the parked key) and "
            "a pooled connection for as long as the other side takes: a 30 s gateway timeout "
            "becomes a 30 s lock. Call the gateway and write to the DLT outside any "
            "transaction; open one only for the statements that book.",
            expected="no session idle in transaction at any gateway call or DLT write",
            actual=f"a transaction open during {calls} gateway call(s) and "
                   f"{len(moments) - calls} DLT write(s)",
            evidence=table([{**session, "moment": moment} for moment, session in seen[:8]],
                           ("moment", *SESSION_COLUMNS)), lesson=SEE)
