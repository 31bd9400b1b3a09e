"""Stage sql-comments: `trace_sql(engine)` makes every statement run inside a span carry
/*traceparent='…'*/ with that span's context, visible in pg_stat_activity; statements outside
a span go unchanged."""

from __future__ import annotations

import re
import time
from typing import Any

import pytest
from _support import (
    READ,
    hex_span,
    order_body,
    parse_traceparent,
    produce_orders,
    span_id_hex,
    spans_table,
    trace_id_hex,
    traceparent,
)
from opentelemetry import trace as otel_trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags
from sqlalchemy import event, text

from dojo.checks import CheckFailure, call, in_thread, short, table

pytestmark = pytest.mark.stage("sql-comments")
SEE = READ["sql-comments"]
ON_ASYNCIO = (" handle_order_async runs this step on a thread of the loop's executor: "
              "asyncio.to_thread copies the request's context there, loop.run_in_executor "
              "does not.")
COMMENT = re.compile(r"/\*(?:(?!\*/).)*?\btraceparent='([^']*)'(?:(?!\*/).)*\*/", re.DOTALL)


def comment_in(statement: str) -> str | None:
    """The traceparent of a sqlcommenter comment in `statement` (None: no such comment)."""
    found = COMMENT.search(statement)
    return found.group(1) if found else None


