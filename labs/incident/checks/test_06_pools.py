"""Stage pools: the code path that leaks connections, from pg_stat_activity.

Every session is real and settled before the learner looks (a barrier on pg_stat_activity):
one path's connections sit idle in transaction, checked out and never returned; a warm pool
keeps more connections idle; a busy path runs more statements at once; the shop's role leaks
even more connections in another database of the server. The healthy run keeps the warm pool,
the busy path and the other database, plus a job with two sessions idle in transaction.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from _pools import (
    AHEAD_ON_IDLE,
    ELSEWHERE,
    LEAKED,
    LONE_JOB,
    SMALLER_LEAK,
    SMALLER_LEAK_IDLE,
    PoolRun,
    pool_run,
)
from _support import POOLS, PROVE, Sources, field_of
from sqlalchemy import text

from dojo.checks import CheckFailure, call, table

pytestmark = pytest.mark.stage("pools")


def _leak_of(learner: Any, run: PoolRun) -> Any:
    return call(learner.module("triage").connection_leak, run.sources)


def _why(run: PoolRun, got: Any) -> str | None:
    """The fix line when the path named identifies the mistake."""
    if got == run.roles.warm:
        return (f"{got}'s connections are idle: back in its pool, ready for the next request. "
                "A warm pool is healthy. Only a connection idle in transaction was checked "
                "out and never given back.")
    if got == run.roles.busy:
        return (f"{got} holds the most connections in use, but its sessions are active: "
                "running statements that will end. A leak is a connection nobody uses any "
                "more: count the sessions idle in transaction per path.")
    if got == ELSEWHERE:
        return (f"{got} works in another database on the same server: pg_stat_activity lists "
                "the sessions of every database. Keep only those with datname = "
                "current_database().")
    if got == LONE_JOB and run.leak:
        return (f"{got} leaks too ({run.job} sessions idle in transaction), but "
                f"{run.roles.leaking} leaks more ({LEAKED}): of several leaking paths, report "
                "the one with the most sessions idle in transaction (not the most sessions: "
                "idle ones are back in their pool).")
    if got == LONE_JOB:
        forgotten = sum(n for states in run.expected.values()
                        for state, n in states.items() if state.startswith("idle in trans"))
        return (f"{got} has two sessions idle in transaction, a job between statements. "
                "A path leaks when 3 or more of its own sessions are idle in transaction: "
                f"connections piling up on that path (the shop has {forgotten} in all, "
                "spread over paths that have 1 or 2 each).")
    return None


def test_the_leaking_path_is_named(learner, database, other_database, seed):
    # the inventory job leaks a little too (3 sessions; 7 in all with its idle ones); the run's
    # path leaks more (5; 6 in all)
    with pool_run(database, other_database, seed, leak=True, job=SMALLER_LEAK,
                  job_idle=SMALLER_LEAK_IDLE) as run:
        found = _leak_of(learner, run)
        evidence = run.evidence()
    got = field_of(found, "application_name") if found is not None else None
    leaked = field_of(found, "leaked") if found is not None else None
    if got == run.roles.leaking and leaked == LEAKED:
        return
    want = f"application_name {run.roles.leaking!r}, leaked {LEAKED}"
    fix = _why(run, got)
    if got == run.roles.leaking and leaked == LEAKED - 1:
        fix = ("One of its connections hit an error and was abandoned on the error path: "
               "its state is 'idle in transaction (aborted)'. It is checked out and never "
               "returned all the same: count both states.")
    raise CheckFailure(
        "connection_leak() did not name the code path that leaks connections.",
        expected=want,
        actual="None" if found is None else f"application_name {got!r}, leaked {leaked!r}",
        evidence=evidence,
        lesson=POOLS,
        fix=fix,
    )


def test_three_forgotten_connections_are_a_leak(learner, database, other_database, seed):
    # exactly the README's threshold, in both states: 2 connections idle in transaction and 1
    # idle in transaction (aborted), under 3 in either state alone
    with pool_run(database, other_database, seed, leak=True, leaked=3, failed=1) as run:
        found = _leak_of(learner, run)
        evidence = run.evidence()
    got = field_of(found, "application_name") if found is not None else None
    leaked = field_of(found, "leaked") if found is not None else None
    if got == run.roles.leaking and leaked == 3:
        return
    fix = _why(run, got)
    if found is None:
        fix = ("That path has 3 forgotten connections: 2 idle in transaction and 1 idle in "
               "transaction (aborted). A path leaks when 3 or more of its sessions are in "
               "those states, counted together (at least 3, not more than 3).")
    raise CheckFailure(
        "connection_leak() missed a path with exactly 3 forgotten connections.",
        expected=f"leaked 3, application_name {run.roles.leaking!r}",
        actual="None" if found is None else f"application_name {got!r}, leaked {leaked!r}",
        evidence=evidence,
        lesson=POOLS,
        fix=fix,
    )


def test_connections_are_counted_per_path_and_state(learner, database, other_database, seed):
    with pool_run(database, other_database, seed, leak=True) as run:
        found = _leak_of(learner, run)
        evidence = run.evidence()
    by_path = field_of(found, "by_path") if found is not None else None
    wrong = []
    for path, states in sorted(run.expected.items()):
        have = by_path.get(path) if isinstance(by_path, dict) else None
        if not isinstance(have, dict) or {s: n for s, n in have.items() if n} != states:
            wrong.append((path, states, have))
    if not wrong:
        return
    raise CheckFailure(
        "connection_leak() counted the shop's sessions per path and state wrongly.",
        expected="by_path: " + "; ".join(f"{path} {states}" for path, states, _ in wrong),
        actual="by_path: " + ("None" if found is None and by_path is None else "; ".join(
            f"{path} {have}" for path, _, have in wrong)),
        evidence=evidence,
        lesson=POOLS,
    )


def test_a_healthy_pool_raises_nothing(learner, database, other_database, seed):
    with pool_run(database, other_database, seed, leak=False) as run:
        found = _leak_of(learner, run)
        evidence = run.evidence()
    if found is None:
        return
    got = field_of(found, "application_name")
    raise CheckFailure(
        "connection_leak() reported a leak although no path of the shop leaks.",
        expected="None (idle connections are the pools' own; active ones are working; one "
                 "or two sessions idle in transaction on a path are not yet a pile)",
        actual=f"application_name {got!r}, leaked {field_of(found, 'leaked')!r}",
        evidence=evidence,
        lesson=POOLS,
        fix=_why(run, got),
    )


def test_the_leak_finding_carries_its_evidence(learner, database, other_database, seed):
    with pool_run(database, other_database, seed, leak=True) as run:
        found = _leak_of(learner, run)
        evidence = run.evidence()
    listed = field_of(found, "evidence") if found is not None else None
    if (isinstance(listed, list) and listed and all(isinstance(e, str) for e in listed)
            and any(run.roles.leaking in e for e in listed)):
        return
    raise CheckFailure(
        "connection_leak() returned a finding without the evidence that supports it.",
        expected="evidence: a non-empty list of str, one naming the leaking path",
        actual=f"evidence {listed!r}"[:200],
        evidence=evidence,
        lesson=PROVE,
    )


def test_of_several_leaks_the_aborted_sessions_count_too(learner, database, other_database,
                                                         seed):
    # the run's path: 2 idle in transaction and 3 aborted (5); the inventory job: 4 idle in
    # transaction (and 3 idle, more sessions in all). Counted in both states the run's path
    # leaks more; in either state alone, or by sessions, the job looks worse.
    with pool_run(database, other_database, seed, leak=True, leaked=5, failed=3,
                  job=AHEAD_ON_IDLE, job_idle=3) as run:
        found = _leak_of(learner, run)
        evidence = run.evidence()
    got = field_of(found, "application_name") if found is not None else None
    leaked = field_of(found, "leaked") if found is not None else None
    if got == run.roles.leaking and leaked == 5:
        return
    fix = None
    if got == LONE_JOB:
        fix = ("Compare the leaking paths by both states counted together, as `leaked` "
               f"counts them: {LONE_JOB} has {AHEAD_ON_IDLE} sessions idle in transaction "
               "(its idle ones are back in their pool), the other path 2 idle in transaction "
               f"and 3 aborted, 5 forgotten connections: {run.roles.leaking}.")
    raise CheckFailure(
        "connection_leak() did not name the path with the most forgotten connections when "
        "some of them were aborted.",
        expected=f"application_name {run.roles.leaking!r}, leaked 5",
        actual="None" if found is None else f"application_name {got!r}, leaked {leaked!r}",
        evidence=evidence,
        lesson=POOLS,
        fix=fix,
    )


_SESSIONS = text("SELECT pid, coalesce(application_name, '') AS name, state, "
                 "now() - xact_start AS open_for FROM pg_stat_activity "
                 "WHERE datname = current_database() AND pid <> pg_backend_pid()")


def test_the_toolkit_leaves_no_transaction_open(learner, database):
    # a session connection_leak() leaves idle in transaction is a forgotten connection of
    # its own, counted by the next look, which inside that transaction sees a frozen view
    observer = database.make_admin_engine()
    sources = Sources("", "", [], datetime.now(UTC), database_url=database.url)
    with observer.connect() as conn:
        before = {row.pid for row in conn.execute(_SESSIONS)}
    found = call(learner.module("triage").connection_leak, sources)
    with observer.connect() as conn:
        left = [(row.pid, row.name or "(no name)", row.state, str(row.open_for))
                for row in conn.execute(_SESSIONS) if row.pid not in before
                and (row.state or "").startswith("idle in transaction")]
    observer.dispose()
    evidence = (f"a quiet shop: no path holds a connection; connection_leak() answered "
                f"{'None' if found is None else repr(field_of(found, 'application_name'))}")
    if not left:
        return
    raise CheckFailure(
        "connection_leak() left a session of its own idle in transaction.",
        expected="every session connection_leak() opened closed, or back in a pool outside "
                 "a transaction, when it returns",
        actual="; ".join(f"pid {pid} of {name}: {state}" for pid, name, state, _ in left),
        evidence=evidence + "\n"
        + table(left, ("pid", "application_name", "state", "transaction open for")),
        lesson=POOLS,
        fix=("A connection left open when the function returns (kept at module level for "
             "the next call, say) stays in the transaction its first statement began: one "
             "more forgotten connection, and "
             "within one transaction pg_stat_activity does not change, so the next look sees "
             "the first. Connect per call and close it (with engine.connect() as conn: ...)."),
    )
