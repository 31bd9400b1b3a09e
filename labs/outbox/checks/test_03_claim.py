"""Stage claim: a short transaction leases a batch with FOR UPDATE SKIP LOCKED and commits
before anything is sent; relays never share a row and never wait for each other."""

from __future__ import annotations

import re
import threading
import time
from typing import Any

import pytest
from _kafka_support import AckWatch
from _support import (
    MISTAKES,
    READ,
    db_now,
    explain_uses_partial_index,
    fill_with_published_rows,
    insert_event,
    norm_id,
    other_sessions,
    outbox_rows,
    require_table,
    touches_outbox,
)
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.pool import NullPool

from dojo.checks import (
    CheckFailure,
    call,
    first_line,
    in_thread,
    indent,
    raised,
    sqlstate,
    table,
)
from dojo.checks.faults import SlowProducer, run_concurrently, slow_sql
from dojo.checks.learner import Running
from dojo.checks.observers import SESSION_COLUMNS, open_transactions, record_sql

pytestmark = pytest.mark.stage("claim")
SEE = READ["claim"]

CLAIM_COLUMNS = ("id", "attempt_count", "lease_left", "published_at")
RACE_ROUNDS = 2  # the lock-free claim mutant overlaps in round 1 (slowed SQL makes it certain)


def event_ids(events: Any) -> list[str]:
    ids = []
    for ev in events or []:
        ids.append(norm_id(ev["id"] if isinstance(ev, dict) else ev.id))
    return ids


def seed_rows(engine: Engine, n: int) -> list[str]:
    """n unpublished rows (created n … 1 seconds ago); their ids, oldest first.

    They are inserted newest first, so the table's physical order is the reverse of
    created_at: a claim without ORDER BY created_at (which takes whatever the scan meets
    first) picks the newest rows, as it would once updates and cleanup have moved tuples."""
    return [insert_event(engine, created_ago=float(i + 1)) for i in range(n)][::-1]


def test_claim_sets_lease_and_counts_attempt(outbox, learner):
    require_table(outbox, "outbox_event", "claim")
    relay = learner.module("relay")
    ids = seed_rows(outbox, 10)
    # Two of the oldest failed once before and are due again: a retry is claimable like any
    # other row, in created_at order (not after the fresh ones, not before them).
    retried = [ids[0], ids[2]]
    with outbox.begin() as conn:
        conn.execute(text("UPDATE outbox_event SET attempt_count = 1, last_error = 'timed out', "
                          "next_attempt_at = now() - interval '2 seconds' "
                          "WHERE id::text = ANY(:ids)"), {"ids": retried})
    started = db_now(outbox)
    events = call(relay.claim_batch, outbox, batch_size=4, lease_seconds=LEASE)
    claimed = event_ids(events)
    ended = db_now(outbox)
    fresh = [i for i in ids if i not in retried]
    if sorted(claimed) == sorted(fresh[:4]):
        raise CheckFailure(
            "claim_batch passed over rows that had failed once and were due again (their "
            "next_attempt_at has passed) to take newer fresh rows. Once its backoff has run out, "
            "a retry is a claimable row like any other and goes in created_at order: putting "
            "retries last lets fresh traffic starve them, and sends an order's later versions "
            "before the earlier one that failed.",
            expected=f"the 4 oldest ids in created_at order: {ids[:4]} (the 1st and 3rd are "
                     "due retries)",
            actual=f"{claimed}", evidence=table(outbox_rows(outbox), CLAIM_COLUMNS + (
                "next_attempt_at",)), lesson=SEE,
            fix="order the claim by created_at alone; next_attempt_at only decides whether a "
                "row is due (NULL or past), not where it goes")
    require_oldest_first(outbox, claimed, ids[:4])
    if claimed != ids[:4]:
        raise CheckFailure(
            "claim_batch must lease the oldest unpublished rows and return them oldest first, at "
            "most batch_size. Without ORDER BY created_at in the locked SELECT, LIMIT takes "
            "whichever rows the scan meets first (here the newest: the check inserted them "
            "first), so an old event can wait for ever and an order's version 2 can leave before "
            "version 1.",
            expected=f"the 4 oldest ids in created_at order: {ids[:4]}",
            actual=f"{claimed}", evidence=table(outbox_rows(outbox), CLAIM_COLUMNS),
            lesson=SEE)
    rows = lease_rows(outbox, started, ended)
    untouched = [r for r in rows if r["id"] not in claimed and
                 (r["attempt_count"] != 0 or r["lease_until"] is not None)]
    untouched = [r for r in untouched if not (r["id"] in retried and r["attempt_count"] == 1)]
    uncounted = [r for r in rows if r["id"] in claimed and
                 r["attempt_count"] != (2 if r["id"] in retried else 1)]
    if untouched or uncounted:
        zero = bool(uncounted) and all(r["attempt_count"] == (1 if r["id"] in retried else 0)
                                       for r in uncounted)
        raise CheckFailure(
            ("claim_batch did not count the attempt: the rows it claimed still have "
             "attempt_count 0. A claim starts an attempt; a relay that crashes mid-send, or "
             "whose send is never reported, never reaches the code that handles a failure, so "
             "counting there hides those attempts from the backoff and from an operator."
             if zero and not untouched else
             "Claiming a row counts one attempt (attempt_count + 1); rows it did not claim stay "
             "untouched."),
            expected="the 4 claimed rows: attempt_count + 1 (1, or 2 for the two due retries); "
                     "the others: unchanged, no lease",
            actual=f"{len(uncounted)} claimed row(s) with another attempt_count, "
                   f"{len(untouched)} unclaimed row(s) changed",
            evidence=table(rows, LEASE_COLUMNS), lesson=SEE,
            fix="add attempt_count = attempt_count + 1 to the claim's UPDATE"
            if zero and not untouched else None)
    require_returned_attempt_counts(events, rows)
    off = [r for r in rows if r["id"] in claimed and not (
        r["after_start"] is not None and r["after_start"] >= LEASE - SLACK
        and r["after_end"] <= LEASE + SLACK)]
    if off:
        got = [r["after_start"] for r in off if r["after_start"] is not None]
        whole = bool(got) and all(abs(g - round(g)) < 0.2 and abs(g - LEASE) > 0.3 for g in got)
        raise CheckFailure(
            f"claim_batch(lease_seconds={LEASE}) must lease each row until now + {LEASE} s "
            "(database clock), committed before it returns."
            + (" The leases are whole seconds: lease_seconds lost its fraction (a cast to "
               "integer, or an interval built from an int)." if whole else ""),
            expected=f"lease_until − the claim's time = {LEASE} s",
            actual="lease_until − the claim's start: " + ", ".join(
                "none" if r["after_start"] is None else f"{r['after_start']:.2f} s"
                for r in off),
            evidence=table(rows, LEASE_COLUMNS), lesson=SEE,
            fix="make_interval(secs => :lease_seconds) (or :lease_seconds * interval '1 second'"
                " with a float) keeps the fraction" if whole else None)
    leftover = open_transactions(other_sessions(outbox))
    if leftover:
        raise CheckFailure(
            "claim_batch returned but left a transaction open: its row locks stay held and the "
            "claim is not visible to others until it ends.",
            expected="no session of this database in an open transaction",
            actual=f"{len(leftover)} session(s)", evidence=table(leftover, SESSION_COLUMNS),
            lesson=SEE)
    second = event_ids(call(relay.claim_batch, outbox, batch_size=4, lease_seconds=30))
    third = event_ids(call(relay.claim_batch, outbox, batch_size=4, lease_seconds=30))
    fourth = event_ids(call(relay.claim_batch, outbox, batch_size=4, lease_seconds=30))
    # RETURNING's order depends on where the tuples lie, so an unsorted claim can come back in
    # order once and out of order the next time: every batch is held to the same rule.
    require_oldest_first(outbox, second, ids[4:8])
    require_oldest_first(outbox, third, ids[8:])
    if (second, third, fourth) != (ids[4:8], ids[8:], []):
        raise CheckFailure(
            "A leased row is not claimable until its lease ends; the next claims take the next "
            "oldest rows.",
            expected=f"then {ids[4:8]}, then {ids[8:]}, then []",
            actual=f"then {second}, then {third}, then {fourth}",
            evidence=table(outbox_rows(outbox), CLAIM_COLUMNS), lesson=SEE)


