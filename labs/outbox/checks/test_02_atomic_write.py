"""Stage atomic-write: the business row and its outbox row commit together, or neither does."""

from __future__ import annotations

import re
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from _support import (
    MISTAKES,
    READ,
    count,
    outbox_rows,
    require_table,
)
from sqlalchemy import Engine, text

from dojo.checks import CheckFailure, call, first_line, raised, table
from dojo.checks.faults import InjectedFault, fail_sql, run_concurrently

pytestmark = pytest.mark.stage("atomic-write")
SEE = READ["atomic-write"]

ROW_COLUMNS = ("id", "aggregate_type", "aggregate_id", "event_type", "aggregate_version",
               "payload", "published_at")
INSERT_OUTBOX = r"\binsert\s+into\s+(public\.)?\"?outbox_event\b"
INSERT_ORDERS = r"\binsert\s+into\s+(public\.)?\"?orders\b"
UPDATE_ORDERS = r"\bupdate\s+(only\s+)?(public\.)?\"?orders\b"
RACERS = 3  # concurrent changes of one order


def order_rows(engine: Engine) -> list[dict]:
    with engine.connect() as conn:
        return [dict(r) for r in conn.execute(text(
            "SELECT id, customer_id, total_cents, version FROM orders ORDER BY created_at"
        )).mappings()]


def state(engine: Engine) -> str:
    return ("orders:\n" + table(order_rows(engine), ("id", "customer_id", "total_cents",
                                                     "version")) +
            "\noutbox_event:\n" + table(outbox_rows(engine), ROW_COLUMNS))


def test_order_and_event_are_written_together(outbox, learner):
    require_table(outbox, "outbox_event", "schema")
    orders = learner.module("orders")
    customer = uuid.uuid4()
    order_id = call(orders.place_order, outbox, customer, 4200)
    try:
        order_id = uuid.UUID(str(order_id))
    except ValueError:
        raise CheckFailure("place_order must return the new order's id.",
                           expected="a UUID the application assigned",
                           actual=f"it returned {order_id!r}", lesson=SEE) from None
    placed = order_rows(outbox)
    if not ([(str(r["id"]), r["total_cents"], r["version"]) for r in placed] ==
            [(str(order_id), 4200, 1)]):
        raise CheckFailure(
            "place_order must insert the order with the id it returns, at version 1.",
            expected=f"one orders row: id {order_id}, total_cents 4200, version 1",
            actual=f"{len(placed)} orders row(s)", evidence=state(outbox), lesson=SEE)
    events = outbox_rows(outbox)
    expected = {"aggregate_type": "order", "aggregate_id": str(order_id),
                "event_type": "order.placed.v1", "aggregate_version": 1}
    actual = [{k: e[k] for k in expected} for e in events]
    if actual != [expected]:
        raise CheckFailure(
            "Placing an order must write exactly one outbox row describing it. The event type "
            "carries a version (order.placed.v1) so consumers survive schema changes.",
            expected=str(expected), actual=str(actual), evidence=state(outbox),
            lesson=SEE)
    [row] = events
    payload = row["payload"] if isinstance(row["payload"], dict) else {}
    want = {"order_id": str(order_id), "customer_id": str(customer), "total_cents": 4200}
    if {k: payload.get(k) for k in want} != want:
        raise CheckFailure(
            "The event's payload describes the order: what a consumer needs, nothing internal.",
            expected=f"payload with {want}", actual=f"payload {row['payload']!r}",
            lesson=SEE)
    if not (row["id"] != str(order_id) and row["published_at"] is None
            and row["attempt_count"] == 0):
        raise CheckFailure(
            "A fresh event has its own id (not the order's), is unpublished and untried.",
            expected="id ≠ order id, published_at NULL, attempt_count 0",
            actual=f"id {row['id']}, published_at {row['published_at']}, "
                   f"attempt_count {row['attempt_count']}", lesson=SEE)
    require_negative_totals_refused(outbox, orders, order_id)
    require_zero_and_unchanged_totals_written(outbox, orders)


