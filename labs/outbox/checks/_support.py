"""Helpers for the outbox checks: set up state through SQL, observe PostgreSQL and Kafka from
the outside, and write failure messages that show the evidence.

Nothing here reads the learner's internals: only the documented tables and functions.
"""

from __future__ import annotations

import json
import re
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, event, text

OUTBOX = "transactional-outbox"
CONSUMER = "idempotent-consumer"

# The lesson section each stage's failures send the learner to (lab.yaml says the same).
READ = {
    "schema": f"{OUTBOX}#schema",
    "atomic-write": f"{OUTBOX}#writing-the-event-in-the-business-transaction-spring",
    "claim": f"{OUTBOX}#claiming-for-update-skip-locked-and-leases",
    "publish": f"{OUTBOX}#publishing-key-headers-acknowledgement-conditional-mark",
    "crash-safety": f"{OUTBOX}#delivery-is-at-least-once",
    "backoff": f"{OUTBOX}#when-a-send-fails-backoff-attempts-last_error",
    "idempotent-consumer": f"{CONSUMER}#marker-and-effect-in-one-transaction",
    "cleanup": f"{OUTBOX}#cleanup-without-losing-events",
    "measure": f"{OUTBOX}#measuring-and-sizing",
}
MISTAKES = f"{OUTBOX}#common-mistakes"

OUTBOX_COLUMNS = ("id", "aggregate_type", "aggregate_id", "event_type", "aggregate_version",
                  "payload", "headers", "created_at", "published_at", "lease_until",
                  "attempt_count", "last_error", "next_attempt_at")

# The claim query the README documents, used before the learner has written their own.
DOCUMENTED_CLAIM = """
SELECT id FROM outbox_event
WHERE published_at IS NULL
  AND (lease_until IS NULL OR lease_until < clock_timestamp())
  AND (next_attempt_at IS NULL OR next_attempt_at <= clock_timestamp())
ORDER BY created_at
LIMIT 100
FOR UPDATE SKIP LOCKED
"""


# -- messages ---------------------------------------------------------------------------------

def explain(what: str, *, expected: str, actual: str, state: str = "", read: str = "") -> str:
    """A failure message: what went wrong, expected vs actual, the evidence, where to read."""
    parts = [what, f"  expected: {expected}", f"  actual:   {actual}"]
    if state:
        parts.append("  evidence:\n" + indent(state, 4))
    if read:
        parts.append(f"  read: lesson {read}")
    return "\n".join(parts)


def indent(block: str, spaces: int) -> str:
    pad = " " * spaces
    return "\n".join(pad + line for line in block.rstrip().splitlines())


def short(value: Any, width: int = 38) -> str:
    text_value = value if isinstance(value, str) else json.dumps(value, default=str) \
        if isinstance(value, dict | list) else str(value)
    return text_value if len(text_value) <= width else text_value[:width - 1] + "…"


def table(rows: Sequence[dict[str, Any]], columns: Sequence[str], limit: int = 12,
          width: int = 38) -> str:
    """Rows as a small fixed-width table (at most `limit` rows, then a count)."""
    if not rows:
        return "(no rows)"
    cells = [[short(row.get(col), width) for col in columns] for row in rows[:limit]]
    widths = [max(len(col), *(len(r[i]) for r in cells)) for i, col in enumerate(columns)]
    lines = ["  ".join(col.ljust(w) for col, w in zip(columns, widths, strict=True))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in cells]
    if len(rows) > limit:
        lines.append(f"… and {len(rows) - limit} more rows")
    return "\n".join(lines)