def require_oldest_first(outbox: Engine, claimed: list[str], oldest: list[str],
                         why: str | None = None) -> None:
    """A batch holding exactly the `oldest` rows must list them in created_at order; `why`
    replaces the headline where the check knows what reordered them."""
    if sorted(claimed) != sorted(oldest) or claimed == oldest:
        return
    raise CheckFailure(
        why or f"claim_batch leased the right rows, the {len(oldest)} oldest, but returned them "
        "in another order. The relay sends them in the order it gets them, so an order's "
        "version 2 can leave before its version 1. RETURNING has no order of its own, whatever "
        "the subquery's ORDER BY.",
        expected=f"the {len(oldest)} oldest ids in created_at order: {oldest}",
        actual=f"{claimed}", evidence=table(outbox_rows(outbox), CLAIM_COLUMNS),
        lesson=SEE,
        fix="sort what the claim returns by created_at (in Python, or SELECT … ORDER BY "
            "created_at over the UPDATE's RETURNING)")


def require_returned_attempt_counts(events: Any, rows: list[dict[str, Any]]) -> None:
    """Each claimed event carries the attempt_count its row has after the claim: the backoff
    of a failure is sized from the event the relay holds."""
    counted = {r["id"]: r["attempt_count"] for r in rows}
    found: list[dict[str, Any]] = [
        {"id": norm_id(ev["id"] if isinstance(ev, dict) else ev.id),
              "returned attempt_count": ev.get("attempt_count") if isinstance(ev, dict)
         else getattr(ev, "attempt_count", None)} for ev in events]
    found = [f | {"row's attempt_count": counted.get(f["id"])} for f in found]
    wrong = [f for f in found if f["returned attempt_count"] != f["row's attempt_count"]]
    if not wrong:
        return
    before = all(f["row's attempt_count"] is not None
                 and f["returned attempt_count"] == f["row's attempt_count"] - 1 for f in wrong)
    raise CheckFailure(
        "claim_batch counted the attempts in the table, but the events it returned carry "
        "another attempt_count. The relay sizes a failure's backoff from the event it holds "
        "(base × 2^(attempt_count − 1)), so every event must carry its row's count after this "
        "claim."
        + (" Each is one too low: the row as it was before the UPDATE (RETURNING the picked "
           "rows of the CTE, not the updated ones)." if before else ""),
        expected="each event's attempt_count = its row's attempt_count after the claim (1, or "
                 "2 for the two due retries)",
        actual=f"{len(wrong)} of {len(found)} event(s) with another count",
        evidence=table(found, ("id", "returned attempt_count", "row's attempt_count")),
        lesson=SEE,
        fix="RETURN the updated row's columns (UPDATE … RETURNING e.attempt_count, not the "
            "CTE's)" if before else None)


