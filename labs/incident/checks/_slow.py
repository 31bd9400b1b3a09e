"""Stage slow: the shop's statements before and after a migration lost an index.

The shop's database gets tables with enough rows that a lost index shows (a sequential scan
of 60 000 rows against an index lookup of a few), pg_stat_statements in that database only,
and a workload the shop's own role runs: the statement the migration slows down (also run
inside a function, so that its queryid has two rows: toplevel and nested), a report that is
slow before and after (the highest mean of all, and no regression), a cheap query called a
hundred times as often after the change (its total time grows the most), an export that
regresses by a smaller factor but adds far more milliseconds per call, and a rare statement
called only twice before the change whose mean grows by the largest factor of all. Which
index the migration loses depends on the run: replay a run with DOJO_INCIDENT_RUN.
"""

from __future__ import annotations

import dataclasses
import itertools
import random
import re
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.pool import NullPool

from dojo.checks.plugin import NeedsBackend

ROWS = 60_000
USERS = 900

SLOW_SCHEMA = f"""
CREATE TABLE stock (sku text PRIMARY KEY, qty integer NOT NULL);
CREATE TABLE orders (id bigserial PRIMARY KEY, user_id text NOT NULL, sku text NOT NULL,
                     qty integer NOT NULL, created_at timestamptz NOT NULL DEFAULT now());
CREATE TABLE payments (id bigserial PRIMARY KEY, order_id bigint, amount_cents integer NOT NULL,
                       kind text NOT NULL);
INSERT INTO stock SELECT 'sku-' || (1000 + n), 500 FROM generate_series(1, 50) AS n;
INSERT INTO orders (user_id, sku, qty, created_at)
     SELECT 'u-' || (100 + mod(n, {USERS})), 'sku-' || (1001 + mod(n, 50)), 1 + mod(n, 3),
            now() - mod(n, 43200) * interval '1 minute'
       FROM generate_series(1, {ROWS}) AS n;
INSERT INTO payments (order_id, amount_cents, kind)
     SELECT n, 1999, 'charge' FROM generate_series(1, {ROWS}) AS n;
CREATE INDEX orders_created_at_idx ON orders (created_at);
CREATE INDEX orders_user_id_idx ON orders (user_id);
CREATE INDEX payments_order_id_idx ON payments (order_id);
ANALYZE stock, orders, payments;
"""


@dataclass(frozen=True)
class Regression:
    """One way the migration breaks the shop: the index it drops and the statement that
    needed it."""
    table: str
    column: str
    index: str
    statement: str           # as the shop runs it, with :v for its parameter
    change: str              # the change log's description of the migration

    def value(self, rng: random.Random) -> Any:
        if self.column == "user_id":
            return f"u-{rng.randint(100, 100 + USERS - 1)}"
        # always above 32767: psycopg sends a smaller int as int2, and pg_stat_statements
        # would count the same statement under a second queryid
        return rng.randint(40_000, ROWS)


REGRESSIONS = (
    Regression("orders", "user_id", "orders_user_id_idx",
               "SELECT id, sku, qty FROM orders WHERE user_id = :v",
               "migration 0042: orders indexes rebuilt for the new partitioning, "
               "orders_user_id_idx left out"),
    Regression("payments", "order_id", "payments_order_id_idx",
               "SELECT amount_cents, kind FROM payments WHERE order_id = :v",
               "migration 0043: payments.order_id changed to bigint, its index dropped and "
               "not recreated"),
)

# the report also waits 60 ms, once a call, on something outside the database (a CTE is
# evaluated once): the highest mean of all, above the export's and the rare statement's
# means since the reset
REPORT = ("WITH wait AS MATERIALIZED (SELECT pg_sleep(0.06)) "
          "SELECT sku, count(*), sum(qty) FROM orders, wait GROUP BY sku ORDER BY sku")
FREQUENT = "SELECT count(*) FROM orders WHERE created_at >= now() - make_interval(mins => :m)"
LOOKUP = "SELECT qty FROM stock WHERE sku = :v"