def call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call a learner function; a NotImplementedError becomes a plain 'not written yet'."""
    try:
        return fn(*args, **kwargs)
    except NotImplementedError as exc:
        not_written(exc)


def not_written(exc: BaseException) -> None:
    """Fail with the name of the learner function that is still a stub, and its to-do."""
    frame = exc.__traceback__
    while frame is not None and frame.tb_next is not None:
        frame = frame.tb_next
    where = "a function"
    if frame is not None:
        code = frame.tb_frame.f_code
        where = f"{Path(code.co_filename).stem}.{code.co_name}()"
    pytest.fail(f"{where} is not written yet. It says:\n    {exc}\n"
                "  Write it as the lab README describes, then run the check again.",
                pytrace=False)


def norm_id(value: Any) -> str:
    return str(uuid.UUID(str(value)))


# -- schema and rows --------------------------------------------------------------------------

def apply_schema(engine: Engine, learner_dir: Path) -> None:
    path = learner_dir / "schema.sql"
    if not path.exists():
        pytest.fail(f"schema.sql is missing from {learner_dir}: the lab expects it.",
                    pytrace=False)
    sql = path.read_text()
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql(sql)
    except Exception as exc:
        detail = getattr(exc, "orig", exc)
        pytest.fail(f"schema.sql does not run on a fresh database:\n{indent(str(detail), 4)}",
                    pytrace=False)


def has_table(engine: Engine, name: str) -> bool:
    with engine.connect() as conn:
        return conn.execute(text("SELECT to_regclass(:n) IS NOT NULL"), {"n": name}).scalar_one()


TABLE_STAGE = {"outbox_event": "schema", "processed_event": "idempotent-consumer"}


def require_table(engine: Engine, name: str, stage: str) -> None:
    """Fail plainly when a table the check (of `stage`) needs is not in schema.sql yet."""
    if not has_table(engine, name):
        pytest.fail(f"There is no table {name} after running schema.sql.\n"
                    f"  Add its CREATE TABLE to schema.sql (README, stage "
                    f"{TABLE_STAGE.get(name, stage)}).", pytrace=False)


def insert_event(engine: Engine, *, aggregate_id: str | None = None,
                 aggregate_type: str = "order", event_type: str = "order.placed.v1",
                 version: int = 1, payload: Any = None, headers: dict[str, Any] | None = None,
                 created_ago: float = 0.0, published_ago: float | None = None,
                 attempt_count: int = 0) -> str:
    """Insert one outbox row with the documented columns; returns its id."""
    event_id = str(uuid.uuid4())
    aggregate_id = aggregate_id or str(uuid.uuid4())
    if payload is None:
        payload = {"order_id": aggregate_id, "customer_id": str(uuid.uuid4()),
                   "total_cents": 1000}
    with engine.begin() as conn:
        conn.execute(text(
            "INSERT INTO outbox_event (id, aggregate_type, aggregate_id, event_type, "
            "aggregate_version, payload, headers, created_at, published_at, attempt_count) "
            "VALUES (:id, :atype, :aid, :etype, :version, CAST(:payload AS jsonb), "
            "CAST(:headers AS jsonb), clock_timestamp() - make_interval(secs => :cago), "
            "CASE WHEN CAST(:pago AS float8) IS NULL THEN NULL "
            "ELSE clock_timestamp() - make_interval(secs => CAST(:pago AS float8)) END, "
            ":attempts)"),
            {"id": event_id, "atype": aggregate_type, "aid": aggregate_id, "etype": event_type,
             "version": version, "payload": json.dumps(payload),
             "headers": json.dumps(headers or {}), "cago": created_ago, "pago": published_ago,
             "attempts": attempt_count})
    return event_id


def insert_many(engine: Engine, count: int, *, published: bool, created_ago: float = 0.0,
                published_ago: float = 0.0) -> None:
    """Insert `count` rows at once (distinct aggregates), published or not."""
    with engine.begin() as conn:
        conn.execute(text(
            "INSERT INTO outbox_event (id, aggregate_type, aggregate_id, event_type, "
            "aggregate_version, payload, headers, created_at, published_at) "
            "SELECT gen_random_uuid(), 'order', gen_random_uuid(), 'order.placed.v1', 1, "
            "jsonb_build_object('n', g), '{}'::jsonb, "
            "clock_timestamp() - make_interval(secs => :cago) + g * interval '1 microsecond', "
            "CASE WHEN :published THEN clock_timestamp() - make_interval(secs => :pago) END "
            "FROM generate_series(1, :count) AS g"),
            {"count": count, "published": published, "cago": created_ago,
             "pago": published_ago})


def _readable(column: str) -> str:
    # As text: a timestamp past year 9999 (a runaway backoff) must show, not crash the check.
    return f"{column}::text AS {column}" if column.endswith(("_at", "_until")) else column


def outbox_rows(engine: Engine, where: str = "TRUE", **params: Any) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        rows = conn.execute(text(
            f"SELECT {', '.join(_readable(c) for c in OUTBOX_COLUMNS)}, "
            "extract(epoch FROM lease_until - clock_timestamp()) AS lease_left, "
            "extract(epoch FROM next_attempt_at - clock_timestamp()) AS retry_in "
            f"FROM outbox_event WHERE {where} ORDER BY created_at, id"), params).mappings().all()
    return [dict(row) | {"id": str(row["id"]), "aggregate_id": str(row["aggregate_id"])}
            for row in rows]


def count(engine: Engine, sql: str, **params: Any) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text(sql), params).scalar_one())


# -- catalog and plans ------------------------------------------------------------------------

def indexes(engine: Engine) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        rows = conn.execute(text("""
            SELECT c.relname AS name, i.indisprimary AS is_primary, i.indisunique AS is_unique,
                   pg_get_expr(i.indpred, i.indrelid) AS predicate,
                   pg_get_indexdef(i.indexrelid) AS definition,
                   ARRAY(SELECT a.attname FROM unnest(i.indkey) k
                         JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k)
                       AS columns
            FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
            WHERE i.indrelid = 'outbox_event'::regclass ORDER BY c.relname""")).mappings().all()
    return [dict(row) for row in rows]


def plan_nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    nodes = [plan]
    for child in plan.get("Plans", []):
        nodes += plan_nodes(child)
    return nodes


def explain_uses_partial_index(engine: Engine, sql: str, params: Any = None
                               ) -> tuple[bool, list[str], str]:
    """(uses a partial index on outbox_event and never seq-scans it, the partial index names,
    the plan as text)."""
    partial = {ix["name"] for ix in indexes(engine) if ix["predicate"]}
    with engine.connect() as conn:
        with conn.begin():
            plan_json = conn.exec_driver_sql(f"EXPLAIN (FORMAT JSON) {sql}",
                                             params or {}).scalar_one()
            plan_text = "\n".join(r[0] for r in conn.exec_driver_sql(
                f"EXPLAIN {sql}", params or {}))
            conn.rollback()
    plan = plan_json if isinstance(plan_json, list) else json.loads(plan_json)
    nodes = [n for n in plan_nodes(plan[0]["Plan"]) if n.get("Relation Name") == "outbox_event"
             or n.get("Index Name") in partial]
    seq = any(n["Node Type"] == "Seq Scan" for n in nodes)
    used = any(n.get("Index Name") in partial for n in nodes)
    return used and not seq, sorted(partial), plan_text


def fill_with_published_rows(engine: Engine) -> None:
    insert_many(engine, 20000, published=True, created_ago=7200, published_ago=3600)
    insert_many(engine, 30, published=False, created_ago=5)
    with engine.begin() as conn:
        conn.execute(text("ANALYZE outbox_event"))


# -- watching the database --------------------------------------------------------------------

def other_sessions(engine: Engine) -> list[dict[str, Any]]:
    """Sessions in this database other than the observer: state, how long their transaction has
    been open, and the locks they hold on outbox_event."""
    with engine.connect() as conn:
        rows = conn.execute(text("""
            SELECT a.pid, a.state,
                   round(extract(epoch FROM clock_timestamp() - a.xact_start)::numeric, 2)
                       AS xact_open_s,
                   a.wait_event_type AS waiting_on, pg_blocking_pids(a.pid) AS blocked_by,
                   left(regexp_replace(a.query, '\\s+', ' ', 'g'), 70) AS last_query,
                   (SELECT string_agg(l.mode, ',' ORDER BY l.mode) FROM pg_locks l
                     WHERE l.pid = a.pid AND l.relation = to_regclass('outbox_event'))
                       AS outbox_locks
            FROM pg_stat_activity a
            WHERE a.datname = current_database() AND a.pid <> pg_backend_pid()
              AND a.backend_type = 'client backend'
            ORDER BY a.pid""")).mappings().all()
    return [dict(row) for row in rows]


SESSION_COLUMNS = ("pid", "state", "xact_open_s", "waiting_on", "blocked_by", "outbox_locks",
                   "last_query")


def open_transactions(sessions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Sessions sitting in an open transaction, or holding locks on outbox_event."""
    return [s for s in sessions
            if (s["xact_open_s"] is not None and
                (s["state"] or "").startswith("idle in transaction")) or s["outbox_locks"]]


@dataclass
class Statement:
    sql: str
    params: Any
    rowcount: int
    xid: str | None
    thread: int


@contextmanager
def record_sql(engine: Engine, *, with_xid: bool = False) -> Iterator[list[Statement]]:
    """Every statement run through `engine` while inside, with its row count (and, with
    `with_xid`, the id of the transaction it ran in)."""
    log: list[Statement] = []

    def after(conn: Any, cursor: Any, statement: str, params: Any, *_: Any) -> None:
        xid = None
        if with_xid:
            row = cursor.connection.execute(
                "SELECT pg_current_xact_id_if_assigned()::text").fetchone()
            xid = row[0] if row else None
        log.append(Statement(statement, params, cursor.rowcount, xid, threading.get_ident()))

    event.listen(engine, "after_cursor_execute", after)
    try:
        yield log
    finally:
        event.remove(engine, "after_cursor_execute", after)


def touches_outbox(statement: str) -> bool:
    return re.search(r"\boutbox_event\b", statement, re.IGNORECASE) is not None