LEASE = 12.5  # seconds: a fraction, so a lease rounded to whole seconds shows
SLACK = 0.05
LEASE_COLUMNS = ("id", "attempt_count", "lease_until", "after_start", "after_end")


def lease_rows(engine: Engine, started: Any, ended: Any) -> list[dict[str, Any]]:
    """The rows with their lease measured from the claim's start and end (database clock)."""
    with engine.connect() as conn:
        found = conn.execute(text(
            "SELECT id::text AS id, attempt_count, lease_until::text AS lease_until, "
            "extract(epoch FROM lease_until - CAST(:s AS timestamptz))::float8 AS after_start, "
            "extract(epoch FROM lease_until - CAST(:e AS timestamptz))::float8 AS after_end "
            "FROM outbox_event ORDER BY created_at"), {"s": started, "e": ended}).mappings()
        return [dict(r) for r in found]


# A planner that may not use nested loops or merge joins hashes the few picked ids and meets
# the table's rows in their physical order (newest first, see seed_rows) while it updates them:
# RETURNING then gives that order, not the pick's ORDER BY. Any table big or busy enough makes
# that plan the planner's own choice; here it is forced for the learner's sessions only.
HASH_JOIN_OPTIONS = "-c enable_nestloop=off -c enable_mergejoin=off"


def test_claim_returns_oldest_first_whatever_the_plan(outbox, learner):
    require_table(outbox, "outbox_event", "claim")
    relay = learner.module("relay")
    ids = seed_rows(outbox, 9)
    hashing = create_engine(outbox.url, connect_args={"options": HASH_JOIN_OPTIONS},
                            poolclass=NullPool)
    try:
        claimed = event_ids(call(relay.claim_batch, hashing, batch_size=5, lease_seconds=LEASE))
    finally:
        hashing.dispose()
    require_oldest_first(outbox, claimed, ids[:5], why=(
        "claim_batch leased the right rows, the 5 oldest, but returned them in another "
        "order once the database joined the picked ids to the table by hashing (the plan it "
        "takes for a big table; forced here with enable_nestloop=off, enable_mergejoin=off). "
        "RETURNING gives rows in the order the UPDATE met them, whatever the subquery's "
        "ORDER BY, so the relay would send an order's version 2 before its version 1."))
    if claimed != ids[:5]:
        raise CheckFailure(
            "claim_batch must lease the oldest unpublished rows and return them oldest first, "
            "whatever plan the database picks (here: hash joins, as for a big table).",
            expected=f"the 5 oldest ids in created_at order: {ids[:5]}",
            actual=f"{claimed}", evidence=table(outbox_rows(outbox), CLAIM_COLUMNS),
            lesson=SEE)


def test_claims_skip_rows_another_relay_has_locked(outbox, learner):
    require_table(outbox, "outbox_event", "claim")
    relay = learner.module("relay")
    ids = seed_rows(outbox, 6)
    with outbox.connect() as holder:
        holder.begin()
        holder_pid = holder.execute(text("SELECT pg_backend_pid()")).scalar_one()
        # Another relay is mid-claim on the 3 oldest rows: they are row-locked, uncommitted.
        holder.execute(text("SELECT id FROM outbox_event ORDER BY created_at LIMIT 3 "
                            "FOR UPDATE"))
        claim = in_thread(relay.claim_batch, outbox, batch_size=10, lease_seconds=30)
        blocked = not claim.join(1.5)
        sessions = other_sessions(outbox) if blocked else []
        holder.rollback()
    claimed = event_ids(claim.result(10))
    if blocked:
        raise CheckFailure(
            "claim_batch waited for rows another relay had locked. Relays must not queue behind "
            "each other: FOR UPDATE SKIP LOCKED passes over locked rows and takes the next ones.",
            expected="claim_batch returns at once with the 3 rows nobody had locked",
            actual=f"it was still waiting after 1.5 s, blocked by pid {holder_pid} (the check's "
                   "session holding the 3 oldest rows FOR UPDATE)",
            evidence=table(sessions, SESSION_COLUMNS), lesson=SEE)
    if sorted(claimed) != sorted(ids[3:]):
        raise CheckFailure(
            "With the 3 oldest rows locked by another relay, the claim takes the 3 others.",
            expected=f"{sorted(ids[3:])}", actual=f"{sorted(claimed)}", lesson=SEE)