# A batch export that waits on its sink: 20 ms a call before the change, 80 ms after. It
# regressed (4 x, +60 ms), by a smaller factor than the statement that lost its index (a
# sequential scan against an index lookup: tens of x, a few ms more): ranked by milliseconds
# added it would win, ranked by factor it does not.
EXPORT = "SELECT count(*) FROM stock, pg_sleep(:s)"
EXPORT_SLEEP = (0.02, 0.08)
# A rare statement: called once per period before the change (twice in all before it, as the
# before period runs twice), three times after. Its mean grows from a no-op to 50 ms, a
# larger factor than any other statement's; but 2 calls before are too few to count.
RARE = "SELECT qty, pg_sleep(:s) FROM stock WHERE sku = :v"
RARE_SLEEP = (0.0, 0.05)
# The regressed statement as the shop also runs it inside a function (dynamic SQL): the same
# queryid, in a second row of pg_stat_statements (toplevel false, with
# pg_stat_statements.track = 'all' in the shop's database).
NESTED = "SELECT shop_nested(:v)"

# calls of each statement per period: (before the change, after it). The frequent query is
# called 100 times as often after the change as before (a new page polls it): its total time
# grows more than any other statement's, while each call costs what it did.
CALLS = {"regressed": (40, 4), "nested": (3, 3), "report": (4, 4), "frequent": (3, 300),
         "lookup": (20, 20), "export": (3, 3), "rare": (1, 3)}
# The second migration's statement: exactly 3 calls in each of its periods (the README's
# "at least 3" includes 3).
SECOND_CALLS = 3
# The shop's many small statements (a back office's pages), run once after the first
# migration (not in the first snapshot: the first regression's statement stays among the
# shop's dearest there), each waiting 2 ms: at the second migration's snapshot more
# statements than a "top 20 by total time" keeps, each with more time than the second
# migration's statement had taken (3 index lookups). Distinct statements by their number of
# columns.
FILLERS = tuple("SELECT pg_sleep(0.002)" + ", :c" * n for n in range(1, 35))
# A statement far under a millisecond whose mean grows more than 3 x in the period with no
# change (the rows it counts grew): 3 x, but not 1 ms more, so no regression.
JITTER = ("SELECT count(*) FROM generate_series(1, CAST(:n AS integer)) AS g "
          "WHERE g % 7 = CAST(:r AS integer)")
JITTER_CALLS = 30
STEADY_TRIES = 3             # periods without a change played before one shows nothing
JITTER_ROWS = (7, 1500)      # the first run before the change, the second (the steady period)


def schema(regression: Regression) -> str:
    """The tables and rows of the run (the same for every regression: the other one is the
    second migration, see `second_regression`)."""
    return SLOW_SCHEMA


def nested_function(regression: Regression) -> str:
    """shop_nested(v): the run's regressed statement as static SQL in PL/pgSQL (PERFORM),
    its parameter the function's variable `v`, of the type the shop's driver sends (text, or
    int4 for the order ids it uses): pg_stat_statements counts it under the statement's own
    queryid, as a nested row whose text is the function's (`... = v`), which EXPLAIN cannot
    run. The function first waits 2 ms (its callers' own work): the call that wraps the
    statement slows down by a far smaller factor than the statement itself."""
    kind = "text" if regression.column == "user_id" else "integer"
    body = regression.statement.replace("SELECT ", "PERFORM ", 1).replace(":v", "v")
    return (f"CREATE OR REPLACE FUNCTION shop_nested(v {kind}) RETURNS void LANGUAGE plpgsql "
            f"AS $f$ BEGIN PERFORM pg_sleep(0.002); {body}; END $f$")


# the columns a variant of a regressed statement may select (see nested_first)
VARIANT_COLUMNS = {"orders": ("id", "sku", "qty", "created_at"),
                   "payments": ("id", "amount_cents", "kind", "order_id")}
VARIANTS = 12


def _variants(regression: Regression) -> list[Regression]:
    """The regression as the run found it first, then the same statement selecting other
    columns (another queryid each; the same filter, the same lost index)."""
    found = [regression]
    for columns in itertools.permutations(VARIANT_COLUMNS[regression.table], 3):
        statement = (f"SELECT {', '.join(columns)} FROM {regression.table} "
                     f"WHERE {regression.column} = :v")
        if statement != regression.statement and len(found) < VARIANTS:
            found.append(dataclasses.replace(regression, statement=statement))
    return found


