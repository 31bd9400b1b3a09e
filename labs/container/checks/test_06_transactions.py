"""Stage transactions: @transactional as a proxy, proven on PostgreSQL rows and sessions.

The application writes every row through one helper that records, with the row, the
transaction id and backend pid that wrote it (`txid_current()`, `pg_backend_pid()`), and
appends ("write", what, key, txid, pid) to the probe's events. Its Engine carries an
application_name of its own, so pg_stat_activity shows exactly the application's sessions.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from _support import App, application_module
from sqlalchemy import text
from sqlalchemy.engine import make_url

from dojo.checks import CheckFailure, NotWritten, call, in_thread, raised, table

pytestmark = pytest.mark.stage("transactions")

PROXY = "transactional#what-the-proxy-does-on-every-call"
BLIND_SPOTS = "transactional#the-proxys-blind-spots"
ROLLBACK = "transactional#rollback-rules-checked-versus-unchecked"
PROPAGATION = "transactional#propagation-what-happens-when-a-transaction-already-exists"

APPLICATION = """\
    from __future__ import annotations

    from sqlalchemy import Engine, create_engine, text

    from markers import REQUIRES_NEW, bean, configuration, service, transactional
    from transactions import TransactionalPostProcessor, TransactionManager
    import {probe} as probe


    def write(manager, what, key):
        row = manager.connection().execute(text(
            "INSERT INTO {table} (what, key, txid, pid) "
            "VALUES (:what, :key, txid_current(), pg_backend_pid()) RETURNING txid, pid"),
            {"what": what, "key": key}).one()
        probe.events.append(("write", what, key, row.txid, row.pid))
        hook = getattr(probe, "after_write", None)
        if hook is not None:
            hook(what, key)


    class Declined(Exception):
        pass


    class SoftDeclined(Declined):
        pass


    @configuration
    class TxConfig:
        @bean(destroy_method="dispose")
        def engine(self) -> Engine:
            return create_engine({url!r})

        @bean
        def transactionManager(self, engine: Engine) -> TransactionManager:
            return TransactionManager(engine)

        @bean
        def transactionalPostProcessor(
                self, transactionManager: TransactionManager) -> TransactionalPostProcessor:
            return TransactionalPostProcessor(transactionManager)


    @service
    class Catalog:
        def __init__(self):
            probe.catalog = self

        def size(self):
            return 3


    @service
    class Audit:
        def __init__(self, transactionManager: TransactionManager):
            self.manager = transactionManager

        @transactional(propagation=REQUIRES_NEW)
        def record(self, key):
            write(self.manager, "audit", key)
            hook = getattr(probe, "inside_new", None)
            if hook is not None:
                hook()

        @transactional
        def note(self, key):
            write(self.manager, "note", key)

        @transactional(no_rollback_for=(Declined,))
        def hold(self, key, fail):
            write(self.manager, "hold", key)
            raise fail


    class Reservations:     # not a bean: Orders inherits its marked method
        @transactional(no_rollback_for=(Declined,))
        def reserve(self, key, fail=None, hold=None):
            write(self.manager, "reserve", key)
            if hold is not None:
                self.audit.hold(key, hold)
            if fail is not None:
                raise fail


    @service
    class Orders(Reservations):
        def __init__(self, transactionManager: TransactionManager, audit: Audit):
            self.manager = transactionManager
            self.audit = audit

        @transactional
        def place(self, key, fail=None, join=False, new=False, self_new=False, hold=None):
            write(self.manager, "order", key)
            if join:
                self.audit.note(key)
            if hold is not None:
                self.audit.hold(key, hold)
            if new:
                self.audit.record(key)
                write(self.manager, "order-after", key)
            if self_new:
                self.log_new(key)
            if fail is not None:
                raise fail
            return "placed " + key

        @transactional(propagation=REQUIRES_NEW)
        def log_new(self, key):
            write(self.manager, "self", key)

        @transactional
        def place_despite_audit(self, key):
            write(self.manager, "order", key)
            try:
                self.audit.record(key)      # REQUIRES_NEW: its own transaction, not joined
            except Exception as error:
                probe.events.append(("caught", key, type(error).__name__))
            write(self.manager, "order-after", key)
            return "placed " + key

        def place_all(self, keys):
            for key in keys:
                self.place(key)
    """


class Shop:
    """The refreshed application, its table and the check's view of the database."""

    def __init__(self, app: App, ctx: Any, table_name: str, application_name: str,
                 observer: Any) -> None:
        self.app, self.ctx, self.table = app, ctx, table_name
        self.application_name, self.observer = application_name, observer
        self.orders = call(ctx.get_bean, "orders")
        self.module = application_module(f"{app.base}.shop")

    def writes(self, key: str) -> list[tuple[str, int, int]]:
        """(what, txid, pid) of every write the application made for `key`, in order."""
        return [(what, txid, pid) for kind, *rest in self.app.probe.events if kind == "write"
                for what, written, txid, pid in [rest] if written == key]

    def committed(self, key: str) -> list[str]:
        """What is in the table for `key` now (committed rows only)."""
        with self.observer.connect() as conn:
            return [r[0] for r in conn.execute(text(
                f"SELECT what FROM {self.table} WHERE key = :key ORDER BY what"), {"key": key})]

    def sessions(self) -> list[tuple[Any, ...]]:
        """The application's sessions: pid, state, in a transaction, backend_xid."""
        with self.observer.connect() as conn:
            return [tuple(r) for r in conn.execute(text(
                "SELECT pid, state, xact_start IS NOT NULL, backend_xid::text "
                "FROM pg_stat_activity WHERE application_name = :name ORDER BY pid"),
                {"name": self.application_name})]