def test_concurrent_claims_are_disjoint(outbox, learner):
    require_table(outbox, "outbox_event", "claim")
    relay = learner.module("relay")
    claim_between_pick_and_lease(outbox, relay)  # deterministic: first
    claim_after_another_relay_committed(outbox, relay)
    returned: set[str] = set()
    for round_no in range(1, RACE_ROUNDS + 1):
        seed_rows(outbox, 40)
        # Slow SQL widens the window between reading candidate rows and leasing them.
        with slow_sql(outbox, 0.03, match=r"\boutbox_event\b"):
            outcomes = run_concurrently(
                lambda i: event_ids(call(relay.claim_batch, outbox, batch_size=10,
                                         lease_seconds=30)), 4, timeout=20)
        for outcome in outcomes:
            if outcome.error is not None:
                raise outcome.error
        owners: dict[str, list[int]] = {}
        for outcome in outcomes:
            for event_id in outcome.value:
                owners.setdefault(event_id, []).append(outcome.index)
        shared = [{"id": i, "claimed by relays": w} for i, w in owners.items() if len(w) > 1]
        if shared:
            raise CheckFailure(
                f"Four relays claimed at the same moment (round {round_no}) and {len(shared)} "
                "row(s) went to more than one of them: each would send the event. Reading "
                "candidates and leasing them must be one locked step (FOR UPDATE SKIP LOCKED "
                "in the claim).",
                expected="every row claimed by at most one relay",
                actual=f"{len(shared)} row(s) claimed twice or more",
                evidence=table(shared, ("id", "claimed by relays")), lesson=SEE)
        returned |= set(owners)
        leased = {r["id"] for r in outbox_rows(outbox, "attempt_count > 0 "
                                               "AND lease_until > clock_timestamp()")}
        lost = leased - returned
        if lost:
            raise CheckFailure(
                "Some rows were leased in the database but returned to no relay: nobody sends "
                "them until the lease expires.",
                expected="the leased rows are exactly the rows claim_batch returned",
                actual=f"{len(lost)} leased row(s) returned to nobody",
                evidence="\n".join(sorted(lost)[:10]), lesson=SEE)


LEASING = r"\bupdate\s+(only\s+)?(public\.)?\"?outbox_event\b"
HOLD = 0.5  # seconds relay A waits before its leasing UPDATE


def claim_after_another_relay_committed(engine: Engine, relay: Any) -> None:
    """Relay A's transaction has begun (a first statement ran: its snapshot exists) when relay
    B leases the 3 oldest rows and commits; then A claims. At READ COMMITTED A's claim sees B's
    leases and takes the next rows; at REPEATABLE READ or SERIALIZABLE it fails to lock the
    rows B changed after A's snapshot (could not serialize access)."""
    from sqlalchemy import event

    seed_rows(engine, 6)
    started, b_done = threading.Event(), threading.Event()
    a_thread = f"dojo-learner-{getattr(relay.claim_batch, '__name__', 'call')}"

    def first_statement(conn: Any, cursor: Any, statement: str, *rest: Any) -> None:
        if threading.current_thread().name == a_thread and not started.is_set() and \
                re.search(r"\boutbox_event\b", statement, re.IGNORECASE):
            cursor.execute("SELECT 1")  # A's transaction is under way: its snapshot is taken
            started.set()
            b_done.wait(10)

    event.listen(engine, "before_cursor_execute", first_statement)
    try:
        a = in_thread(relay.claim_batch, engine, batch_size=3, lease_seconds=30)
        if not started.wait(10):
            a.join(5)
            a.result(0)
            return
        try:
            b = event_ids(call(relay.claim_batch, engine, batch_size=3, lease_seconds=30))
        finally:
            b_done.set()
        a.join(10)
    finally:
        b_done.set()
        event.remove(engine, "before_cursor_execute", first_statement)
    error = raised(a.result, 0)
    if error is not None:
        serialization = sqlstate(error) == "40001"
        raise CheckFailure(
            "Relay A had begun its claim transaction when relay B leased the 3 oldest rows and "
            "committed; then A's claim raised instead of taking the 3 others."
            + (" It failed to serialize: at REPEATABLE READ (or SERIALIZABLE) a transaction "
               "may not lock a row another transaction changed after its snapshot, so every "
               "claim that meets a row another relay just leased fails. Relays claim at once "
               "all the time: claim at READ COMMITTED (the default), where FOR UPDATE SKIP "
               "LOCKED re-reads the row's latest version." if serialization else ""),
            expected="relay A's claim returns the 3 rows B did not lease",
            actual=f"it raised {first_line(error)}",
            evidence=f"relay B leased {b}", lesson=SEE,
            fix="leave the claim's transaction at READ COMMITTED" if serialization else None)
    got = event_ids(a.result(0))
    if set(got) & set(b) or len(got) != 3:
        raise CheckFailure(
            "Relay A had begun its claim transaction when relay B leased the 3 oldest rows and "
            "committed; A must then take the 3 others, none of B's.",
            expected="3 rows, none leased by B", actual=f"A got {got}; B got {b}", lesson=SEE)
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM outbox_event"))