def require_zero_and_unchanged_totals_written(engine: Engine, orders: Any) -> None:
    """0 is a total (a fully discounted order), and a change to the same total is a change:
    each call writes its version and its event."""
    problems = []
    order_id = raised_or(orders.place_order, engine, uuid.uuid4(), 0)
    if isinstance(order_id, BaseException):
        problems.append(f"place_order(total_cents=0) raised {type(order_id).__name__}")
    else:
        for total, want in ((0, 2), (0, 3)):
            version = raised_or(orders.change_order_total, engine, order_id, total)
            if version != want:
                problems.append(f"change_order_total(total_cents={total}) of an order at "
                                f"{total} returned " + (f"{type(version).__name__} (raised)"
                                if isinstance(version, BaseException) else repr(version))
                                + f" instead of {want}")
        events = count(engine, "SELECT count(*) FROM outbox_event WHERE "
                               "aggregate_id::text = :id", id=str(order_id))
        if not problems and events != 3:
            problems.append(f"{events} event(s) for that order instead of 3")
    if problems:
        raise CheckFailure(
            "A total of 0 is a total (a fully discounted order; the CHECK refuses only negative "
            "ones), and a change to the total the order already has is still a change: each "
            "call takes the next version and writes its event, so the caller's version and the "
            "consumers' view of the order stay in step.",
            expected="place_order(…, 0) → version 1; two changes to 0 → versions 2 and 3; "
                     "3 events",
            actual="; ".join(problems), evidence=state(engine), lesson=SEE)


def raised_or(fn: Any, *args: Any) -> Any:
    """What fn returned, or the exception it raised."""
    try:
        return call(fn, *args)
    except CheckFailure:
        raise
    except Exception as exc:  # shown as what happened
        return exc


def require_negative_totals_refused(engine: Engine, orders: Any, order_id: uuid.UUID) -> None:
    """A negative total is refused by both functions, and leaves nothing behind."""
    before = state(engine)
    counts = (count(engine, "SELECT count(*) FROM orders"),
              count(engine, "SELECT count(*) FROM outbox_event"))
    for name, args in (("place_order", (engine, uuid.uuid4(), -1250)),
                       ("change_order_total", (engine, order_id, -1250))):
        error = raised(getattr(orders, name), *args)
        after = (count(engine, "SELECT count(*) FROM orders"),
                 count(engine, "SELECT count(*) FROM outbox_event"))
        [order] = [o for o in order_rows(engine) if str(o["id"]) == str(order_id)]
        if error is None or after != counts or order["total_cents"] != 4200:
            raise CheckFailure(
                f"{name} was given a negative total (-1250 cents). It must refuse — raise — and "
                "write nothing: no order, no change, no event announcing it.",
                expected="an exception (the orders table's CHECK (total_cents >= 0) raises one "
                         "if you let it propagate); orders and outbox_event unchanged",
                actual=("it returned normally" if error is None else
                        f"it raised {type(error).__name__}") +
                       f"; orders rows {counts[0]} → {after[0]}, outbox_event rows "
                       f"{counts[1]} → {after[1]}, the order's total {order['total_cents']}",
                evidence="before:\n" + before + "\nafter:\n" + state(engine), lesson=SEE)


def assert_nothing_left(engine: Engine, where: str, raised: BaseException | None,
                        function: str, orders_before: int, outbox_before: int) -> None:
    orders_now = count(engine, "SELECT count(*) FROM orders")
    outbox_now = count(engine, "SELECT count(*) FROM outbox_event")
    swallowed = "" if isinstance(raised, InjectedFault) else (
        f"\n  Also: {function} did not raise the injected error (it "
        f"{'raised ' + repr(raised) if raised else 'returned normally'}); let it propagate.")
    if (orders_now, outbox_now) != (orders_before, outbox_before):
        raise CheckFailure(
            f"The check made the statement `{where}` fail inside {function}. Whatever ran before "
            "it must roll back: the business change and its event belong to the same "
            "transaction. Here one survived without the other — the dual write the outbox "
            "exists to remove (an order nobody hears about, or an event about nothing)."
            + swallowed,
            expected=f"orders rows {orders_before}, outbox_event rows {outbox_before} "
                     "(nothing committed)",
            actual=f"orders rows {orders_now}, outbox_event rows {outbox_now}",
            evidence=state(engine) + "\n  Fix: do both writes on one connection inside one "
                     "`with engine.begin() as conn:` block.",
            lesson=MISTAKES)