def _outcome(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, Any]:
    """(what it returned, what it raised): the learner's proxy may do either."""
    try:
        return call(fn, *args, **kwargs), None
    except (NotWritten, CheckFailure):
        raise
    except Exception as error:  # the method's own exception, or the proxy's
        return None, error


@pytest.fixture
def shop(learner: Any, make_app: Any, database: Any) -> Any:
    """The application refreshed on a table of its own; closed and disposed afterwards."""
    learner.module("transactions")
    suffix = uuid.uuid4().hex[:8]
    table_name, application_name = f"tx_rows_{suffix}", f"dojo_tx_{suffix}"
    with database.engine.begin() as conn:
        conn.execute(text(f"CREATE TABLE {table_name} (what text NOT NULL, key text NOT NULL, "
                          "txid bigint NOT NULL, pid int NOT NULL)"))
    url = make_url(database.url).update_query_dict({"application_name": application_name})
    app = make_app("shop")
    app.write("shop.py", APPLICATION.replace("{table}", table_name)
              .replace("{url!r}", repr(url.render_as_string(hide_password=False))))
    context = learner.module("context")
    ctx = call(context.ApplicationContext, app.base, app.root, {}, [])
    error = raised(ctx.refresh)
    if error is not None:
        raise CheckFailure(
            "refresh() failed on an application with a TransactionManager and a "
            "TransactionalPostProcessor declared as @bean methods.",
            expected="refresh() succeeds",
            actual=f"{type(error).__name__}: {error}",
            evidence="beans: engine, transactionManager(engine), "
                     "transactionalPostProcessor(transactionManager), catalog, audit, orders",
            lesson=PROXY,
        )
    try:
        yield Shop(app, ctx, table_name, application_name, database.engine)
    finally:
        raised(ctx.close)
        with database.engine.begin() as conn:
            conn.execute(text(f"DROP TABLE IF EXISTS {table_name}"))


def _writes_table(shop: Shop, keys: list[str]) -> str:
    rows = [(key, what, txid, pid) for key in keys for what, txid, pid in shop.writes(key)]
    return table(rows, ("key", "write", "txid", "pid"))