def claim_between_pick_and_lease(engine: Engine, relay: Any) -> None:
    """Relay A is held just before the UPDATE that leases its rows (after whatever it ran
    before it: a pick in a transaction of its own, a locking SELECT, or nothing); relay B
    claims in that moment. Rows A picked must be locked or leased by then."""
    from sqlalchemy import event

    seed_rows(engine, 12)
    worker = f"dojo-learner-{getattr(relay.claim_batch, '__name__', 'call')}"
    begun: list[Any] = []

    def begin_first(conn: Any, cursor: Any, statement: str, *rest: Any) -> None:
        # A's transaction begins before its first statement on outbox_event (as it does after
        # any statement the claim runs first): now() is then that moment, HOLD s or more
        # before the UPDATE, even when the claim is one statement.
        if threading.current_thread().name == worker and not begun and touches_outbox(statement):
            cursor.execute("SELECT now()")
            begun.append(cursor.fetchone()[0])  # when A's transaction began

    started = db_now(engine)
    event.listen(engine, "before_cursor_execute", begin_first)  # before slow_sql's hold
    try:
        with record_sql(engine, peek=0, xid=True) as log, \
                slow_sql(engine, HOLD, match=LEASING, when="before") as held:
            first = in_thread(relay.claim_batch, engine, batch_size=6, lease_seconds=30)
            deadline = time.monotonic() + 10
            while not held and first.alive and time.monotonic() < deadline:
                time.sleep(0.002)
            holding = bool(held)
            second = event_ids(call(relay.claim_batch, engine, batch_size=6, lease_seconds=30))
            a = event_ids(first.result(15))
    finally:
        event.remove(engine, "before_cursor_execute", begin_first)
    shared = sorted(set(a) & set(second))
    if holding and not shared and len(a) + len(second) < 12:
        require_each_relay_got_its_rows(engine, relay, log, a, second)
    if not (holding and shared):
        require_lease_from_the_update(engine, a, started, begun[0] if begun else None)
        with engine.begin() as conn:  # the barrier race next starts from an empty outbox
            conn.execute(text("DELETE FROM outbox_event"))
        return
    mine = [s for s in log if s.worker == worker and touches_outbox(s.sql)]
    picks = [s for s in mine if not re.search(LEASING, s.sql, re.IGNORECASE)]
    leases = [s for s in mine if re.search(LEASING, s.sql, re.IGNORECASE)]
    split = bool(picks and leases) and picks[0].xid is not None and \
        picks[0].xid != leases[0].xid
    unlocked = bool(picks) and not any(re.search(r"\bfor\s+(no\s+key\s+)?update\b", p.sql,
                                                 re.IGNORECASE) for p in picks)
    raise CheckFailure(
        f"Relay A had picked its rows and was about to lease them (the check held its UPDATE "
        f"for {HOLD} s); relay B claimed in that moment and got {len(shared)} of the same rows, "
        "so both send them. "
        + ("A's pick ran in a transaction of its own, committed before the UPDATE: its row "
           "locks were gone and the rows not yet leased." if split else
           "A's pick did not lock the rows it read (no FOR UPDATE), so nothing kept B off them."
           if unlocked else
           "Between the pick and the lease, A's rows were neither locked nor leased."),
        expected="B claims only rows A did not pick",
        actual=f"{len(shared)} row(s) returned to both relays",
        evidence="relay A's statements (and their transactions):\n" +
                 "\n".join(f"  {st.compact[:100]}\n    transaction {st.xid or '(none yet)'}"
                           for st in mine) +
                 "\n\nrows claimed by both:\n" + "\n".join(shared),
        lesson=SEE,
        fix="pick and lease in one transaction (SELECT … FOR UPDATE SKIP LOCKED, then the "
            "UPDATE, before the commit) or in one statement (WITH … FOR UPDATE SKIP LOCKED "
            "UPDATE …)" if split else
            "lock the rows you pick: SELECT … FOR UPDATE SKIP LOCKED, in the transaction of the "
            "UPDATE that leases them" if unlocked else None)


def require_each_relay_got_its_rows(engine: Engine, relay: Any, log: Any, a: list[str],
                                    b: list[str]) -> None:
    """12 claimable rows, two claims of 6, relay A held before its leasing UPDATE: A's pick
    holds its row locks until the UPDATE (or is that UPDATE), so each relay gets 6 rows. A pick
    whose locks ended before the lease loses its rows to B and, re-checking the lease, comes
    back short: the two relays never shared a row, and yet rows nobody claimed stay behind."""
    worker = f"dojo-learner-{getattr(relay.claim_batch, '__name__', 'call')}"
    mine = [s for s in log if s.worker == worker and touches_outbox(s.sql)]
    picks = [s for s in mine if not re.search(LEASING, s.sql, re.IGNORECASE)]
    leases = [s for s in mine if re.search(LEASING, s.sql, re.IGNORECASE)]
    split = bool(picks and leases) and picks[0].xid is not None and \
        picks[0].xid != leases[0].xid
    raise CheckFailure(
        f"12 rows were claimable and two relays asked for 6 each. Relay A had picked its rows "
        f"and was about to lease them (the check held its UPDATE for {HOLD} s) when relay B "
        f"claimed; then A got {len(a)} row(s) and B {len(b)}: "
        f"{12 - len(a) - len(b)} claimable row(s) went to nobody. "
        + ("A's pick ran in a transaction of its own, committed before the UPDATE: its row "
           "locks were gone, B took A's rows, and A's UPDATE (re-checking the lease) found them "
           "leased. No row was sent twice, but A's batch came back short while rows waited."
           if split else
           "The rows A picked were no longer locked when B claimed, so B took them and A's "
           "lease found them gone."),
        expected="A and B get 6 rows each, none shared (A's picked rows stay locked until its "
                 "UPDATE leases them, so B takes the 6 others)",
        actual=f"A got {len(a)} row(s), B got {len(b)}",
        evidence="relay A's statements (and their transactions):\n" +
                 "\n".join(f"  {st.compact[:100]}\n    transaction {st.xid or '(none yet)'}"
                           for st in mine) +
                 "\n\nrows A got:\n" + "\n".join(a) + "\n\nrows B got:\n" + "\n".join(b),
        lesson=SEE,
        fix="pick and lease in one transaction (SELECT … FOR UPDATE SKIP LOCKED, then the "
            "UPDATE, before the commit) or in one statement (WITH … FOR UPDATE SKIP LOCKED "
            "UPDATE …)" if split else None)