def run_failing(engine: Engine, match: str, fn, *args) -> tuple[list[str], BaseException | None]:
    """Call `fn` with the statements matching `match` failing; (what failed, what `fn` raised:
    the injected fault, or whatever the code turned it into)."""
    with fail_sql(engine, match) as failed:
        error = raised(fn, *args)
    return failed, error


def test_failure_after_the_order_insert_rolls_back_both(outbox, learner):
    require_table(outbox, "outbox_event", "schema")
    orders = learner.module("orders")
    for match, label in ((INSERT_OUTBOX, "INSERT INTO outbox_event"),
                         (INSERT_ORDERS, "INSERT INTO orders")):
        failed, raised = run_failing(outbox, match, orders.place_order, outbox, uuid.uuid4(), 990)
        if not failed:
            raise CheckFailure(
                f"place_order never ran `{label}` through the engine it was given.",
                expected=f"a `{label} …` statement executed via the SQLAlchemy engine",
                actual="no such statement (the check injects failures through engine events; "
                       "run your SQL with engine.begin() / conn.execute(text(...)))",
                lesson=SEE)
        assert_nothing_left(outbox, label, raised, "place_order", 0, 0)

    order_id = call(orders.place_order, outbox, uuid.uuid4(), 1000)
    failed, raised = run_failing(outbox, INSERT_OUTBOX, orders.change_order_total, outbox,
                                 order_id, 2500)
    if not failed:
        raise CheckFailure(
            "change_order_total never ran `INSERT INTO outbox_event` through the engine it was "
            "given.",
            expected="a `INSERT INTO outbox_event …` statement executed via the SQLAlchemy engine",
            actual="no such statement", lesson=SEE)
    assert_nothing_left(outbox, "INSERT INTO outbox_event", raised, "change_order_total", 1, 1)
    [order] = order_rows(outbox)
    if (order["total_cents"], order["version"]) != (1000, 1):
        raise CheckFailure(
            "change_order_total failed at its event insert, yet the order's change stayed.",
            expected="total_cents 1000, version 1 (rolled back)",
            actual=f"total_cents {order['total_cents']}, version {order['version']}",
            evidence=state(outbox), lesson=MISTAKES)