def nested_first(shop: Connection, admin: Engine, regression: Regression,
                 rng: random.Random) -> Regression:
    """The regression (a variant of it) whose nested row pg_stat_statements lists before its
    toplevel row. The view lists its entries in the order of its hash table, which depends on
    the entry's key (role, database, queryid, toplevel), not on which ran first: each
    variant is run once on its own and once through shop_nested() on the shop's session
    (which counts nested statements), and the first whose nested row comes first is kept, so
    that the text of whichever row comes first is the function's. The probe's entries are
    reset with the shop's before the workload runs (an entry's place stays with its key).
    Of 12 variants none comes out nested first once in 4096 runs: then the run's own
    statement is kept."""
    for variant in _variants(regression):
        shop.execute(text(nested_function(variant)))
        shop.execute(text(variant.statement), {"v": variant.value(rng)}).all()
        shop.execute(text(NESTED), {"v": variant.value(rng)}).all()
        prefix = re.split(r":|\d", variant.statement, maxsplit=1)[0]
        with admin.connect() as conn:
            rows = conn.execute(text(
                "SELECT queryid, toplevel, query FROM pg_stat_statements "
                "WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())"
            )).all()
        queryid = next((r.queryid for r in rows if r.toplevel and r.query.startswith(prefix)
                        and r.query.endswith("$1")), None)
        first = next((r for r in rows if r.queryid == queryid), None)
        if first is not None and not first.toplevel:
            return variant
    shop.execute(text(nested_function(regression)))
    return regression


def track_nested(admin: Engine, database: str, on: bool) -> None:
    """pg_stat_statements.track = 'all' (on) or the server's setting (off) for the sessions
    of the check's database that start from now on. The shop's workload session starts while
    it is on: its nested statements get rows of their own (toplevel false); the learner's
    sessions start after it is off, so that an EXPLAIN of a statement adds no row under the
    statement's queryid. A server where the check's admin may not set it (not a superuser)
    counts top-level statements only."""
    try:
        with admin.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.exec_driver_sql(f'ALTER DATABASE "{database}" ' + (
                "SET pg_stat_statements.track = 'all'" if on
                else "RESET pg_stat_statements.track"))
    except DBAPIError:
        pass


# How a toolkit may fold a queryid's rows: as the view lists them, or grouped (GROUP BY
# queryid sorts the rows, and a sort keeps no order among rows of one queryid). Each look
# answers, per queryid, whether its first row is the toplevel one.
_OWN_DB = "dbid = (SELECT oid FROM pg_database WHERE datname = current_database())"
LOOKS = (f"SELECT queryid, toplevel AS first FROM pg_stat_statements WHERE {_OWN_DB}",
         f"SELECT queryid, (array_agg(toplevel))[1] AS first FROM pg_stat_statements "
         f"WHERE {_OWN_DB} AND queryid IS NOT NULL GROUP BY queryid",
         f"SELECT queryid, (array_agg(toplevel))[1] AS first FROM pg_stat_statements "
         f"WHERE {_OWN_DB} GROUP BY queryid")
ARRANGE_TRIES = 40


def nested_row_first(url: str, queryid: int) -> bool:
    """Arrange the view so that, read as the shop's role, the nested row of `queryid` comes
    first however its rows are folded (LOOKS), and say whether that came out. The order the
    view lists its entries in depends on their keys only (nested_first chose a statement
    whose nested row comes first); the order a sort leaves rows of one queryid in depends on
    every row sorted: while a grouped look finds the toplevel row first, the shop's role runs
    one more statement of its own (a row more in the sort, called only after the change:
    no regression) and looks again. Each look runs once before it counts, so that its own
    entry is in the view when it counts, as it is when the toolkit reads the view next (with
    the same statements, already in the view)."""
    engine = create_engine(url, poolclass=NullPool)
    try:
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            for extra in range(ARRANGE_TRIES):
                for look in LOOKS:
                    conn.execute(text(look)).all()
                firsts = [next((r.first for r in conn.execute(text(look)) if r.queryid == queryid),
                               True) for look in LOOKS]
                if not any(firsts):
                    return True
                conn.execute(text("SELECT " + ", ".join(["1"] * (extra + 2)) + " AS arranged"))
    finally:
        engine.dispose()
    return False


def regression_of(seed: int) -> Regression:
    """The index this run's migration loses."""
    return REGRESSIONS[seed % len(REGRESSIONS)]