def _kept_connections(shop: Shop) -> list[str]:
    """A problem when connections of the application's Engine are still out of its pool
    (checked out) though no call is running: the pool cannot dispose of them at close()."""
    engine = call(shop.ctx.get_bean, "engine")
    out = engine.pool.checkedout()
    return [f"{out} connection(s) of the Engine still checked out of its pool after the "
            "outermost calls returned (kept, not closed: close() cannot dispose of them, "
            "their sessions outlive the application)"] if out else []


def _raised_name(error: Any) -> str:
    return "nothing" if error is None else f"{type(error).__name__}: {error}"


def test_required_joins_the_callers_transaction(shop):
    result, error = _outcome(shop.orders.place, "a1", join=True)
    boom = RuntimeError("payment service down")
    _, failed = _outcome(shop.orders.place, "a2", join=True, fail=boom)
    problems = []
    if error is not None or result != "placed a1":
        problems.append(f"place('a1') returned {result!r} and raised {_raised_name(error)}, "
                        "not 'placed a1'")
    first = shop.writes("a1")
    if len(first) != 2:
        problems.append(f"place('a1') made {len(first)} write(s), not the order and the note")
    elif first[0][1] != first[1][1]:
        problems.append(f"the note (REQUIRED, called from place) ran in txid {first[1][1]}, "
                        f"the order in {first[0][1]}: it did not join")
    if sorted(shop.committed("a1")) != ["note", "order"]:
        problems.append(f"after place('a1') returned, committed: {shop.committed('a1')}")
    if failed is not boom:
        problems.append(f"place('a2') raised {_raised_name(failed)}, not the method's own "
                        "RuntimeError")
    if shop.committed("a2"):
        problems.append(f"place('a2') raised, yet these rows were committed: "
                        f"{shop.committed('a2')}")
    left = [s for s in shop.sessions() if s[2]]
    if left:
        problems.append(f"{len(left)} session(s) of the application still in a transaction "
                        "after the calls returned")
    kept = _kept_connections(shop)
    problems += kept
    if call(shop.ctx.get_bean, "catalog") is not shop.app.probe.catalog:
        problems.append("get_bean('catalog') (no @transactional method) is not the object its "
                        "constructor made: only beans with marked methods are wrapped")
    if problems:
        raise CheckFailure(
            "A @transactional method called through the proxy runs in a transaction that "
            "commits when it returns; a REQUIRED method it calls on another bean joins that "
            "transaction (one txid), so one exception rolls both writes back and reaches the "
            "caller unchanged.",
            expected="place('a1') returns 'placed a1', order and note in one txid, both "
                     "committed; place('a2') raises its RuntimeError and leaves no row; no "
                     "transaction left open, every connection back in the pool; catalog not "
                     "wrapped",
            actual="; ".join(problems),
            evidence="writes, as the application saw them:\n" + _writes_table(shop, ["a1", "a2"])
                     + "\nsessions now:\n" + table(shop.sessions(),
                                                   ("pid", "state", "in xact", "backend_xid")),
            lesson=PROPAGATION,
            fix="Close the connection of a transaction when the call that started it ends "
                "(in finally): that returns it to the pool; never keep one for the next call "
                "(per thread or per manager)." if kept and problems == kept else None,
        )


