"""Stage slow: the statement a migration made slow, from pg_stat_statements before and after.

The shop's own database, its own role and its own entries in pg_stat_statements (the view is
the server's; the check reads and resets only this database's). Before the change the shop
runs its statements with every index; the check asks for a snapshot (statement_stats), the
migration drops one index, the shop runs the same statements again, and slow_query() must
find the one whose calls got slower: not the report that was always slow, not the cheap
query that is called so often that it spends the most time in total, not the export that
regressed by a smaller factor while adding more milliseconds per call, not the rare statement
called too seldom before the change to count; and with the calls of both of its rows (the
shop also runs it inside a function). Then the check creates the index the finding proposes
and measures the statement again.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pytest
from _slow import (
    CALLS,
    EXPORT,
    FREQUENT,
    RARE,
    REPORT,
    STEADY_TRIES,
    Period,
    Regression,
    ensure_pg_stat_statements,
    evicted,
    find,
    generic_plan,
    nested_first,
    nested_function,
    nested_row_first,
    periods,
    regressed_by_the_readme,
    regression_of,
    reset_own_statements,
    reset_statement,
    run_second,
    run_workload,
    schema,
    second_regression,
    stats,
    track_nested,
)
from _support import PROVE, SLOW, Sources, field_of
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from dojo.checks import CheckFailure, call, table
from dojo.checks.database import create_database, drop_database

pytestmark = pytest.mark.stage("slow")

MEAN_TOLERANCE = 0.10      # of the check's own mean, plus MEAN_SLACK_MS
MEAN_SLACK_MS = 0.05
FASTER = 5                 # the index must make the statement at least this much faster
RERUNS = 10


@dataclass
class SlowRun:
    regression: Regression
    sources: Sources
    periods: dict[int, Period]
    regressed: Period
    report: Period
    frequent: Period
    export: Period
    rare: Period
    changed: bool
    seed: int

    def describe(self) -> str:
        what = (f"{self.regression.change} (run {self.seed}, replay: "
                f"DOJO_INCIDENT_RUN={self.seed})" if self.changed
                else f"no change (run {self.seed})")
        return what

    def evidence(self) -> str:
        rows = [(p.queryid, p.query[:70], p.calls_before, f"{p.mean_before:.3f}",
                 p.calls_after, f"{p.mean_after:.3f}", f"{p.total_after:.1f}")
                for p in sorted(self.periods.values(), key=lambda p: p.query)
                if p.calls_before + p.calls_after >= 5]
        return (self.describe() + "\n" + table(rows, (
            "queryid", "query", "calls before", "mean ms before", "calls after",
            "mean ms after", "total ms after")))


@dataclass
class Second:
    """The second migration: its regression, its statement's periods, how many statements the
    shop had at its snapshot and how many of them had taken more time than its statement."""
    regression: Regression
    regressed: Period
    statements: int
    dearer: int
    periods: dict[int, Period]
    seed: int

    def evidence(self) -> str:
        rows = [(p.queryid, p.query[:70], p.calls_before, f"{p.mean_before:.3f}",
                 p.calls_after, f"{p.mean_after:.3f}")
                for p in sorted(self.periods.values(), key=lambda p: p.query)
                if p.calls_after > 0]
        return (f"{self.regression.change}, after the first migration (run {self.seed}, "
                f"replay: DOJO_INCIDENT_RUN={self.seed})\n" + table(rows, (
                    "queryid", "query", "calls before", "mean ms before", "calls after",
                    "mean ms after")))


class Scenario:
    """The shop's statements in one database of the check's own, built once when a check
    first asks for it (the workload takes seconds; every check reads the same periods):

    1. the shop runs its statements with every index; the learner takes a snapshot;
    2. it runs the same statements again, nothing changed: slow_query() against that first
       snapshot is the healthy answer;
    3. the learner takes a second snapshot; the migration drops the run's index; the shop
       runs its statements again: slow_query() against the second snapshot must find the
       statement that got slower.

    Meanwhile the shop's role runs a statement in another database of the server that gets
    far slower after the change. A learner error while the scenario is built (a stub not
    written yet) is given to every check that asks for what it would have produced."""

    def __init__(self, services: Any, seed: int) -> None:
        self.services, self.seed = services, seed
        self.built: tuple[SlowRun, Any, Any] | BaseException | None = None
        self.healthy: tuple[SlowRun, Any] | BaseException | None = None
        self.database: Any = None
        self.other: Any = None
        self.foreign: set[int] = set()
        self.second: tuple[Second, Any] | BaseException | None = None

    def changed(self, learner: Any) -> tuple[SlowRun, Any, Any]:
        """(the run, the learner's snapshot at the change, the database)."""
        self._build(learner)
        if isinstance(self.built, BaseException):
            raise self.built
        assert self.built is not None
        return self.built

    def steady(self, learner: Any) -> tuple[SlowRun, Any]:
        """(the run of the period without a change, slow_query()'s answer for it)."""
        self._build(learner)
        if isinstance(self.healthy, BaseException):
            raise self.healthy
        assert self.healthy is not None
        return self.healthy

    def _build(self, learner: Any) -> None:
        if self.built is not None:
            return
        try:
            self.built = self._run(learner)
        except BaseException as exc:
            self.built = exc
            if self.healthy is None:
                self.healthy = exc
            raise

    def _snapshot(self, learner: Any, sources: Sources) -> Any:
        return call(learner.module("triage").statement_stats, sources)

    def _run(self, learner: Any) -> tuple[SlowRun, Any, Any]:
        database = self.database = create_database(self.services, hint="slow")
        admin = database.make_admin_engine()
        ensure_pg_stat_statements(admin)
        regression = regression_of(self.seed)
        with database.engine.begin() as conn:
            conn.exec_driver_sql(schema(regression))
            conn.exec_driver_sql(nested_function(regression))
        # the shop's session counts its nested statements; no session started later does
        track_nested(admin, database.name, True)
        shop = database.make_engine(pool_size=1).connect().execution_options(
            isolation_level="AUTOCOMMIT")
        track_nested(admin, database.name, False)
        database.engine.dispose()
        rng = random.Random(f"{self.seed}/slow")
        # the variant of the statement whose nested row the view lists first
        regression = nested_first(shop, admin, regression, rng)
        sources = Sources("", "", [], datetime.now(UTC), database_url=database.url)
        reset_own_statements(admin, database.role)
        other = self._other_database(database)

        run_workload(shop, regression, rng, 0)
        self._elsewhere(other, 0)
        for attempt in range(STEADY_TRIES):
            first = self._snapshot(learner, sources)
            then = stats(admin, database.role)
            # played again, the period leaves the rare statement out: a third call before the
            # change would make it count (README: at least 3 calls in each period), and its
            # factor would then rightly beat the regressed statement's
            run_workload(shop, regression, rng, 0, steady=True, rare=attempt == 0)
            now = stats(admin, database.role)
            # a busy machine can stall a cheap statement long enough to meet the README's
            # rule: that period would not be steady, so it is played again
            noisy = [p for p in periods(then, now).values() if regressed_by_the_readme(p)]
            if not noisy:
                break
        else:
            raise RuntimeError(
                f"run {self.seed}: {STEADY_TRIES} periods without a change each showed a "
                f"statement slowed down on its own ({noisy[0].query[:60]}: "
                f"{noisy[0].mean_before:.3f} ms to {noisy[0].mean_after:.3f} ms); the machine "
                "may be too loaded. Run the check again.")
        steady = self._describe(regression, sources, periods(then, now), now, False)
        try:
            self.healthy = (steady, call(learner.module("triage").slow_query, sources, first))
        except Exception as exc:  # noqa: BLE001 (given to the check that asks for it)
            self.healthy = exc

        before = self._snapshot(learner, sources)
        then = stats(admin, database.role)
        with database.engine.begin() as conn:
            conn.execute(text(f"DROP INDEX {regression.index}"))
        run_workload(shop, regression, rng, 1)
        shop.close()
        self._elsewhere(other, 1)
        now = stats(admin, database.role)
        self.foreign = set(stats(self.other.make_admin_engine(), database.role))
        return (self._describe(regression, sources, periods(then, now), now, True), before,
                database)

    def later(self, learner: Any) -> tuple[Second, Any]:
        """A second migration, after the first one's checks: a snapshot (statement_stats),
        the other index dropped, its statement run 3 times; (what happened, slow_query()'s
        answer). Its statement ran 3 times before the first snapshot and not since: exactly
        3 calls in each period, and before this snapshot less time than most of the shop's
        statements."""
        run, _, database = self.changed(learner)
        if isinstance(self.second, BaseException):
            raise self.second
        if self.second is not None:
            return self.second
        try:
            self.second = self._later(learner, run, database)
        except BaseException as exc:
            self.second = exc
            raise
        return self.second

    def _later(self, learner: Any, run: SlowRun, database: Any) -> tuple[Second, Any]:
        admin = database.make_admin_engine()
        second = second_regression(run.regression)
        sources = Sources("", "", [], datetime.now(UTC), database_url=database.url)
        before = self._snapshot(learner, sources)
        then = stats(admin, database.role)
        with database.engine.connect().execution_options(
                isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text(f"DROP INDEX {second.index}"))
            run_second(conn, run.regression, random.Random(f"{self.seed}/slow/second"))
        now = stats(admin, database.role)
        both = periods(then, now)
        regressed = both[find(now, second.statement).queryid]
        if regressed.queryid not in then:
            raise RuntimeError(evicted(admin, second.statement))
        cheaper = sum(1 for stat in then.values()
                      if stat.queryid != regressed.queryid and stat.total_ms > (
                          then[regressed.queryid].total_ms))
        found = call(learner.module("triage").slow_query, sources, before)
        return Second(second, regressed, len(then), cheaper, both, self.seed), found

    def _describe(self, regression: Regression, sources: Sources, both: dict[int, Period],
                  now: dict[int, Any], changed: bool) -> SlowRun:
        return SlowRun(regression, sources, both, both[find(now, regression.statement).queryid],
                       both[find(now, REPORT).queryid], both[find(now, FREQUENT).queryid],
                       both[find(now, EXPORT).queryid], both[find(now, RARE).queryid],
                       changed, self.seed)

    def _other_database(self, database: Any) -> Any:
        """Another database on the server where the shop's role works too: its statements
        are in the same pg_stat_statements, under another dbid. Returns an engine there as
        the shop's role."""
        self.other = create_database(self.services, hint="elsewhere")
        ensure_pg_stat_statements(self.other.make_admin_engine())
        if database.role:
            with self.other.make_admin_engine().begin() as conn:
                conn.exec_driver_sql(f'GRANT CONNECT ON DATABASE "{self.other.name}" TO '
                                     f'"{database.role}"')
        url = make_url(database.url).set(database=self.other.name)
        engine = create_engine(url)
        self.other._engines.append(engine)      # disposed when the database is dropped
        return engine

    def _elsewhere(self, engine: Any, period: int) -> None:
        """In the other database, a statement that gets far slower after the change (a
        sleep of 0 ms, then of 60 ms)."""
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            for _ in range(4):
                conn.execute(text("SELECT pg_sleep(:s)"), {"s": 0.06 * period})

    def close(self) -> None:
        for database in (self.other, self.database):   # the grant to the role first
            if database is not None:
                drop_database(self.services, database)


@pytest.fixture(scope="module")
def scenario(services: Any, seed: int) -> Iterator[Scenario]:
    built = Scenario(services, seed)
    try:
        yield built
    finally:
        built.close()


def _nested_text(run: SlowRun) -> str:
    """The text pg_stat_statements shows for the regressed statement's nested row: the
    function's own, its parameter the variable `v`."""
    return run.regression.statement.replace(":v", "v")


NESTED_FIX = ("The statement's queryid has two rows, the toplevel one and the one run inside "
              "a function, whose text has the function's variable (`= v`) where the toplevel "
              "one has $1: EXPLAIN cannot run it. Which row the view lists first is no rule; "
              "take the text of the row whose toplevel is true.")


def _slow_query(learner: Any, run: SlowRun, before: Any) -> Any:
    if run.changed:
        # the statement's nested row first in the view, and first in a grouped fold of it
        nested_row_first(run.sources.database_url, run.regressed.queryid)
    try:
        return call(learner.module("triage").slow_query, run.sources, before)
    except Exception as exc:
        # EXPLAIN of the nested row's text: the observation names the mistake
        if _nested_text(run) not in str(exc):
            raise
        raise CheckFailure(
            "slow_query() ran EXPLAIN on the text of the statement's nested row.",
            expected=f"EXPLAIN (GENERIC_PLAN) {run.regressed.query} (the toplevel row's text)",
            actual=f"{type(exc).__name__}: {str(exc).splitlines()[0]}"[:300],
            evidence=run.evidence(),
            lesson=SLOW,
            fix=NESTED_FIX,
        ) from exc


def _close(got: Any, want: float) -> bool:
    return isinstance(got, int | float) and abs(got - want) <= MEAN_TOLERANCE * want + (
        MEAN_SLACK_MS)


def test_the_statement_that_got_slower(learner, scenario):
    run, before, _ = scenario.changed(learner)
    found = _slow_query(learner, run, before)
    want = run.regressed
    got = field_of(found, "queryid") if found is not None else None
    wrong: list[tuple[str, str, str]] = []
    if got != want.queryid:
        wrong.append(("queryid", f"{want.queryid} ({want.query})",
                      "None" if found is None else f"{got} ({run.periods[got].query})"
                      if got in run.periods else repr(got)))
    else:
        for name, value in (("calls_before", want.calls_before),
                            ("calls_after", want.calls_after)):
            if field_of(found, name) != value:
                wrong.append((name, str(value), repr(field_of(found, name))))
        for name, mean in (("mean_ms_before", want.mean_before),
                           ("mean_ms_after", want.mean_after)):
            if not _close(field_of(found, name), mean):
                wrong.append((name, f"{mean:.3f} (±{MEAN_TOLERANCE:.0%})",
                              repr(field_of(found, name))))
    if not wrong:
        return
    fix = None
    if got == run.report.queryid:
        fix = (f"That report has the highest mean of all ({run.report.mean_overall:.1f} ms), "
               f"but it was as slow before the change ({run.report.mean_before:.1f} ms) as "
               f"after ({run.report.mean_after:.1f} ms): pg_stat_statements adds up since its "
               "last reset. Compare each statement's mean before the change (the snapshot) "
               "with its mean after it (the difference of the two snapshots).")
    elif got == run.export.queryid:
        fix = (f"That statement regressed too, but by less: {run.export.mean_before:.1f} ms "
               f"before, {run.export.mean_after:.1f} ms after "
               f"({run.export.factor:.0f} x), while the statement the change made slow went "
               f"from {want.mean_before:.3f} ms to {want.mean_after:.3f} ms "
               f"({want.factor:.0f} x). It added more milliseconds per call; report the mean "
               "that grew by the largest factor (after / before), not by the most ms.")
    elif got == run.rare.queryid:
        fix = ("That statement was called fewer than 3 times before the change: a mean of "
               "so few calls is no baseline. A statement regressed only "
               "when it was called at least 3 times in each period, before as well as after.")
    elif got == want.queryid and any(name.startswith("calls") for name, _, _ in wrong):
        fix = ("pg_stat_statements holds this statement in more than one row: the shop runs "
               f"it on its own and, {CALLS['nested'][1]} times a period, inside a function "
               "(a row with toplevel false); another role would add a row too. Rows with the "
               "same queryid add up: sum their calls and total_exec_time.")
    elif got == run.frequent.queryid:
        fix = (f"That statement's total time grew the most: it was called "
               f"{run.frequent.calls_before} times before the change and "
               f"{run.frequent.calls_after} times after, but each call took "
               f"{run.frequent.mean_before:.3f} ms before and {run.frequent.mean_after:.3f} ms "
               "after. Total time grows with traffic; a regression is a higher mean per "
               "call: total / calls of each period.")
    raise CheckFailure(
        "slow_query() did not name the statement the change made slower.",
        expected="; ".join(f"{name} {w}" for name, w, _ in wrong),
        actual="; ".join(f"{name} {g}" for name, _, g in wrong),
        evidence=run.evidence(),
        lesson=SLOW,
        fix=fix,
    )


def test_the_plan_shows_the_sequential_scan(learner, scenario):
    run, before, database = scenario.changed(learner)
    found = _slow_query(learner, run, before)
    plan = field_of(found, "plan") if found is not None else None
    scan = f"Seq Scan on {run.regression.table}"
    if isinstance(plan, str) and scan in plan:
        return
    nested = found is not None and field_of(found, "query") == _nested_text(run)
    raise CheckFailure(
        "slow_query() did not show the plan that makes the statement slow.",
        expected=f"plan: the statement's EXPLAIN, with '{scan}'",
        actual=f"plan {plan!r}"[:300],
        evidence=run.evidence() + "\nEXPLAIN (GENERIC_PLAN) of the statement:\n"
        + generic_plan(database.engine, run.regressed.query),
        lesson=SLOW,
        fix=NESTED_FIX if nested else None,
    )


def _sub_millisecond(period: Period) -> bool:
    """Its mean grew 3 x or more, but by less than 1 ms."""
    return (period.calls_before > 0 and period.calls_after > 0
            and period.mean_after >= 3 * period.mean_before
            and period.mean_after - period.mean_before < 1.0)


def test_no_slow_query_without_a_change(learner, scenario):
    run, found = scenario.steady(learner)
    if found is None:
        return
    got = field_of(found, "queryid")
    if got in run.periods and regressed_by_the_readme(run.periods[got]):
        # a busy machine stalled a cheap statement long enough to meet the README's rule:
        # the answer is right for the view the learner read, and the run shows nothing
        grew = run.periods[got]
        raise RuntimeError(
            f"run {run.seed}: in the period without a change, statement {got} slowed "
            f"down on its own ({grew.mean_before:.3f} ms to {grew.mean_after:.3f} ms over "
            f"{grew.calls_after} calls), enough to count as a regression; the machine may be "
            "too loaded. Run the check again.")
    fix = None
    if got == run.report.queryid:
        fix = ("That report is slow, but as slow as it always was: only a mean that grew "
               "after the change is a regression.")
    elif got in run.periods and _sub_millisecond(run.periods[got]):
        # the jitter statement, or another sub-millisecond one a busy machine slowed down
        # (the frequent one too: its mean growing 3 x is then what made it count)
        grew = run.periods[got]
        fix = (f"That statement's mean grew from {grew.mean_before:.3f} ms to "
               f"{grew.mean_after:.3f} ms: {grew.factor:.0f} x, but not even 1 ms more. A "
               "regression is a mean at least 3 x and at least 1 ms above its mean before: "
               "both conditions.")
    elif got == run.frequent.queryid:
        fix = ("That statement's total time grew because it was called more often, not "
               "because its calls got slower: compare means per call.")
    raise CheckFailure(
        "slow_query() reported a slow statement although nothing changed.",
        expected="None (no statement's mean grew 3 x and by 1 ms or more)",
        actual=f"queryid {got} "
               + (f"({run.periods[got].query})" if got in run.periods else ""),
        evidence=run.evidence(),
        lesson=SLOW,
        fix=fix,
    )


def test_the_slow_query_finding_carries_its_evidence(learner, scenario):
    run, before, _ = scenario.changed(learner)
    found = _slow_query(learner, run, before)
    listed = field_of(found, "evidence") if found is not None else None
    if (isinstance(listed, list) and listed and all(isinstance(e, str) for e in listed)
            and any(str(run.regressed.queryid) in e for e in listed)):
        return
    raise CheckFailure(
        "slow_query() returned a finding without the evidence that supports it.",
        expected="evidence: a non-empty list of str, one naming the statement's queryid",
        actual=f"evidence {listed!r}"[:200],
        evidence=run.evidence(),
        lesson=PROVE,
    )


def test_only_the_shops_statements_count(learner, scenario):
    run, before, _ = scenario.changed(learner)
    found = _slow_query(learner, run, before)
    got = field_of(found, "queryid") if found is not None else None
    if got not in scenario.foreign:
        return
    raise CheckFailure(
        "slow_query() named a statement of another database.",
        expected=f"a statement of the shop's database: queryid {run.regressed.queryid} "
                 f"({run.regressed.query})",
        actual=f"queryid {got}, a statement the shop's role ran in another database on the "
               "server",
        evidence=run.evidence(),
        lesson=SLOW,
        fix=("pg_stat_statements holds the statements of every database on the server: keep "
             "the rows whose dbid is the current database's oid (SELECT oid FROM pg_database "
             "WHERE datname = current_database())."),
    )


def test_the_proposed_index_makes_it_fast(learner, scenario):
    # last in this module: it creates the index in the scenario's database
    run, before, database = scenario.changed(learner)
    found = _slow_query(learner, run, before)
    index = field_of(found, "index") if found is not None else None
    regression = run.regression
    name = r'(\w+|"[^"]+")'             # an identifier, bare or quoted
    shape = re.compile(rf"^\s*CREATE\s+(UNIQUE\s+)?INDEX\s+(CONCURRENTLY\s+)?"
                       rf"(IF\s+NOT\s+EXISTS\s+)?({name}\s+)?ON\s+(ONLY\s+)?"
                       rf"((public|\"public\")\.)?(\"{regression.table}\"|{regression.table}\b)"
                       rf"[^;]*;?\s*$", re.IGNORECASE)
    if not isinstance(index, str) or not shape.match(index):
        raise CheckFailure(
            "slow_query() proposed no index the check can create.",
            expected=f"index: one CREATE INDEX statement on {regression.table}",
            actual=f"index {index!r}"[:300],
            evidence=run.evidence(),
            lesson=SLOW,
        )
    with database.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql(index)
        conn.exec_driver_sql(f"ANALYZE {regression.table}")
    plan = generic_plan(database.engine, run.regressed.query)
    admin = database.make_admin_engine()
    reset_statement(admin, database.role, run.regressed.queryid)
    rng = random.Random(f"{run.seed}/slow/index")
    with database.engine.connect() as conn:
        for _ in range(RERUNS):
            conn.execute(text(regression.statement), {"v": regression.value(rng)}).all()
            conn.commit()
    now = stats(admin, database.role).get(run.regressed.queryid)
    mean = now.mean_ms if now is not None else float("inf")
    scans = f"Seq Scan on {regression.table}" in plan
    if not scans and mean * FASTER <= run.regressed.mean_after:
        return
    fix = None
    if scans:
        fix = (f"With that index the plan still reads all of {regression.table}: an index "
               "serves a filter only when the filtered column leads it. Index the column the "
               f"plan's Filter compares ({regression.column}).")
    raise CheckFailure(
        "The index slow_query() proposed did not make the statement fast again.",
        expected=f"a plan without 'Seq Scan on {regression.table}', and a mean at most "
                 f"1/{FASTER} of {run.regressed.mean_after:.2f} ms",
        actual=f"mean {mean:.2f} ms over {RERUNS} calls with {index.strip()!r}",
        evidence=run.evidence() + "\nEXPLAIN (GENERIC_PLAN) with the index:\n" + plan,
        lesson=SLOW,
        fix=fix,
    )


def test_a_statement_called_three_times_each_side_counts(learner, scenario):
    # after the index check: a second migration in the same database
    second, found = scenario.later(learner)
    want = second.regressed
    got = field_of(found, "queryid") if found is not None else None
    if got == want.queryid:
        return
    raise CheckFailure(
        "slow_query() missed a statement called exactly 3 times in each period that "
        "regressed, whose time before the snapshot was less than most statements' time.",
        expected=f"queryid {want.queryid} ({want.query}): {want.calls_before} calls before, "
                 f"{want.calls_after} after, mean {want.mean_before:.3f} ms then "
                 f"{want.mean_after:.3f} ms; before the snapshot {second.dearer} of the "
                 f"shop's {second.statements} statements had taken more time in all",
        actual="None" if found is None else f"queryid {got}"
               + (f" ({second.periods[got].query})" if got in second.periods else ""),
        evidence=second.evidence(),
        lesson=SLOW,
    )
