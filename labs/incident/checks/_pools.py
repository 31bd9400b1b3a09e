"""Stage pools: the shop's code paths holding connections, one of them leaking.

Each path of the shop connects as the shop's role with its own application_name, through a
pool of its own, and runs its real statement. In a run with a leak, one path checks out a
connection per request and never gives it back (its transaction stays open: idle in
transaction); another path's pool is warm (connections returned, idle); a third is busy
(statements running, active). Which path leaks, and which is warm or busy, depends on the run:
replay it with DOJO_INCIDENT_RUN. Meanwhile the shop's role leaks more connections in another
database of the server, and the healthy run has a job with two sessions idle in transaction
between statements and two paths with one forgotten connection each (4 in the shop, but not
yet a pile on any path: a path leaks from 3 on).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from _live import SCHEMA
from _support import Sources
from sqlalchemy import Connection, Engine, text

from dojo.checks import table

# the shop's code paths, as their connections name themselves, and the statement each runs
PATHS = {
    "orders-api/place-order": "SELECT qty FROM stock WHERE sku = 'sku-2203'",
    "orders-api/list-orders": "SELECT id, qty FROM orders ORDER BY id DESC LIMIT 5",
    "payments/refund": "SELECT count(*) FROM payments WHERE kind LIKE 'refund%'",
}
LEAKED = 5          # connections the leaking path never returned
WARM = 8            # idle connections of the warm pool
BUSY = 7            # statements the busy path is running
HEALTHY_IDLE = 2    # the leaking path's pool in the healthy run: returned, idle
LONE_JOB = "inventory-sync"
JOB_SESSIONS = 2    # its sessions idle in transaction between statements: under the 3
SMALLER_LEAK = 3    # the job's sessions when it leaks too, less than the leaking path
SMALLER_LEAK_IDLE = 4  # and its pool's idle ones then: more sessions in all than the leaker's
AHEAD_ON_IDLE = 4   # the job's sessions idle in transaction against 2 + 3 aborted of the leaker
ELSEWHERE = "reports/export"
ELSEWHERE_LEAKED = 7
BUSY_SQL = "SELECT pg_sleep(60)"

COUNT_SQL = text("""
    SELECT coalesce(application_name, '') AS path, coalesce(state, '') AS state,
           count(*) AS sessions
      FROM pg_stat_activity WHERE datname = current_database()
     GROUP BY 1, 2