def test_requires_new_suspends_and_uses_a_second_connection(shop):
    seen: list[list[tuple[Any, ...]]] = []
    shop.app.probe.inside_new = lambda: seen.append(shop.sessions())
    boom = RuntimeError("card declined")
    _, error = _outcome(shop.orders.place, "b1", new=True, fail=boom)
    writes = {what: (txid, pid) for what, txid, pid in shop.writes("b1")}
    problems = []
    if error is not boom:
        problems.append(f"place('b1') raised {_raised_name(error)}, not the method's own "
                        "RuntimeError")
    if not {"order", "audit", "order-after"} <= set(writes):
        problems.append("writes missing: " + ", ".join(
            sorted({"order", "audit", "order-after"} - set(writes))))
    else:
        order, audit, after = writes["order"], writes["audit"], writes["order-after"]
        if audit[1] == order[1]:
            problems.append(f"the REQUIRES_NEW audit ran on the caller's connection (backend "
                            f"pid {order[1]})")
        if audit[0] == order[0]:
            problems.append(f"the REQUIRES_NEW audit ran in the caller's transaction "
                            f"(txid {order[0]})")
        if after != order:
            problems.append(f"after the audit returned, place wrote in txid {after[0]} on pid "
                            f"{after[1]}, not in its own transaction (txid {order[0]}, pid "
                            f"{order[1]}): the caller's transaction was not resumed")
        if seen:
            during = {s[0]: s for s in seen[0]}
            outer = during.get(order[1])
            if outer is None or not outer[2]:
                problems.append("while the audit ran, pg_stat_activity showed the caller's "
                                f"session (pid {order[1]}) "
                                + ("gone" if outer is None else "outside a transaction")
                                + ": it must stay suspended, open")
            if audit[1] not in during:
                problems.append("while the audit ran, pg_stat_activity did not show its "
                                f"session (pid {audit[1]})")
    if shop.committed("b1") != ["audit"]:
        problems.append(f"after place('b1') failed, committed: {shop.committed('b1') or 'nothing'}"
                        " (the audit must survive, the order's writes must not)")
    problems += _kept_connections(shop)
    if problems:
        same = "ran on the caller's connection" in "; ".join(problems)
        raise CheckFailure(
            "REQUIRES_NEW suspends the caller's transaction and runs on a second connection: "
            "another backend, another txid, committed when the method returns whatever the "
            "caller does next; the caller's transaction stays open meanwhile and resumes "
            "afterwards.",
            expected="audit on another pid and txid, committed; order and order-after in the "
                     "caller's txid on its pid, rolled back when place raises; both connections "
                     "back in the pool",
            actual="; ".join(problems),
            evidence="writes:\n" + _writes_table(shop, ["b1"])
                     + "\npg_stat_activity while the audit ran:\n"
                     + (table(seen[0], ("pid", "state", "in xact", "backend_xid")) if seen
                        else "(the audit never ran)"),
            lesson=PROPAGATION,
            fix="For REQUIRES_NEW take a new connection from the Engine (engine.connect()), bind "
                "it for the call and put the caller's back afterwards; a savepoint or the "
                "caller's connection is not a new transaction." if same else None,
        )


def test_rollback_rules_follow_no_rollback_for(shop):
    module = shop.module
    cases = [
        ("c1", shop.orders.reserve, RuntimeError("out of stock"), False,
         "reserve (inherited, no_rollback_for=Declined) raises RuntimeError"),
        ("c2", shop.orders.reserve, module.Declined("limit reached"), True,
         "reserve raises Declined"),
        ("c3", shop.orders.reserve, module.SoftDeclined("soft limit"), True,
         "reserve raises SoftDeclined, a subclass of Declined"),
        ("c4", shop.orders.place, module.Declined("limit reached"), False,
         "place (no no_rollback_for) raises Declined"),
        # a joined method's exception: the starter's rules decide (these two cases are the
        # same with Spring's rollback-only: the joined hold's rules would not mark it)
        ("c5", shop.orders.reserve, module.Declined("hold refused"), True,
         "reserve joined by hold (both no_rollback_for=Declined); hold raises Declined"),
        ("c6", shop.orders.place, module.Declined("hold refused"), False,
         "place (no no_rollback_for) joined by hold (no_rollback_for=Declined); hold raises "
         "Declined"),
    ]
    rows, problems = [], []
    for key, method, exception, commits, what in cases:
        joined = key in ("c5", "c6")
        _, error = _outcome(method, key, **({"hold": exception} if joined else
                                            {"fail": exception}))
        committed = bool(shop.committed(key))
        rows.append((key, what, "commit" if commits else "rollback",
                     "committed" if committed else "rolled back", _raised_name(error)))
        if type(error).__name__ == "NoTransactionError":
            problems.append(f"{key}: {what}: connection() found no transaction (the proxy did "
                            f"not intercept {getattr(method, '__name__', 'it')})")
            continue
        if committed != commits:
            problems.append(f"{key}: {what}: " + ("committed" if committed else "rolled back"))
        if error is not exception:
            problems.append(f"{key}: the caller got {_raised_name(error)}, not the method's "
                            "exception")
    if problems:
        # the fix names the mistake only when every call raised its own exception and
        # nothing committed
        every = all(r[3] == "rolled back" and r[4].startswith(type(c[2]).__name__ + ":")
                    for r, c in zip(rows, cases, strict=True))
        raise CheckFailure(
            "An exception that leaves a @transactional method rolls its transaction back, "
            "unless it is an instance of a class in the method's no_rollback_for (subclasses "
            "included): then the transaction commits. An exception of a method that joined is "
            "decided by the rules of the method that started the transaction. Either way the "
            "caller gets the exception.",
            expected="c1 rolled back, c2 and c3 committed, c4 rolled back, c5 committed, c6 "
                     "rolled back; each call raises its own exception",
            actual="; ".join(problems),
            evidence=table(rows, ("key", "call", "expected", "outcome", "raised")),
            lesson=ROLLBACK,
            fix="Commit when isinstance(error, attribute.no_rollback_for), roll back otherwise, "
                "and re-raise." if every else None,
        )