def second_regression(regression: Regression) -> Regression:
    """The index a second migration loses, later: the other one. Its statement is rare: 3
    calls before the first snapshot, none until the second migration, 3 after it."""
    return next(r for r in REGRESSIONS if r.table != regression.table)


def ensure_pg_stat_statements(admin: Engine) -> None:
    """pg_stat_statements in the check's own database, or needs-backend with the setting to
    add when the server was started without the library."""
    with admin.connect() as conn:
        loaded = conn.execute(text("SHOW shared_preload_libraries")).scalar_one()
    if "pg_stat_statements" not in [name.strip() for name in str(loaded).split(",")]:
        raise NeedsBackend(
            ("pg_stat_statements",), "postgres",
            message=("needs pg_stat_statements: this PostgreSQL server was started without "
                     "it. Add `shared_preload_libraries = 'pg_stat_statements'` to its "
                     "postgresql.conf (or start it with `-c shared_preload_libraries="
                     "pg_stat_statements`) and restart it. The embedded server gets it from "
                     "`dojo services up`; one started by an older dojo needs `dojo services "
                     "down && dojo services up`."))
    with admin.begin() as conn:
        conn.execute(text("CREATE EXTENSION IF NOT EXISTS pg_stat_statements"))


def reset_own_statements(admin: Engine, role: str) -> None:
    """Forget the statements of this database (run by the shop's role) and nothing else:
    pg_stat_statements_reset(userid, dbid, 0) for the check's own database."""
    with admin.begin() as conn:
        conn.execute(text(
            "SELECT pg_stat_statements_reset("
            "(SELECT oid FROM pg_roles WHERE rolname = coalesce(nullif(:r, ''), current_user)),"
            " (SELECT oid FROM pg_database WHERE datname = current_database()), 0)"),
            {"r": role})


def run_workload(conn: Connection, regression: Regression, rng: random.Random, period: int,
                 *, steady: bool = False, rare: bool = True) -> None:
    """One period's statements (0: before the change, 1: after it), as the shop runs them:
    on the shop's session (`conn`, in autocommit), each statement on its own. The first run
    before the change also runs the second migration's statement and the jitter's cheap
    calls, the second run (`steady`) the jitter's dearer ones; the run after the change the
    fillers. `rare=False` leaves the rare statement out (a steady period played again must
    not give it the third call before the change that would make it count)."""
    if period == 0:
        rows = JITTER_ROWS[1 if steady else 0]
        for _ in range(JITTER_CALLS):
            conn.execute(text(JITTER), {"n": rows, "r": rng.randint(1, 6)}).all()
    if period == 0 and not steady:
        run_second(conn, regression, rng)
    if period == 1:
        for filler in FILLERS:
            conn.execute(text(filler), {"c": rng.randint(2, 99)}).all()
    for _ in range(CALLS["lookup"][period]):
        conn.execute(text(LOOKUP), {"v": f"sku-{rng.randint(1001, 1050)}"}).all()
    for _ in range(CALLS["report"][period]):
        conn.execute(text(REPORT)).all()
    for _ in range(CALLS["frequent"][period]):
        conn.execute(text(FREQUENT), {"m": rng.randint(10, 30)}).all()
    for _ in range(CALLS["export"][period]):
        conn.execute(text(EXPORT), {"s": EXPORT_SLEEP[period]}).all()
    for _ in range(CALLS["rare"][period] if rare else 0):
        conn.execute(text(RARE), {"s": RARE_SLEEP[period],
                                  "v": f"sku-{rng.randint(1001, 1050)}"}).all()
    for _ in range(CALLS["regressed"][period]):
        conn.execute(text(regression.statement), {"v": regression.value(rng)}).all()
    for _ in range(CALLS["nested"][period]):
        conn.execute(text(NESTED), {"v": regression.value(rng)}).all()


def run_second(conn: Connection, regression: Regression, rng: random.Random) -> None:
    """The second migration's statement, SECOND_CALLS times (`regression` is the first's)."""
    second = second_regression(regression)
    for _ in range(SECOND_CALLS):
        conn.execute(text(second.statement), {"v": second.value(rng)}).all()


@dataclass
class Stat:
    queryid: int
    query: str
    calls: int
    total_ms: float

    @property
    def mean_ms(self) -> float:
        return self.total_ms / self.calls if self.calls else 0.0


