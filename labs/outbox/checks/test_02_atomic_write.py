"""Stage atomic-write: the business row and its outbox row commit together, or neither does."""

from __future__ import annotations

import uuid

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
from dojo.checks.faults import InjectedFault, fail_sql

pytestmark = pytest.mark.stage("atomic-write")
SEE = READ["atomic-write"]

ROW_COLUMNS = ("id", "aggregate_type", "aggregate_id", "event_type", "aggregate_version",
               "payload", "published_at")
INSERT_OUTBOX = r"\binsert\s+into\s+(public\.)?\"?outbox_event\b"
INSERT_ORDERS = r"\binsert\s+into\s+(public\.)?\"?orders\b"


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
    order_id = call(orders.place_order, outbox, uuid.uuid4(), 1000)
    versions = [call(orders.change_order_total, outbox, order_id, total)
                for total in (1500, 1200)]
    events = outbox_rows(outbox, "aggregate_id::text = :id", id=str(order_id))
    got = [(e["aggregate_version"], e["event_type"], (e["payload"] or {}).get("total_cents"),
            (e["payload"] or {}).get("previous_total_cents")) for e in events]
    want = [(1, "order.placed.v1", 1000, None), (2, "order.total-changed.v1", 1500, 1000),
            (3, "order.total-changed.v1", 1200, 1500)]
    if not (versions == [2, 3] and got == want):
        raise CheckFailure(
            "Each change to an order writes one event with the next aggregate version, so a "
            "consumer can tell order and gaps; the first event of an aggregate is version 1.",
            expected=f"change_order_total returns [2, 3]; events (version, type, total, previous) "
                     f"{want}",
            actual=f"returned {versions}; events {got}", evidence=state(outbox),
            lesson=SEE)
    [order] = order_rows(outbox)
    if order["version"] != 3:
        raise CheckFailure("After two changes the order itself must be at version 3.",
                           expected="orders.version 3", actual=f"orders.version {order['version']}",
                           evidence=state(outbox), lesson=SEE)
    error = raised(orders.change_order_total, outbox, uuid.uuid4(), 1)
    if not isinstance(error, LookupError):
        raise CheckFailure("change_order_total of an order that does not exist must refuse.",
                           expected="LookupError (KeyError is one)", actual=first_line(error),
                           lesson=SEE)