def waiting_statement(engine: Any, table_name: str, timeout: float = 15.0) -> dict[str, Any]:
    """The statement of the first other session that waits on a lock and names the table,
    as pg_stat_activity shows it to a DBA."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with engine.connect() as conn:
            rows = conn.execute(text(
                "SELECT pid, state, wait_event_type, query, application_name "
                "FROM pg_stat_activity WHERE datname = current_database() "
                "AND pid <> pg_backend_pid() AND wait_event_type = 'Lock'")).mappings().all()
        for row in rows:
            if table_name in row["query"]:
                return dict(row)
        time.sleep(0.02)
    return {}


def traced(shop: Any) -> None:
    call(shop.telemetry.trace_sql, shop.deps.engine)


def verify_visible(shop: Any, seen: dict[str, Any], trace: str, where: str,
                   on_asyncio: bool = False) -> None:
    if not seen:
        raise CheckFailure(
            f"The check held a lock so that {where} would wait, but no statement of yours "
            "waited for it.", expected="a session waiting on the lock",
            actual="none within 15 s", lesson=SEE)
    found = comment_in(seen["query"])
    parsed = parse_traceparent(found)
    ids = {hex_span(s) for s in shop.spans.of_trace(trace)}
    if parsed is None or parsed[0] != trace or parsed[1] not in ids:
        raise CheckFailure(
            f"A DBA looking at pg_stat_activity while {where} waits on a lock must see which "
            "request sent it: the statement must carry a sqlcommenter comment "
            "/*traceparent='00-<trace id>-<span id>-<flags>'*/ naming the current span."
            + (ON_ASYNCIO if on_asyncio else ""),
            expected="/*traceparent='…'*/ with the request's trace id and one of its spans",
            actual=("no traceparent comment" if found is None
                    else f"traceparent={found!r}, not this request's span"),
            evidence=f"pg_stat_activity.query (pid {seen['pid']}):\n  "
            + short(seen["query"], 400) + f"\nrequest trace id: {trace}\n"
            + spans_table(shop.spans.of_trace(trace)),
            lesson=SEE)


def test_a_held_insert_shows_its_traceparent_in_pg_stat_activity(shop, database):
    traced(shop)
    trace = trace_id_hex()
    server = shop.server
    with database.engine.connect() as blocker:
        blocker.execute(text("LOCK TABLE orders IN SHARE ROW EXCLUSIVE MODE"))
        job = in_thread(server.post, order_body(), {"traceparent": traceparent(trace)})
        seen = waiting_statement(database.engine, "orders")
        blocker.rollback()
    answer = job.result(30)
    if answer.status != 201:
        raise CheckFailure("POST /orders must place the order.", expected="201",
                           actual=str(answer.status), evidence=str(answer.body)[:400],
                           lesson=SEE)
    verify_visible(shop, seen, trace, "the API's INSERT INTO orders")


LOOP_HELD_S = 0.8
LOOP_BLOCKED_S = 0.5

def test_on_asyncio_a_held_insert_shows_its_traceparent(shop, database):
    # handle_order_async runs the INSERT on a thread of the loop's executor: the request's
    # context must go with it (asyncio.to_thread copies it; loop.run_in_executor does not).
    # It must not run it on the loop itself: held here LOOP_HELD_S, a blocking INSERT would
    # stop every other task of the loop that long (a ticker of the check's shows it).
    traced(shop)
    trace = trace_id_hex()
    ticks: list[float] = []
    with database.engine.connect() as blocker:
        blocker.execute(text("LOCK TABLE orders IN SHARE ROW EXCLUSIVE MODE"))
        job = in_thread(shop.post_async, order_body(), {"traceparent": traceparent(trace)},
                        ticks)
        seen = waiting_statement(database.engine, "orders")
        time.sleep(LOOP_HELD_S)
        blocker.rollback()
    answer = job.result(30)
    if answer.status != 201:
        raise CheckFailure("handle_order_async must place the order.", expected="201",
                           actual=str(answer.status), evidence=str(answer.body)[:400],
                           lesson=SEE)
    gaps = [b - a for a, b in zip(ticks, ticks[1:], strict=False)]
    if gaps and max(gaps) >= LOOP_BLOCKED_S:
        raise CheckFailure(
            "handle_order_async ran the INSERT on the event loop itself: while the check held "
            f"the orders table locked ({LOOP_HELD_S:g} s after the INSERT began to wait) the "
            f"loop ran nothing else for {max(gaps):.2f} s. On a server every other request of "
            "that loop stops with it. A blocking step (the database, the inventory call, the "
            "Kafka send) goes to a thread: await asyncio.to_thread(...), which also copies the "
            "request's context there.",
            expected=f"the loop free while the INSERT waits (no pause of {LOOP_BLOCKED_S:g} s "
                     "or more)",
            actual=f"the loop stopped for {max(gaps):.2f} s", lesson=SEE,
            fix="await asyncio.to_thread(shop.insert_order, ...) instead of calling it on the "
                "loop")
    verify_visible(shop, seen, trace, "the INSERT INTO orders of handle_order_async",
                   on_asyncio=True)


def test_the_consumers_statements_carry_its_trace(shop, database):
    traced(shop)
    trace = trace_id_hex()
    produce_orders(shop, [[("traceparent", traceparent(trace, span_id_hex()).encode())]])
    with database.engine.connect() as blocker:
        blocker.execute(text("LOCK TABLE shipments IN SHARE ROW EXCLUSIVE MODE"))
        job = in_thread(shop.consume, 1)
        seen = waiting_statement(database.engine, "shipments")
        blocker.rollback()
    job.result(30)
    verify_visible(shop, seen, trace, "the consumer's INSERT INTO shipments")


class Statements:
    """Every statement sent through `engine` while open, with the span current when it ran
    (read by a listener of the check's, after the learner's has run)."""

    def __init__(self, engine: Any, unsampled: frozenset[str] = frozenset()) -> None:
        self.engine = engine
        self.ran: list[dict[str, Any]] = []
        # traces a caller sent with flags 00: their statements' flags must be 00, whatever
        # span was current (a parser that sets the sampled flag makes it a sampled span)
        self.unsampled = unsampled

    def _after(self, conn: Any, cursor: Any, statement: str, *rest: Any) -> None:
        context = otel_trace.get_current_span().get_span_context()
        self.ran.append({"statement": statement,
                         "current": (f"{context.trace_id:032x}", f"{context.span_id:016x}",
                                     f"{int(context.trace_flags):02x}")
                         if context.is_valid else None})

    def __enter__(self) -> Statements:
        event.listen(self.engine, "after_cursor_execute", self._after)
        return self

    def __exit__(self, kind: Any, error: Any, tb: Any) -> None:
        event.remove(self.engine, "after_cursor_execute", self._after)
        text_of = str(error) if error is not None else ""
        if "placeholder" in text_of and "/*" in text_of:
            # psycopg refused a statement of the check's, with parameters, because of a % the
            # learner's comment added: say so, rather than "the check raised"
            raise CheckFailure(
                "A statement with parameters failed once your comment was added: the driver "
                "reads every % in the statement as the start of a placeholder, and your "
                "comment put one there (a URL-encoded value, such as %3A).",
                expected="every statement runs, its comment appended",
                actual=short(text_of.splitlines()[0], 200),
                evidence=short(text_of, 600),
                fix="leave out values that need encoding, or double every % of the comment "
                    "(%%) when the statement has parameters",
                lesson=SEE) from error

    def compared(self) -> tuple[list[dict[str, str]], int]:
        """One row per statement (its comment against the span current when it ran), and
        how many are wrong."""
        rows, wrong = [], 0
        for item in self.ran:
            found = comment_in(item["statement"])
            parsed = parse_traceparent(found)
            current = item["current"]
            if current is None:
                ok = found is None
                want = "no comment"
            else:
                flags = "00" if current[0] in self.unsampled else current[2]
                ok = parsed is not None and parsed == (current[0], current[1], flags)
                want = f"00-{current[0]}-{current[1]}-{flags}"
            wrong += not ok
            rows.append({"statement": " ".join(item["statement"].split()), "expected": want,
                         "found": found if found is not None else "(none)",
                         "ok": "yes" if ok else "NO"})
        return rows, wrong


def test_every_statement_in_a_span_carries_it_and_none_outside(shop):
    traced(shop)
    engine = shop.deps.engine
    unsampled_trace = trace_id_hex()  # a caller that did not sample its trace (flags 00)
    with Statements(engine, frozenset({unsampled_trace})) as statements:
        shop.server.post(order_body(), {"traceparent": traceparent()})
        shop.server.post(order_body(), {"traceparent": traceparent(unsampled_trace,
                                                                   flags="00")})
        produce_orders(shop, [[("traceparent", traceparent().encode())]])
        shop.consume(2)  # the two orders the API published: the second one unsampled
        with shop.spans.tracer.start_as_current_span("a report the check runs"):
            with engine.connect() as conn:
                conn.execute(text("SELECT count(*) FROM orders WHERE total_cents > :n"),
                             {"n": 1713})
        # A trace someone upstream did not sample: flags 00, and the comment must say so.
        unsampled = SpanContext(int(trace_id_hex(), 16), int(span_id_hex(), 16),
                                is_remote=False, trace_flags=TraceFlags(0))
        with otel_trace.use_span(NonRecordingSpan(unsampled)), engine.connect() as conn:
            conn.execute(text("SELECT count(*) AS in_an_unsampled_trace FROM shipments"))
        with engine.connect() as conn:
            conn.execute(text("SELECT 1 AS outside_any_span"))
    rows, wrong = statements.compared()
    in_unsampled = [item for item in statements.ran
                    if item["current"] and item["current"][0] == unsampled_trace]
    if wrong or len(rows) < 7 or len(in_unsampled) < 2:
        raise CheckFailure(
            "Every statement must carry the traceparent of the span current when it runs (the "
            "API's, the consumer's, any other), and a statement run outside any span must go "
            "unchanged: no comment with made-up or stale ids, and the flags are the span's (00 "
            "when the trace is not sampled: a request whose caller sent flags 00, and the "
            "record it published, stay 00 in every comment).",
            expected="each statement's comment names its current span and its flags; none outside "
                     "a span",
            actual=f"{wrong} of {len(rows)} statements wrong",
            evidence=table(rows, ("statement", "expected", "found", "ok"), width=60,
                           limit=15), lesson=SEE)


def test_a_transaction_across_spans_comments_each_statement_with_its_own_span(shop):
    # A transaction is no span: it can begin outside any span or in one span and go on in a
    # child span or after its span ended. Each statement names the span current when it runs.
    traced(shop)
    engine, tracer = shop.deps.engine, shop.spans.tracer
    with Statements(engine) as statements:
        with engine.connect() as conn:
            conn.execute(text("SELECT 17 AS begun_outside_any_span"))
            with tracer.start_as_current_span("a step the check runs"):
                conn.execute(text("SELECT count(*) AS in_a_span FROM orders "
                                  "WHERE quantity > :q"), {"q": 3})
                with tracer.start_as_current_span("a nested step"):
                    conn.execute(text("SELECT count(*) AS in_a_nested_span FROM shipments"))
            conn.execute(text("SELECT 29 AS after_the_spans_ended"))
            conn.commit()
        with tracer.start_as_current_span("a unit of work"), engine.begin() as conn:
            conn.execute(text("SELECT 41 AS begun_in_a_span"))
            with tracer.start_as_current_span("one step of it"):
                conn.execute(text("SELECT 53 AS in_its_child_span"))
        with engine.connect() as conn:
            with tracer.start_as_current_span("opens the transaction"):
                conn.execute(text("SELECT 67 AS begun_in_a_span_that_ends"))
            conn.execute(text("SELECT 71 AS after_that_span_ended"))
            conn.rollback()
    rows, wrong = statements.compared()
    if wrong or len(rows) < 7:
        raise CheckFailure(
            "A transaction is not a span: it can begin outside any span, or in one span and "
            "go on in a child span or after its span ended. Each statement must carry the "
            "span current when that statement runs (read it in before_cursor_execute, every "
            "time), not the one current when the transaction or the connection began.",
            expected="each statement's comment names the span current when it ran; none "
                     "outside a span",
            actual=f"{wrong} of {len(rows)} statements wrong",
            evidence=table(rows, ("statement", "expected", "found", "ok"), width=60,
                           limit=15), lesson=SEE)