def stats(admin: Engine, role: str) -> dict[int, Stat]:
    """pg_stat_statements of the check's database and the shop's role, by queryid."""
    with admin.connect() as conn:
        rows = conn.execute(text(
            "SELECT s.queryid, s.query, s.calls, s.total_exec_time, s.toplevel "
            "FROM pg_stat_statements s "
            "JOIN pg_roles r ON r.oid = s.userid "
            "WHERE s.dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) "
            "AND r.rolname = coalesce(nullif(:r, ''), current_user)"), {"r": role}).all()
    found: dict[int, Stat] = {}
    for queryid, query, calls, total, toplevel in rows:
        old = found.get(queryid)
        if old is None:
            found[queryid] = Stat(int(queryid), str(query), int(calls), float(total))
        else:
            old.calls += int(calls)
            old.total_ms += float(total)
            if toplevel:
                old.query = str(query)      # the toplevel row's text (README, stage 5)
    return found


def evicted(admin: Engine, statement: str) -> str:
    """Why a statement the workload ran is missing from pg_stat_statements: the view was full
    and evicted it (the server's fault, not the learner's)."""
    with admin.connect() as conn:
        size = conn.execute(text("SHOW pg_stat_statements.max")).scalar_one()
        dealloc = conn.execute(text("SELECT dealloc FROM pg_stat_statements_info")).scalar()
    return (f"pg_stat_statements lost the statement {statement!r} that this check ran "
            f"earlier: the view holds at most {size} statements and has evicted entries "
            f"{dealloc} times since its last reset. This is the server, not your code: run "
            "the check again on a server with fewer statements kept (`SELECT "
            "pg_stat_statements_reset()` as its administrator) or a larger "
            "pg_stat_statements.max.")


def find(found: dict[int, Stat], statement: str) -> Stat:
    """The workload's `statement` as pg_stat_statements shows it: the entry whose text starts
    like it, up to its first parameter or constant (an EXPLAIN of it is another entry, which
    does not)."""
    prefix = re.split(r":|\d", statement, maxsplit=1)[0]
    for stat in found.values():
        if stat.query.startswith(prefix):
            return stat
    raise LookupError(f"pg_stat_statements holds no statement like {statement!r}")


@dataclass
class Period:
    """The numbers of one statement in both periods, as the README computes them."""
    queryid: int
    query: str
    calls_before: int
    calls_after: int
    mean_before: float
    mean_after: float
    total_after: float
    mean_overall: float

    @property
    def factor(self) -> float:
        return self.mean_after / self.mean_before if self.mean_before else float("inf")


def regressed_by_the_readme(period: Period) -> bool:
    """Called 3 times or more in each period, its mean 3 x and 1 ms or more above before."""
    return (period.calls_before >= 3 and period.calls_after >= 3
            and period.mean_after >= 3 * period.mean_before
            and period.mean_after - period.mean_before >= 1.0)


def periods(before: dict[int, Stat], after: dict[int, Stat]) -> dict[int, Period]:
    out = {}
    for queryid, now in after.items():
        then = before.get(queryid, Stat(queryid, now.query, 0, 0.0))
        calls = now.calls - then.calls
        total = now.total_ms - then.total_ms
        out[queryid] = Period(queryid, now.query, then.calls, calls, then.mean_ms,
                              total / calls if calls else 0.0, total, now.mean_ms)
    return out


def reset_statement(admin: Engine, role: str, queryid: int) -> None:
    """Forget one statement of this database: pg_stat_statements_reset(userid, dbid,
    queryid)."""
    with admin.begin() as conn:
        conn.execute(text(
            "SELECT pg_stat_statements_reset("
            "(SELECT oid FROM pg_roles WHERE rolname = coalesce(nullif(:r, ''), current_user)),"
            " (SELECT oid FROM pg_database WHERE datname = current_database()), :q)"),
            {"r": role, "q": queryid})


def generic_plan(engine: Engine, query: str) -> str:
    """EXPLAIN (GENERIC_PLAN) of a statement as pg_stat_statements shows it ($1 ...)."""
    with engine.connect() as conn:
        lines = conn.exec_driver_sql("EXPLAIN (GENERIC_PLAN) " + query).scalars().all()
        conn.rollback()
    return "\n".join(str(line) for line in lines)