def test_version_starts_at_1_and_increments(outbox, learner):
    require_table(outbox, "outbox_event", "schema")
    orders = learner.module("orders")
    order_id = call(orders.place_order, outbox, uuid.uuid4(), 1037)
    versions = [call(orders.change_order_total, outbox, order_id, total)
                for total in (1589, 1211)]
    events = outbox_rows(outbox, "aggregate_id::text = :id", id=str(order_id))
    got = [(e["aggregate_version"], e["event_type"], (e["payload"] or {}).get("total_cents"))
           for e in events]
    want = [(1, "order.placed.v1", 1037), (2, "order.total-changed.v1", 1589),
            (3, "order.total-changed.v1", 1211)]
    if not (versions == [2, 3] and got == want):
        raise CheckFailure(
            "Each change to an order writes one event with the next aggregate version, so a "
            "consumer can tell order and gaps; the first event of an aggregate is version 1.",
            expected=f"change_order_total returns [2, 3]; events (version, type, total) {want}",
            actual=f"returned {versions}; events {got}", evidence=state(outbox),
            lesson=SEE)
    previous = [(e["payload"] or {}).get("previous_total_cents") for e in events[1:]]
    if previous != [1037, 1589]:
        echoed = previous == [1589, 1211]
        raise CheckFailure(
            "order.total-changed.v1 carries previous_total_cents: the total before this change, "
            "which a consumer needs to apply the difference. "
            + ("Here it equals the new total: it was read after the UPDATE (an UPDATE's "
               "RETURNING gives the row as changed, not as it was)." if echoed else
               "Here it is not the total the order had before the change."),
            expected="previous_total_cents 1037, then 1589 (1037 → 1589 → 1211)",
            actual=f"previous_total_cents {previous[0]!r}, then {previous[1]!r}",
            evidence=state(outbox), lesson=SEE,
            fix=("read the order (SELECT … FOR UPDATE) before updating it and put that total "
                 "in the event") if echoed else None)
    placed_payload = events[0]["payload"] if isinstance(events[0]["payload"], dict) else {}
    keys = ("order_id", "customer_id", "total_cents", "previous_total_cents")
    partial = [{"version": e["aggregate_version"], "missing": ", ".join(
                    k for k in keys if k not in (e["payload"] or {})),
                "payload": e["payload"]} for e in events[1:]
               if not isinstance(e["payload"], dict) or any(
                   k not in e["payload"] for k in keys)
               or str(e["payload"]["order_id"]) != str(order_id)
               or str(e["payload"]["customer_id"]) != str(placed_payload.get("customer_id"))]
    if partial:
        raise CheckFailure(
            "order.total-changed.v1 carries what order.placed.v1 carries (order_id, customer_id, "
            "total_cents: the order as it is now) and adds previous_total_cents. A consumer reads "
            "the payload, not the Kafka key: a change event without its order_id cannot be "
            "applied to the order it is about.",
            expected=f"each change's payload: order_id {order_id}, the order's customer_id, "
                     "total_cents, previous_total_cents",
            actual="; ".join(f"version {p['version']}: "
                             + (f"no {p['missing']}" if p["missing"] else "another order_id or "
                                "customer_id") for p in partial),
            evidence=table(partial, ("version", "missing", "payload")), lesson=SEE)
    [order] = order_rows(outbox)
    if order["version"] != 3:
        raise CheckFailure("After two changes the order itself must be at version 3.",
                           expected="orders.version 3", actual=f"orders.version {order['version']}",
                           evidence=state(outbox), lesson=SEE)
    # Cleanup has deleted the order's published events; the order itself is at version 3.
    with outbox.begin() as conn:
        conn.execute(text("DELETE FROM outbox_event"))
    fourth = call(orders.change_order_total, outbox, order_id, 1300)
    events = outbox_rows(outbox)
    if fourth != 4 or [e["aggregate_version"] for e in events] != [4]:
        raise CheckFailure(
            "The order was at version 3 and its events had been cleaned up (published, past "
            "retention); the next change must be version 4. The order row holds the version: "
            "the outbox keeps events only until cleanup, so counting them restarts the "
            "numbering and consumers see version 1 again.",
            expected="change_order_total returns 4; one event, version 4",
            actual=f"returned {fourth!r}; event versions "
                   f"{[e['aggregate_version'] for e in events]}",
            evidence=state(outbox), lesson=SEE,
            fix="new version = orders.version + 1, read with SELECT … FOR UPDATE")
    error = raised(orders.change_order_total, outbox, uuid.uuid4(), 1)
    if not isinstance(error, LookupError):
        raise CheckFailure("change_order_total of an order that does not exist must refuse.",
                           expected="LookupError (KeyError is one)", actual=first_line(error),
                           lesson=SEE)


def test_a_failed_commit_leaves_neither_row(outbox, learner):
    require_table(outbox, "outbox_event", "schema")
    orders = learner.module("orders")
    # Every statement runs; only the COMMIT of the transaction that wrote the order fails.
    with fail_sql(outbox, INSERT_ORDERS, at="commit") as failed:
        error = raised(orders.place_order, outbox, uuid.uuid4(), 2718)
    require_failed_commit(outbox, failed, error, "place_order", "INSERT INTO orders")
    order_id = call(orders.place_order, outbox, uuid.uuid4(), 2718)
    with fail_sql(outbox, UPDATE_ORDERS, at="commit") as failed:
        error = raised(orders.change_order_total, outbox, order_id, 3141)
    require_failed_commit(outbox, failed, error, "change_order_total", "UPDATE orders")