def test_self_invocation_bypasses_the_proxy(shop):
    boom = RuntimeError("address invalid")
    _, error = _outcome(shop.orders.place, "d1", self_new=True, fail=boom)
    writes = {what: (txid, pid) for what, txid, pid in shop.writes("d1")}
    _, bulk_error = _outcome(shop.orders.place_all, ["d2"])
    problems = []
    if error is not boom:
        problems.append(f"place('d1') raised {_raised_name(error)}, not its own RuntimeError")
    if "self" in writes and "order" in writes and writes["self"] != writes["order"]:
        problems.append(f"self.log_new() (REQUIRES_NEW) called inside place ran in txid "
                        f"{writes['self'][0]} on pid {writes['self'][1]}, not in place's "
                        f"(txid {writes['order'][0]}): the call through self was intercepted")
    if shop.committed("d1"):
        problems.append(f"after place('d1') failed, committed: {shop.committed('d1')}")
    if bulk_error is None or type(bulk_error).__name__ != "NoTransactionError":
        problems.append("place_all (no @transactional) calling self.place() gave "
                        f"{_raised_name(bulk_error)}, not NoTransactionError from "
                        "connection(): self.place is the target's method, no transaction")
    if shop.committed("d2"):
        problems.append(f"place_all's self.place('d2') committed {shop.committed('d2')}")
    if problems:
        raise CheckFailure(
            "Only calls that go through the proxy get the proxy's transaction handling. "
            "Inside the bean, self is the target, so self.log_new() runs in the caller's "
            "transaction despite REQUIRES_NEW, and a non-transactional method calling "
            "self.place() has no transaction at all.",
            expected="self.log_new's write in place's txid and rolled back with it; place_all "
                     "raises NoTransactionError and commits nothing",
            actual="; ".join(problems),
            evidence="writes:\n" + _writes_table(shop, ["d1", "d2"]),
            lesson=BLIND_SPOTS,
        )