def require_lease_from_the_update(engine: Engine, leased: list[str], started: Any,
                                  began: Any) -> None:
    """Relay A's UPDATE ran at least HOLD s after its claim began: its lease runs 30 s from
    then (clock_timestamp() at the UPDATE), not from the start of its transaction (now()),
    nor from a time read before the statement (Python's clock)."""
    rows = [r for r in lease_rows(engine, started, started) if r["id"] in leased]
    short = [r for r in rows if r["after_start"] is None or r["after_start"] < 30 + HOLD - SLACK]
    if not short:
        return
    with engine.connect() as conn:  # where each short lease starts, against A's transaction
        starts: dict[str, float | None] = dict(conn.execute(text(
            "SELECT id::text, extract(epoch FROM lease_until - interval '30 s' - "
            "CAST(:b AS timestamptz))::float8 FROM outbox_event WHERE id::text = ANY(:ids)"),
            {"b": began, "ids": [str(r["id"]) for r in short]}).all()) if began else {}
    from_begin = bool(starts) and all(v is not None and abs(v) < 0.00001 for v in starts.values())
    fix: str | None
    if from_begin:
        cause = ("30 s counted from the very moment its transaction began, not from the lease. "
                 "now() (and CURRENT_TIMESTAMP) is the transaction's start, even inside a "
                 "single UPDATE; a claim that picks first and leases after, runs anything "
                 "before, or waits for a lock, loses that time from every lease")
        fix = ("lease with clock_timestamp() + make_interval(secs => :lease_seconds), the time "
               "of the statement, not now()")
    elif starts:
        offsets = ", ".join(f"{v * 1000:+.1f} ms" for v in starts.values() if v is not None)
        cause = ("30 s counted from a time that is neither the UPDATE's nor the transaction's "
                 f"start ({offsets} from the moment A's transaction began, the UPDATE ran "
                 f"{HOLD:g} s after it): a time read before the statement, from this process's "
                 "clock or an earlier query, not the database's clock when the UPDATE leased "
                 "the rows; the lease loses however long the statement waits (a lock, a slow "
                 "connection)")
        fix = ("lease with clock_timestamp() + make_interval(secs => :lease_seconds), computed "
               "in the UPDATE")
    else:
        cause = "30 s counted from before the UPDATE that leased them"
        fix = None
    raise CheckFailure(
        f"Relay A's claim transaction had begun (a first statement ran) and was held {HOLD} s "
        "before the UPDATE that leased its rows, and its leases ended up short: " + cause
        + ", and another relay takes the rows while they are still being sent.",
        expected=f"lease_until − the claim's start ≥ {30 + HOLD:g} s (30 s from the UPDATE, "
                 f"which ran {HOLD} s or more after the start)",
        actual="lease_until − the claim's start: " + ", ".join(
            "none" if r["after_start"] is None else f"{r['after_start']:.2f} s"
            for r in short[:6]),
        evidence=table(rows, ("id", "attempt_count", "lease_until", "after_start")),
        lesson=SEE,
        fix=fix)


def test_expired_lease_is_reclaimed(outbox, learner):
    require_table(outbox, "outbox_event", "claim")
    relay = learner.module("relay")
    ids = seed_rows(outbox, 3)
    # The rows failed once and are due again (next_attempt_at has passed); one more row was
    # published after a failed attempt, and the mark left its next_attempt_at as it was.
    done = insert_event(outbox, created_ago=60, published_ago=30, attempt_count=2)
    with outbox.begin() as conn:
        conn.execute(text("UPDATE outbox_event SET next_attempt_at = now() - interval "
                          "'1 second', last_error = 'timed out', attempt_count = CASE WHEN "
                          "published_at IS NULL THEN 1 ELSE attempt_count END"))
    first = event_ids(call(relay.claim_batch, outbox, batch_size=10, lease_seconds=30))
    during = event_ids(call(relay.claim_batch, outbox, batch_size=10, lease_seconds=30))
    # Fast-forward: the lease has expired (the README's clock is the columns).
    with outbox.begin() as conn:
        conn.execute(text("UPDATE outbox_event SET lease_until = clock_timestamp() - "
                          "interval '1 millisecond' WHERE lease_until IS NOT NULL"))
    after = event_ids(call(relay.claim_batch, outbox, batch_size=10, lease_seconds=30))
    rows = outbox_rows(outbox)
    columns = CLAIM_COLUMNS + ("next_attempt_at",)
    if during or done in first + after:
        raise CheckFailure(
            "The claim took rows it must not: "
            + ("rows another relay had leased a moment before" if during else "")
            + (" and " if during and done in first + after else "")
            + ("a row already published" if done in first + after else "")
            + ". Each of them had failed once and its next_attempt_at had passed. A WHERE "
              "without parentheses around the backoff test reads `… AND next_attempt_at IS NULL "
              "OR next_attempt_at <= clock_timestamp()`: AND binds tighter than OR, so any row "
              "whose backoff has passed is claimable, leased or published.",
            expected=f"claim → {ids}; again at once → []; the published row never",
            actual=f"claim → {first}; again at once → {during}; after the lease → {after}",
            evidence=table(rows, columns), lesson=SEE,
            fix="(next_attempt_at IS NULL OR next_attempt_at <= clock_timestamp()), in its "
                "own parentheses, ANDed with the rest")
    mine = [r for r in rows if r["id"] in ids]
    if not ((first, sorted(after)) == (ids, sorted(ids)) and
            all(r["attempt_count"] == 3 for r in mine)):
        raise CheckFailure(
            "A lease is how a crashed relay's rows come back: while it lasts nobody else "
            "claims them; once it has expired the next claim takes them (one more attempt).",
            expected=f"claim → {ids}; again at once → []; once the lease has expired → all 3 "
                     "again, attempt_count 3 (they had failed once before)",
            actual=f"claim → {first}; again at once → {during}; after → {after}",
            evidence=table(rows, columns), lesson=SEE)