def require_failed_commit(engine: Engine, failed: list[str], error: BaseException | None,
                          function: str, label: str) -> None:
    """After a failed COMMIT: both rows or neither. Each order at version v has exactly the
    events 1 … v, so the outbox holds as many rows as the orders' versions add up to."""
    if not failed:
        raise CheckFailure(
            f"{function} never committed a transaction that ran `{label}` through the engine "
            "it was given.",
            expected=f"`{label} …` and the outbox insert, committed via the SQLAlchemy engine",
            actual="no such commit (the check fails commits through engine events; run your SQL "
                   "with engine.begin() / conn.execute(text(...)))", lesson=SEE)
    events = count(engine, "SELECT count(*) FROM outbox_event")
    announced = count(engine, "SELECT coalesce(sum(version), 0) FROM orders")
    if events == announced:
        return
    outcome = ("" if isinstance(error, InjectedFault) else
               f"; {function} {'raised ' + type(error).__name__ if error else 'returned'}")
    if events > announced:
        raise CheckFailure(
            f"The check let every statement of {function} run and failed only the COMMIT of the "
            f"transaction that ran `{label}`. The outbox row survived that failed commit, so "
            "another transaction had committed it: an event announcing "
            + ("an order that does not exist." if function == "place_order" else
               "a change that never happened."),
            expected="nothing of the failed transaction: every event belongs to an order "
                     "version that exists",
            actual=f"outbox_event rows {events}, order versions {announced}{outcome}",
            evidence=state(engine), lesson=MISTAKES,
            fix="write the event on the same connection (`conn`) as the business row, inside "
                "the one `with engine.begin() as conn:` block — not through engine.begin() or "
                "a session of its own")
    raise CheckFailure(
        f"A failed COMMIT inside {function} left the order's change without its event.",
        expected="both rows committed, or neither",
        actual=f"outbox_event rows {events}, order versions {announced}{outcome}",
        evidence=state(engine), lesson=MISTAKES)


def test_concurrent_changes_of_one_order_take_turns(outbox, learner):
    require_table(outbox, "outbox_event", "schema")
    orders = learner.module("orders")
    order_id = call(orders.place_order, outbox, uuid.uuid4(), 1234)
    totals = (2345, 3456, 4567)
    warm_pool(outbox, RACERS)
    # Each change is held just before its UPDATE until every other change is held there too,
    # waits for a row lock, or has finished: all three have read the order by then, unless the
    # read took the row lock and the others wait for it. A barrier, not a pause: it holds
    # however slow the machine is.
    with update_barrier(outbox, RACERS) as barrier:
        outcomes = run_concurrently(barrier.racer(
            lambda i: call(orders.change_order_total, outbox, order_id, totals[i])), RACERS,
            timeout=30)
    errors = [o for o in outcomes if o.error is not None]
    events = outbox_rows(outbox, "aggregate_id::text = :id", id=str(order_id))
    chain = [{"version": e["aggregate_version"], "event_type": e["event_type"],
              "total_cents": (e["payload"] or {}).get("total_cents"),
              "previous_total_cents": (e["payload"] or {}).get("previous_total_cents")}
             for e in sorted(events, key=lambda e: e["aggregate_version"])]
    evidence = table(chain, ("version", "event_type", "total_cents", "previous_total_cents"))
    if errors:
        raise CheckFailure(
            f"Three changes of one order ran at the same time and {len(errors)} of them failed. "
            "Concurrent changes must take turns on the order's row lock, not collide.",
            expected="all three succeed, with versions 2, 3 and 4",
            actual="; ".join(f"{type(o.error).__name__}: {first_line(o.error)[:120]}"
                             for o in errors),
            evidence=evidence, lesson=SEE)
    versions = sorted(o.value for o in outcomes)
    [order] = order_rows(outbox)
    broken = [c for prev, c in zip(chain, chain[1:], strict=False)
              if c["previous_total_cents"] != prev["total_cents"]]
    if versions != [2, 3, 4] or [c["version"] for c in chain] != [1, 2, 3, 4]:
        raise CheckFailure(
            "Three changes of one order ran at the same time: each must get its own next "
            "version.",
            expected="change_order_total returns 2, 3 and 4; events versions 1, 2, 3, 4",
            actual=f"returned {versions}; event versions {[c['version'] for c in chain]}",
            evidence=evidence, lesson=SEE)
    echoed = [c for c in broken if c["previous_total_cents"] == c["total_cents"]]
    if broken and len(echoed) == len(broken):
        raise CheckFailure(
            "Three changes of one order ran at the same time; in each, previous_total_cents "
            "equals the event's own new total: it was read after the UPDATE (RETURNING gives the "
            "row as changed), not before.",
            expected="each event's previous_total_cents = the total_cents of the version before "
                     "it",
            actual="version(s) " + ", ".join(
                f"{c['version']} say previous {c['previous_total_cents']}" for c in broken),
            evidence=evidence, lesson=SEE,
            fix="read the order (SELECT … FOR UPDATE) before updating it and put that total in "
                "the event")
    if broken or (order["total_cents"], order["version"]) != (chain[-1]["total_cents"], 4):
        raise CheckFailure(
            f"Three changes of one order ran at the same time and {len(broken)} event(s) carry "
            "a previous_total_cents that is not the total the version before them set: those "
            "changes read the order before another change had committed, and a consumer that "
            "applies the differences ends up with a wrong total.",
            expected="each event's previous_total_cents = the total_cents of the version before "
                     "it; the order at version 4 with the last event's total",
            actual=f"{len(broken)} event(s) whose previous_total_cents is not the total before "
                   f"them; the order is at version {order['version']}, total "
                   f"{order['total_cents']}",
            evidence=evidence, lesson=f"{SEE} {MISTAKES}",
            fix="read the order with SELECT … FOR UPDATE before changing it: the row lock makes "
                "concurrent changes take turns, each reading what the previous one wrote"
            if broken and not echoed else None)
    require_created_in_version_order(outbox, orders)