def test_each_thread_has_its_own_transaction(shop):
    # a fixed interleaving: e1 writes its order; e2 starts, writes its order and waits; e1
    # writes its note and finishes; then e2 writes its note. With one binding shared by the
    # threads, e1's note lands on e2's connection, every run.
    e1_in, e2_in, e1_done = threading.Event(), threading.Event(), threading.Event()

    def after_write(what, key):
        if (what, key) == ("order", "e1"):
            e1_in.set()
            e2_in.wait(20)
        elif (what, key) == ("order", "e2"):
            e2_in.set()
            e1_done.wait(20)

    shop.app.probe.after_write = after_write
    first = in_thread(shop.orders.place, "e1", join=True)
    e1_in.wait(20)
    second = in_thread(shop.orders.place, "e2", join=True)
    first.join(30)
    e1_done.set()
    second.join(30)
    errors = []
    for key, run in (("e1", first), ("e2", second)):
        if run.alive:
            errors.append(f"place('{key}') still running after 30 s")
        elif run.error is not None:
            errors.append(f"place('{key}') raised {_raised_name(run.error)}")
    shop.app.probe.after_write = None
    problems, mixed = list(errors), False
    for key in ("e1", "e2"):
        writes = {what: (txid, pid) for what, txid, pid in shop.writes(key)}
        if "order" in writes and "note" in writes and writes["order"] != writes["note"]:
            mixed = True
            problems.append(f"{key}: the order was written in txid {writes['order'][0]} on pid "
                            f"{writes['order'][1]}, the note in txid {writes['note'][0]} on pid "
                            f"{writes['note'][1]}")
        if sorted(shop.committed(key)) != ["note", "order"] and not errors:
            problems.append(f"{key}: committed {shop.committed(key)}")
    if problems:
        raise CheckFailure(
            "Two threads calling @transactional methods at once each run in a transaction of "
            "their own: the connection a transaction uses is bound to the thread (context) "
            "that started it, the way Spring binds it to the thread, not shared by the bean.",
            expected="in each thread, the order and the note in one txid on one pid, both "
                     "committed",
            actual="; ".join(problems),
            evidence="writes (e1: order; e2: order; e1: note; e2: note, in that order):\n"
                     + _writes_table(shop, ["e1", "e2"]),
            lesson=PROXY,
            fix="Keep the current connection in a contextvars.ContextVar (or a threading.local), "
                "not in an attribute of the manager." if mixed else None,
        )


def test_a_failed_commit_ends_the_transaction(shop):
    parent = f"{shop.table}_known"
    with shop.observer.begin() as conn:
        conn.execute(text(f"CREATE TABLE {parent} (key text PRIMARY KEY)"))
        conn.execute(text(f"INSERT INTO {parent} VALUES ('c7-known')"))
        conn.execute(text(f"ALTER TABLE {shop.table} ADD CONSTRAINT {shop.table}_known_fk "
                          f"FOREIGN KEY (key) REFERENCES {parent} (key) "
                          "DEFERRABLE INITIALLY DEFERRED"))
    try:
        # the INSERT succeeds; the deferred foreign key fails at COMMIT, and only there
        _, failed = _outcome(shop.orders.place, "c7-unknown")
        manager = call(shop.ctx.get_bean, "transactionManager")
        _, outside = _outcome(manager.connection)
        result, error = _outcome(shop.orders.place, "c7-known")
        problems = []
        if failed is None:
            problems.append("place('c7-unknown') raised nothing, though its COMMIT failed")
        if outside is None or type(outside).__name__ != "NoTransactionError":
            problems.append("after it, connection() outside any call "
                            + ("returned a connection" if outside is None else
                               f"raised {_raised_name(outside)}")
                            + ", not NoTransactionError")
        if error is not None or result != "placed c7-known":
            problems.append(f"the next place('c7-known') returned {result!r} and raised "
                            f"{_raised_name(error)}")
        if shop.committed("c7-known") != ["order"]:
            problems.append(f"after place('c7-known') returned, committed: "
                            f"{shop.committed('c7-known')}")
        left = [s for s in shop.sessions() if s[2]]
        if left:
            problems.append(f"{len(left)} session(s) of the application still in a "
                            "transaction after the calls returned")
        problems += _kept_connections(shop)
        if problems:
            raise CheckFailure(
                "A transaction whose COMMIT fails (a deferred constraint is checked only "
                "there) is over all the same: the caller gets the error, nothing is bound "
                "to the thread any more, the connection goes back to the pool, and the next "
                "call starts a transaction of its own.",
                expected="place('c7-unknown') raises (the foreign key fails at COMMIT); then "
                         "connection() raises NoTransactionError; place('c7-known') returns "
                         "'placed c7-known' and commits; no transaction open, no connection "
                         "kept",
                actual="; ".join(problems),
                evidence="the table's key references a table holding only 'c7-known', "
                         "DEFERRABLE INITIALLY DEFERRED\nwrites, as the application saw "
                         "them:\n" + _writes_table(shop, ["c7-unknown", "c7-known"])
                         + "\nsessions now:\n" + table(shop.sessions(),
                                                       ("pid", "state", "in xact",
                                                        "backend_xid")),
                lesson=PROXY,
            )
    finally:
        with shop.observer.begin() as conn:
            conn.execute(text(f"ALTER TABLE {shop.table} DROP CONSTRAINT IF EXISTS "
                              f"{shop.table}_known_fk"))
            conn.execute(text(f"DROP TABLE IF EXISTS {parent}"))