# Rows that failed this many times before and are due again: a claim has no attempt limit.
MANY_FAILURES = {1: 25, 4: 1099, 7: 32766}  # index of the row → its attempt_count (smallint-safe)
# Before each claim, rows of the earlier claims come back: (expired lease, failed and due).
COME_BACK = [(), (0, 1), (2, 3), (0,)]
BATCHES = [3, 3, 3, 4]
CLAIMABLE = text("SELECT id::text FROM outbox_event WHERE published_at IS NULL "
                 "AND (lease_until IS NULL OR lease_until < clock_timestamp()) "
                 "AND (next_attempt_at IS NULL OR next_attempt_at <= clock_timestamp()) "
                 "ORDER BY created_at LIMIT :n")


def test_every_claim_takes_the_oldest_claimable_rows(outbox, learner):
    require_table(outbox, "outbox_event", "claim")
    relay = learner.module("relay")
    ids = seed_rows(outbox, 9)
    with outbox.begin() as conn:
        for index, attempts in MANY_FAILURES.items():
            conn.execute(text("UPDATE outbox_event SET attempt_count = :n, last_error = "
                              "'timed out', next_attempt_at = clock_timestamp() - interval "
                              "'3 seconds' WHERE id::text = :id"),
                         {"n": attempts, "id": ids[index]})
    history: list[str] = []
    for turn, (back, size) in enumerate(zip(COME_BACK, BATCHES, strict=True), start=1):
        with outbox.begin() as conn:
            # Fast-forward (the README's clock is the columns): the first row's lease ran out,
            # the second failed and its backoff has passed.
            for n, index in enumerate(back):
                conn.execute(text(
                    "UPDATE outbox_event SET lease_until = clock_timestamp() - interval "
                    "'1 millisecond' WHERE id::text = :id" if n == 0 else
                    "UPDATE outbox_event SET lease_until = NULL, last_error = 'timed out', "
                    "next_attempt_at = clock_timestamp() - interval '1 millisecond' "
                    "WHERE id::text = :id"), {"id": ids[index]})
            expected = [r[0] for r in conn.execute(CLAIMABLE, {"n": size})]
        claimed = event_ids(call(relay.claim_batch, outbox, batch_size=size, lease_seconds=LEASE))
        label = {i: f"row {ids.index(i) + 1}" for i in ids}
        history.append(f"claim {turn} (batch_size={size}): expected "
                       f"{[label[i] for i in expected]}, got "
                       f"{[label.get(i, i) for i in claimed]}")
        if claimed == expected:
            continue
        rows = outbox_rows(outbox)
        missed = [i for i in expected if i not in claimed]
        counts = {r["id"]: r["attempt_count"] for r in rows}
        many = {ids[i] for i in MANY_FAILURES}
        parked = bool(missed) and all(i in many for i in missed)
        raise CheckFailure(
            (f"Claim {turn} passed over rows that had failed "
             + ", ".join(str(counts[i]) for i in missed)
             + " times and were due again (no lease, backoff passed), and took newer rows. A "
               "claim has no attempt limit: a row nobody claims any more is neither published "
               "nor retried, its backoff never computed again, and nothing tells anyone."
             if parked else
             f"Claim {turn} of one relay process did not take the oldest claimable rows: rows an "
             "earlier claim of this process had taken came back (a lease ran out, a backoff "
             "passed) and it took newer rows instead. Every claim looks at the whole table: "
             "the oldest unpublished rows, lease absent or expired, not backing off, whatever "
             "earlier claims took."),
            expected=f"claim {turn} → the oldest claimable rows, in created_at order",
            actual="; ".join(history),
            evidence=table([r | {"row": f"row {ids.index(r['id']) + 1}"} for r in rows],
                           ("row",) + CLAIM_COLUMNS + ("next_attempt_at",)),
            lesson=SEE,
            fix="drop the attempt_count condition from the claim: a row is claimable when it is "
                "unpublished, not leased and due, whatever its attempt_count" if parked else None)