def require_created_in_version_order(engine: Engine, orders: Any) -> None:
    """Three changes of one order begin their transactions in one order (0, 1, 2) and get the
    row lock in the opposite one (2, then 1, then 0): each event's created_at must still follow
    its version, because the claim sends by created_at. `now()` is the transaction's start and
    gives version 2 the latest time of the three."""
    order_id = call(orders.place_order, engine, uuid.uuid4(), 500)
    warm_pool(engine, RACERS)
    with begin_in_order_lock_in_reverse(engine, RACERS) as turns:
        outcomes = run_concurrently(turns.racer(
            lambda i: call(orders.change_order_total, engine, order_id, 600 + i)), RACERS,
            timeout=30)
    for outcome in outcomes:
        if outcome.error is not None:
            raise outcome.error
    with engine.connect() as conn:
        chain = [dict(r) for r in conn.execute(text(
            "SELECT aggregate_version AS version, created_at::text AS created_at "
            "FROM outbox_event WHERE aggregate_id::text = :id ORDER BY aggregate_version"),
            {"id": str(order_id)}).mappings()]
        in_order = [r["version"] for r in conn.execute(text(
            "SELECT aggregate_version AS version FROM outbox_event "
            "WHERE aggregate_id::text = :id ORDER BY created_at, aggregate_version"),
            {"id": str(order_id)}).mappings()]
        ties = conn.execute(text(
            "SELECT count(*) - count(DISTINCT created_at) FROM outbox_event "
            "WHERE aggregate_id::text = :id"), {"id": str(order_id)}).scalar_one()
    if in_order != [1, 2, 3, 4] or ties:
        raise CheckFailure(
            "Three changes of one order began their transactions in one order and took the "
            "order's row lock in the opposite one (the check made them). Their events' "
            "created_at does not follow their versions: created_at was taken at the "
            "transaction's start (now(), or a time the code passed in), not at the insert. The "
            "claim sends by created_at, so a consumer would get version 3 before version 2.",
            expected="created_at increasing with aggregate_version: versions 1, 2, 3, 4 in "
                     "created_at order",
            actual=f"versions in created_at order: {in_order}"
                   + (f" ({ties} tie(s))" if ties else ""),
            evidence=table(chain, ("version", "created_at")), lesson=SEE,
            fix="leave created_at to its default, clock_timestamp() (the time of the insert): "
                "do not write now() into it")