def test_a_failed_inner_commit_resumes_the_caller(shop):
    key = "c8-audit-refused"
    function, trigger = f"{shop.table}_refuse", f"{shop.table}_refuse_audit"
    with shop.observer.begin() as conn:
        conn.execute(text(f"CREATE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql AS "
                          "$$ BEGIN RAISE EXCEPTION 'audit refused at commit'; END $$"))
        conn.execute(text(f"CREATE CONSTRAINT TRIGGER {trigger} AFTER INSERT ON {shop.table} "
                          "DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN (NEW.what = 'audit') "
                          f"EXECUTE FUNCTION {function}()"))
    try:
        # the audit INSERT succeeds; the deferred trigger fails its REQUIRES_NEW at COMMIT
        result, error = _outcome(shop.orders.place_despite_audit, key)
        writes = shop.writes(key)
        caught = [e for e in shop.app.probe.events if e[0] == "caught" and e[1] == key]
        order = [w for w in writes if w[0] == "order"]
        after = [w for w in writes if w[0] == "order-after"]
        problems = []
        if not caught:
            problems.append("the caller caught no error from audit.record, though its COMMIT "
                            "failed")
        if error is not None or result != "placed " + key:
            problems.append(f"place_despite_audit returned {result!r} and raised "
                            f"{_raised_name(error)}")
        elif len(order) != 1 or len(after) != 1 or order[0][1:] != after[0][1:]:
            problems.append("the caller's write after the failed audit ran in another "
                            "transaction than its first (txid, pid): "
                            + ", ".join(f"{w[0]} {w[1]}/{w[2]}" for w in writes))
        if shop.committed(key) != ["order", "order-after"]:
            problems.append(f"committed for {key}: {shop.committed(key)}")
        left = [s for s in shop.sessions() if s[2]]
        if left:
            problems.append(f"{len(left)} session(s) of the application still in a "
                            "transaction after the call returned")
        problems += _kept_connections(shop)
        if problems:
            raise CheckFailure(
                "A REQUIRES_NEW method whose COMMIT fails ends its own transaction like any "
                "other end: the caller gets the error and its own transaction, suspended "
                "meanwhile, is the one in progress again (same connection, same txid); a "
                "caller that catches the error goes on writing in it and commits.",
                expected=f"place_despite_audit('{key}') catches audit.record's error, writes "
                         "order-after in its own transaction (the txid and pid of its first "
                         "write), returns and commits order and order-after",
                actual="; ".join(problems),
                evidence="a deferred constraint trigger refuses every 'audit' row at COMMIT; "
                         "place_despite_audit (@transactional) writes order, calls "
                         "audit.record (REQUIRES_NEW) in a try/except, writes order-after\n"
                         "writes, as the application saw them:\n" + _writes_table(shop, [key])
                         + "\nsessions now:\n" + table(shop.sessions(),
                                                       ("pid", "state", "in xact",
                                                        "backend_xid")),
                lesson=PROXY,
            )
    finally:
        with shop.observer.begin() as conn:
            conn.execute(text(f"DROP TRIGGER IF EXISTS {trigger} ON {shop.table}"))
            conn.execute(text(f"DROP FUNCTION IF EXISTS {function}()"))