def test_claim_uses_the_partial_index(outbox, learner):
    require_table(outbox, "outbox_event", "claim")
    relay = learner.module("relay")
    fill_with_published_rows(outbox)
    with record_sql(outbox) as log:
        call(relay.claim_batch, outbox, batch_size=100, lease_seconds=30)
    statements = [s for s in log if touches_outbox(s.sql) and
                  s.sql.lstrip().upper().startswith(("SELECT", "UPDATE", "WITH"))]
    if not statements:
        raise CheckFailure(
            "claim_batch ran no SELECT or UPDATE on outbox_event through the engine it was given.",
            expected="its claim statement, executed via the SQLAlchemy engine",
            actual=f"{len(log)} statement(s), none on outbox_event", lesson=SEE)
    plans = [(s, *explain_uses_partial_index(outbox, s.sql, s.params)) for s in statements]
    using = [p for p in plans if p[1]]
    if not using:
        raise CheckFailure(
            "Your claim's SQL, on a table of 20,000 published and 30 unpublished rows, does not "
            "read the partial index (or it scans the whole table somewhere). It runs many times a "
            "second: its predicate must match the index's (published_at IS NULL).",
            expected=f"an index scan using a partial index ({', '.join(plans[0][2]) or 'none'}) "
                     "and no Seq Scan on outbox_event",
            actual="the plans below",
            evidence="\n\n".join(f"{' '.join(s.sql.split())[:160]}\n{indent(plan, 2)}"
                              for s, _, _, plan in plans), lesson=SEE)


def relay_in_thread(relay: Any, engine: Engine, producer: Any, topic: str,
                    batch_size: int) -> Running:
    return in_thread(relay.relay_once, engine, producer, topic, batch_size=batch_size,
                     lease_seconds=30)


def wait_for_send(slow: Any, job: Running) -> None:
    """Wait until relay_once calls produce() (its claim is done); fail when it never does."""
    deadline = time.monotonic() + 10
    while not slow.first_send.wait(0.05):
        if not job.alive or time.monotonic() > deadline:
            if not job.alive:
                job.result(0)  # what it raised (a stub's NotWritten too)
            raise CheckFailure(
                "relay_once did not call producer.produce() for the rows it claimed.",
                expected="relay_once claims a batch and sends it (README)",
                actual=f"it returned {job.value!r} without sending" if not job.alive
                else "no produce() call within 10 s", lesson=SEE)


def test_claim_commits_before_the_send(outbox, learner, kafka):
    require_table(outbox, "outbox_event", "claim")
    relay = learner.module("relay")
    topic = kafka.topic(1, hint="claim")
    seed_rows(outbox, 3)
    # The look happens when the first acknowledgement is about to reach relay_once: it is
    # then waiting for the broker, and whatever transaction it holds across the send is open.
    watch = AckWatch(SlowProducer(kafka.producer(), delay=0.8),
                     lambda: other_sessions(outbox))
    job = relay_in_thread(relay, outbox, watch, topic, 10)
    wait_for_send(watch, job)
    job.join(15)
    job.result(0)
    sessions = watch.seen or []
    held = open_transactions(sessions)
    if held:
        raise CheckFailure(
            "While relay_once waited for a slow broker (0.8 s per acknowledgement), it kept a "
            "database transaction open. Every row it claimed stays locked and a pooled "
            "connection is pinned for as long as Kafka takes: a slow broker becomes a stuck "
            "database. Claim in a short transaction, commit, then send; mark in another short "
            "transaction.",
            expected="no session idle in transaction (or holding outbox_event locks) during the "
                     "send",
            actual=f"{len(held)} session(s) idle in transaction during the send",
            evidence=table(sessions, SESSION_COLUMNS), lesson=MISTAKES)


def test_slow_send_does_not_block_another_relays_claim(outbox, learner, kafka):
    require_table(outbox, "outbox_event", "claim")
    relay = learner.module("relay")
    topic = kafka.topic(1, hint="claim2")
    seed_rows(outbox, 8)
    slow = SlowProducer(kafka.producer(), delay=0.8)
    job = relay_in_thread(relay, outbox, slow, topic, 4)
    wait_for_send(slow, job)
    first = {r["id"] for r in outbox_rows(outbox, "attempt_count > 0")}
    started = time.monotonic()
    claimer = in_thread(relay.claim_batch, outbox, batch_size=4, lease_seconds=30)
    sessions = other_sessions(outbox) if not claimer.join(0.5) else []
    waited = time.monotonic() - started
    claimer.join(15)
    job.join(15)
    if sessions:
        raise CheckFailure(
            "A second relay's claim_batch waited while the first relay was busy sending. Each "
            "relay's claim must commit before its send, and claims must skip locked rows.",
            expected="the second claim returns in well under 0.5 s",
            actual=f"still waiting after {waited:.1f} s",
            evidence=table(sessions, SESSION_COLUMNS), lesson=SEE)
    got = set(event_ids(claimer.result(0)))
    if not (len(got) == 4 and not got & first):
        raise CheckFailure(
            "The second relay must take the 4 rows the first one did not claim.",
            expected="4 rows, none of the first relay's", actual=f"{sorted(got)}",
            evidence=f"first relay's rows: {sorted(first)}", lesson=SEE)
