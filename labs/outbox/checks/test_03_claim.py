"""Stage claim: a short transaction leases a batch with FOR UPDATE SKIP LOCKED and commits
before anything is sent; relays never share a row and never wait for each other."""

from __future__ import annotations

import time
from typing import Any

import pytest
from _support import (
    MISTAKES,
    READ,
    explain_uses_partial_index,
    fill_with_published_rows,
    insert_event,
    norm_id,
    other_sessions,
    outbox_rows,
    require_table,
    touches_outbox,
)
from sqlalchemy import Engine, text

from dojo.checks import CheckFailure, call, in_thread, indent, table
from dojo.checks.faults import SlowProducer, run_concurrently, slow_sql
from dojo.checks.learner import Running
from dojo.checks.observers import SESSION_COLUMNS, open_transactions, record_sql

pytestmark = pytest.mark.stage("claim")
SEE = READ["claim"]

CLAIM_COLUMNS = ("id", "attempt_count", "lease_left", "published_at")
RACE_ROUNDS = 3  # the lock-free claim mutant overlaps in round 1 (slowed SQL makes it certain)


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
    claimed = event_ids(call(relay.claim_batch, outbox, batch_size=4, lease_seconds=30))
    if claimed != ids[:4]:
        raise CheckFailure(
            "claim_batch must lease the oldest unpublished rows and return them oldest first, at "
            "most batch_size. Without ORDER BY created_at in the locked SELECT, LIMIT takes "
            "whichever rows the scan meets first (here the newest: the check inserted them first), "
            "so an old event can wait for ever and an order's version 2 can leave before "
            "version 1; and RETURNING has no order of its own, so sort what it gives back.",
            expected=f"the 4 oldest ids in created_at order: {ids[:4]}",
            actual=f"{claimed}", evidence=table(outbox_rows(outbox), CLAIM_COLUMNS),
            lesson=SEE)
    rows = {r["id"]: r for r in outbox_rows(outbox)}
    bad = [r for i, r in rows.items() if (i in claimed) != (
        r["attempt_count"] == 1 and r["lease_left"] is not None and 25 < r["lease_left"] < 35)]
    if bad:
        raise CheckFailure(
            "Claiming a row leases it (lease_until = now + lease_seconds) and counts the attempt, "
            "committed before claim_batch returns; unclaimed rows stay untouched.",
            expected="the 4 claimed rows: attempt_count 1, lease ≈ 30 s left; the others: "
                     "attempt_count 0, no lease",
            actual="the rows below (lease_left in seconds)",
            evidence=table(list(rows.values()), CLAIM_COLUMNS), lesson=SEE)
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
    if (second, third, fourth) != (ids[4:8], ids[8:], []):
        raise CheckFailure(
            "A leased row is not claimable until its lease ends; the next claims take the next "
            "oldest rows.",
            expected=f"then {ids[4:8]}, then {ids[8:]}, then []",
            actual=f"then {second}, then {third}, then {fourth}",
            evidence=table(outbox_rows(outbox), CLAIM_COLUMNS), lesson=SEE)


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


def test_expired_lease_is_reclaimed(outbox, learner):
    require_table(outbox, "outbox_event", "claim")
    relay = learner.module("relay")
    ids = seed_rows(outbox, 3)
    first = event_ids(call(relay.claim_batch, outbox, batch_size=10, lease_seconds=0.3))
    during = event_ids(call(relay.claim_batch, outbox, batch_size=10, lease_seconds=0.3))
    time.sleep(0.45)
    after = event_ids(call(relay.claim_batch, outbox, batch_size=10, lease_seconds=30))
    rows = outbox_rows(outbox)
    if not ((first, during, sorted(after)) == (ids, [], sorted(ids)) and
            all(r["attempt_count"] == 2 for r in rows)):
        raise CheckFailure(
            "A lease is how a crashed relay's rows come back: while it lasts nobody else "
            "claims them; once it has expired the next claim takes them (attempt 2).",
            expected=f"claim → {ids}; again at once → []; after the 0.3 s lease → all 3 again, "
                     "attempt_count 2",
            actual=f"claim → {first}; again at once → {during}; after → {after}",
            evidence=table(rows, CLAIM_COLUMNS), lesson=SEE)


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


def wait_for_send(slow: SlowProducer, job: Running) -> None:
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
    slow = SlowProducer(kafka.producer(), delay=0.8)
    job = relay_in_thread(relay, outbox, slow, topic, 10)
    wait_for_send(slow, job)
    time.sleep(0.15)
    sessions = other_sessions(outbox)
    held = open_transactions(sessions)
    job.join(15)
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
    job.result(0)


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