class _Racers:
    """What the racing changes share: which of them finished, and a condition to wait on."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.done: set[int] = set()
        self.cond = threading.Condition()

    def racer(self, fn: Any) -> Any:
        def run(i: int) -> Any:
            try:
                return fn(i)
            finally:
                with self.cond:
                    self.done.add(i)
                    self.cond.notify_all()
        return run


def racer_index() -> int | None:
    name = threading.current_thread().name
    return int(name.rsplit("-", 1)[1]) if name.startswith("dojo-worker-") else None


class _UpdateBarrier(_Racers):
    def __init__(self, n: int) -> None:
        super().__init__(n)
        self.held = 0
        self.generation = 0


def lock_waiters(engine: Engine) -> int:
    """Sessions of this database (other than the asking one) waiting for a lock now."""
    return count(engine, "SELECT count(*) FROM pg_stat_activity WHERE datname = "
                         "current_database() AND wait_event_type = 'Lock' "
                         "AND pid <> pg_backend_pid()")


@contextmanager
def update_barrier(engine: Engine, n: int) -> Iterator[_UpdateBarrier]:
    """Hold each racer before its `UPDATE orders` until every racer is held there, waits for a
    lock, or has finished; then let the held ones go together. Safety net: 10 s."""
    from sqlalchemy import event

    barrier = _UpdateBarrier(n)
    pattern = re.compile(UPDATE_ORDERS, re.IGNORECASE | re.DOTALL)

    def before(conn: Any, cursor: Any, statement: str, *rest: Any) -> None:
        if racer_index() is None or not pattern.search(statement):
            return
        with barrier.cond:
            barrier.held += 1
            mine = barrier.generation
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with barrier.cond:
                if barrier.generation != mine:
                    return
                parked = barrier.held + len(barrier.done)
            if parked >= n or parked + lock_waiters(engine) >= n:
                with barrier.cond:
                    if barrier.generation == mine:
                        barrier.generation += 1
                        barrier.held = 0
                        barrier.cond.notify_all()
                    return
            with barrier.cond:
                barrier.cond.wait(0.005)
        with barrier.cond:  # the safety net: never hang a check
            barrier.held = max(0, barrier.held - 1)

    event.listen(engine, "before_cursor_execute", before)
    try:
        yield barrier
    finally:
        event.remove(engine, "before_cursor_execute", before)


class _Turns(_Racers):
    def __init__(self, n: int) -> None:
        super().__init__(n)
        self.begun = 0
        self.seen: set[int] = set()


@contextmanager
def begin_in_order_lock_in_reverse(engine: Engine, n: int) -> Iterator[_Turns]:
    """At its first statement, racer i waits for racers 0 … i-1 to begin their transactions,
    begins its own (a SELECT 1 on its connection: now() is fixed from here), and then waits
    until racers i+1 … n-1 have finished before it runs on. Transactions start 0, 1, 2; the
    changes run 2, 1, 0, one after the other. Safety net: 10 s per wait."""
    from sqlalchemy import event

    turns = _Turns(n)

    def before(conn: Any, cursor: Any, statement: str, *rest: Any) -> None:
        i = racer_index()
        if i is None or i in turns.seen:
            return
        turns.seen.add(i)
        with turns.cond:
            turns.cond.wait_for(lambda: turns.begun >= i, timeout=10)
        cursor.connection.execute("SELECT 1")  # the transaction (and its now()) starts here
        with turns.cond:
            turns.begun = max(turns.begun, i + 1)
            turns.cond.notify_all()
            turns.cond.wait_for(lambda: turns.done >= set(range(i + 1, n)), timeout=10)

    event.listen(engine, "before_cursor_execute", before)
    try:
        yield turns
    finally:
        event.remove(engine, "before_cursor_execute", before)


def warm_pool(engine: Engine, n: int) -> None:
    """Open n pooled connections now, so racing workers do not spend their head start
    connecting."""
    conns = [engine.connect() for _ in range(n)]
    for conn in conns:
        conn.close()