""")


@dataclass(frozen=True)
class Roles:
    """Which path plays which part in this run."""
    leaking: str
    warm: str
    busy: str


def roles_of(seed: int) -> Roles:
    names = list(PATHS)
    n = seed % len(names)
    return Roles(names[n], names[(n + 1) % len(names)], names[(n + 2) % len(names)])


@dataclass
class PoolRun:
    sources: Sources
    roles: Roles
    leak: bool
    seed: int
    expected: dict[str, dict[str, int]]
    observer: Engine
    foreign: Engine | None = None
    job: int = 0
    notes: list[str] = field(default_factory=list)

    def describe(self) -> str:
        if self.leak:
            return (f"{self.roles.leaking} leaks connections (run {self.seed}, replay: "
                    f"DOJO_INCIDENT_RUN={self.seed})")
        return f"no path leaks (run {self.seed})"

    def counts(self, engine: Engine | None = None) -> dict[str, dict[str, int]]:
        return counts(engine or self.observer)

    def evidence(self) -> str:
        parts = [self.describe(), "the shop's database, sessions by application_name and "
                 "state:", _table(self.counts())]
        if self.foreign is not None:
            parts += ["another database on the server (the shop's role works there too):",
                      _table(self.counts(self.foreign))]
        return "\n".join(parts)


def counts(engine: Engine) -> dict[str, dict[str, int]]:
    """Sessions of the engine's database by application_name and state (the observer's own
    session is an admin one, named by no path, and left out of the comparison)."""
    with engine.connect() as conn:
        rows = conn.execute(COUNT_SQL).all()
    found: dict[str, dict[str, int]] = {}
    for row in rows:
        found.setdefault(row.path, {})[row.state] = int(row.sessions)
    return found


def _table(found: dict[str, dict[str, int]]) -> str:
    rows = [(path or "(no name)", state, n) for path, states in sorted(found.items())
            for state, n in sorted(states.items())]
    return table(rows, ("application_name", "state", "sessions"))


def _engine(database: Any, name: str, size: int) -> Engine:
    return database.make_engine(pool_size=size, max_overflow=0,
                                connect_args={"application_name": name})


def _leak(stack: ExitStack, engine: Engine, statement: str, n: int, failed: int = 0) -> None:
    """n requests that check out a connection, run the path's statement and never return it:
    each connection stays in its open transaction (idle in transaction). The last `failed` of
    them hit an error after it and were abandoned on the error path: idle in transaction
    (aborted)."""
    for number in range(n):
        conn = engine.connect()
        stack.callback(conn.close)
        conn.execute(text(statement))
        if number >= n - failed:
            try:
                conn.execute(text("SELECT 1 / (SELECT count(*) FROM stock WHERE qty < 0)"))
            except Exception:  # noqa: BLE001 (the division by zero that aborts it)
                pass


def _warm(engine: Engine, statement: str, n: int) -> None:
    """n concurrent requests that each return their connection: the pool keeps n, idle."""
    held: list[Connection] = [engine.connect() for _ in range(n)]
    for conn in held:
        conn.execute(text(statement)).all()
    for conn in held:
        conn.close()


def _busy(stack: ExitStack, engine: Engine, observer: Engine, name: str, n: int) -> None:
    """n requests running a statement right now (active), cancelled when the check ends."""
    threads = []

    def run() -> None:
        try:
            with engine.connect() as conn:
                conn.execute(text(BUSY_SQL))
        except Exception:  # noqa: BLE001 (cancelled at the end of the check)
            pass

    for _ in range(n):
        threads.append(threading.Thread(target=run, daemon=True))
        threads[-1].start()

    def stop() -> None:
        with observer.connect() as conn:
            conn.execute(text("SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE "
                              "datname = current_database() AND application_name = :a"),
                         {"a": name})
        for thread in threads:
            thread.join(10)

    stack.callback(stop)


def _wait_for(observer: Engine, expected: dict[str, dict[str, int]]) -> None:
    """A barrier on pg_stat_activity: until every path shows exactly the sessions expected."""
    deadline = time.monotonic() + 30
    seen: dict[str, dict[str, int]] = {}
    while time.monotonic() < deadline:
        seen = counts(observer)
        if all(seen.get(path, {}) == states for path, states in expected.items()):
            return
        time.sleep(0.02)
    raise AssertionError(f"the shop's sessions never settled: expected {expected}, "
                         f"PostgreSQL shows {seen}")


@contextmanager
def pool_run(database: Any, other: Any, seed: int, leak: bool, leaked: int = LEAKED,
             failed: int = 1, job: int = 0, job_idle: int = 0) -> Iterator[PoolRun]:
    """The shop's paths holding their connections as the run says, settled (PostgreSQL shows
    exactly the expected sessions) before the learner looks. With a leak, the leaking path
    holds `leaked` forgotten connections, the last `failed` of them aborted. The job holds
    `job` sessions idle in transaction (the healthy run: JOB_SESSIONS) and `job_idle` idle."""
    with database.engine.begin() as conn:
        conn.exec_driver_sql(SCHEMA)
    roles = roles_of(seed)
    observer = database.make_admin_engine()
    foreign_observer = other.make_admin_engine()
    with ExitStack() as stack:
        stack.callback(observer.dispose)
        engines = {name: _engine(database, name, 8) for name in PATHS}
        for engine in engines.values():
            stack.callback(engine.dispose)
        expected: dict[str, dict[str, int]] = {}
        if leak:
            _leak(stack, engines[roles.leaking], PATHS[roles.leaking], leaked, failed=failed)
            _warm(engines[roles.leaking], PATHS[roles.leaking], 1)
            expected[roles.leaking] = {"idle in transaction": leaked - failed, "idle": 1}
            if failed:
                expected[roles.leaking]["idle in transaction (aborted)"] = failed
        else:
            # one forgotten connection here and one on the busy path: with the job's two,
            # 4 in the shop, and no path with 3
            _leak(stack, engines[roles.leaking], PATHS[roles.leaking], 1, failed=1)
            _warm(engines[roles.leaking], PATHS[roles.leaking], HEALTHY_IDLE)
            expected[roles.leaking] = {"idle": HEALTHY_IDLE,
                                       "idle in transaction (aborted)": 1}
            _leak(stack, engines[roles.busy], PATHS[roles.busy], 1)
            expected[roles.busy] = {"idle in transaction": 1}
            job = job or JOB_SESSIONS
        if job:
            jobs = _engine(database, LONE_JOB, job + job_idle)
            stack.callback(jobs.dispose)
            _leak(stack, jobs, "SELECT qty FROM stock WHERE sku = 'sku-1041'", job)
            expected[LONE_JOB] = {"idle in transaction": job}
            if job_idle:
                _warm(jobs, "SELECT qty FROM stock WHERE sku = 'sku-1041'", job_idle)
                expected[LONE_JOB]["idle"] = job_idle
        _warm(engines[roles.warm], PATHS[roles.warm], WARM)
        expected[roles.warm] = {"idle": WARM}
        _busy(stack, engines[roles.busy], observer, roles.busy, BUSY)
        expected.setdefault(roles.busy, {})["active"] = BUSY
        elsewhere = other.make_engine(pool_size=8, max_overflow=0,
                                      connect_args={"application_name": ELSEWHERE})
        stack.callback(elsewhere.dispose)
        _leak(stack, elsewhere, "SELECT count(*) FROM orders", ELSEWHERE_LEAKED)
        _wait_for(observer, expected)
        _wait_for(foreign_observer, {ELSEWHERE: {"idle in transaction": ELSEWHERE_LEAKED}})
        sources = Sources("", "", [], datetime.now(UTC), database_url=database.url)
        yield PoolRun(sources, roles, leak, seed, expected, observer, foreign_observer, job)
