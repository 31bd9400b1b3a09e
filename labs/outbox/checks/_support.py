"""What only the outbox checks need: its lesson sections, rows inserted through the documented
columns, the outbox as a table, its indexes and query plans. Everything generic (failures,
tables, sessions, statement records, topic reads) comes from the kit, `dojo.checks`.

Nothing here reads the learner's internals: only the documented tables and functions.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Engine, text

from dojo.checks import require_tables, scalar
from dojo.checks.observers import sessions, snapshot

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

# Seconds left on a row's lease and backoff (negative: past), shown with the rows.
TIME_LEFT = {"lease_left": "extract(epoch FROM lease_until - clock_timestamp())",
             "retry_in": "extract(epoch FROM next_attempt_at - clock_timestamp())"}

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


# -- clocks -----------------------------------------------------------------------------------

# Time zones the checks' database sessions may run in, with their usual UTC offset (hours).
# Half and three-quarter hours, far from UTC: a clock read in the wrong zone is hours off.
SESSION_ZONES = {"Asia/Kathmandu": 5.75, "America/St_Johns": -3.5}


def local_offset_hours() -> float:
    """This process's UTC offset now (what a naive datetime.now() is relative to)."""
    return time.localtime().tm_gmtoff / 3600


def session_zone() -> str:
    """The database sessions' time zone: the one farthest from this process's own."""
    local = local_offset_hours()
    return max(SESSION_ZONES, key=lambda zone: abs(SESSION_ZONES[zone] - local))


def db_now(engine: Engine) -> datetime:
    """The database's clock_timestamp() now (an aware datetime)."""
    with engine.connect() as conn:
        value: datetime = conn.execute(text("SELECT clock_timestamp()")).scalar_one()
        return value


OUTBOX_UPDATE = re.compile(r"\bupdate\s+(only\s+)?(public\.)?\"?outbox_event\b", re.IGNORECASE)


class StatementClockWatch:
    """Holds each UPDATE of outbox_event `hold` s before it runs, then reads the database's
    clock (`ran`: when the statement is about to run, by the clock the README fixes). After
    the statement, reads `column` of the rows `ids` on the statement's own connection (its
    transaction: uncommitted values too) and the transaction's start (now()): each value the
    row did not have before is `written` by that statement, with its `ran` and `began`."""

    def __init__(self, engine: Engine, column: str, ids: list[str], hold: float) -> None:
        self.engine, self.column, self.ids, self.hold = engine, column, ids, hold
        self.ran: dict[int, datetime] = {}   # id(cursor) → when its held statement ran
        self.written: dict[str, dict[str, Any]] = {}  # row id → value, ran, began, statement

    def __enter__(self) -> StatementClockWatch:
        from sqlalchemy import event
        event.listen(self.engine, "before_cursor_execute", self._before)
        event.listen(self.engine, "after_cursor_execute", self._after)
        return self

    def __exit__(self, *exc: Any) -> None:
        from sqlalchemy import event
        event.remove(self.engine, "before_cursor_execute", self._before)
        event.remove(self.engine, "after_cursor_execute", self._after)

    def _before(self, conn: Any, cursor: Any, statement: str, *rest: Any) -> None:
        if OUTBOX_UPDATE.search(statement):
            time.sleep(self.hold)
            self.ran[id(cursor)] = db_now(self.engine)

    def _after(self, conn: Any, cursor: Any, statement: str, *rest: Any) -> None:
        ran = self.ran.pop(id(cursor), None)
        if ran is None:
            return
        with cursor.connection.cursor() as look:  # the statement's own transaction
            look.execute(f"SELECT id::text, {self.column}, now() FROM outbox_event "
                         "WHERE id::text = ANY(%s)", (self.ids,))
            found = look.fetchall()
        statements = len({w["statement"] for w in self.written.values()})
        for row_id, value, began in found:
            if value is not None and self.written.get(row_id, {}).get("value") != value:
                self.written[row_id] = {"id": row_id, "value": value, "ran": ran,
                                        "began": began, "statement": statements + 1}

    def older(self, slack: float) -> list[dict[str, Any]]:
        """The values written older than their statement's run (beyond `slack` s)."""
        return [w | {"before the statement ran": f"{(w['ran'] - w['value']).total_seconds():.2f} s",
                     "= its transaction's start": abs((w["value"] - w["began"]).total_seconds())
                     < 0.001}
                for w in self.written.values()
                if w["value"] < w["ran"] - timedelta(seconds=slack)]


# -- ids ------------------------------------------------------------------------------------

def norm_id(value: Any) -> str:
    return str(uuid.UUID(str(value)))


# -- schema and rows --------------------------------------------------------------------------

TABLE_STAGE = {"outbox_event": "schema", "processed_event": "idempotent-consumer"}


def require_table(engine: Engine, name: str, stage: str) -> None:
    """Fail plainly when a table the check (of `stage`) needs is not in schema.sql yet: the
    message names the stage whose README section defines it."""
    defined_in = TABLE_STAGE.get(name, stage)
    require_tables(engine, {name: ()}, defined_in, lesson=READ.get(defined_in))


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


def outbox_rows(engine: Engine, where: str = "TRUE", **params: Any) -> list[dict[str, Any]]:
    """The outbox rows (oldest first), with the seconds left on each lease and backoff."""
    found = snapshot(engine, "outbox_event", OUTBOX_COLUMNS, where=where,
                     order_by="created_at, id", computed=TIME_LEFT, **params)
    return [row | {"aggregate_id": str(row["aggregate_id"])} for row in found]


def count(engine: Engine, sql: str, **params: Any) -> int:
    return int(scalar(engine, sql, **params))


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
    """20,000 published rows and 30 unpublished ones, analysed: where an index matters."""
    insert_many(engine, 20000, published=True, created_ago=7200, published_ago=3600)
    insert_many(engine, 30, published=False, created_ago=5)
    with engine.begin() as conn:
        conn.execute(text("ANALYZE outbox_event"))


# -- watching the database --------------------------------------------------------------------

def other_sessions(engine: Engine) -> list[dict[str, Any]]:
    """Sessions in this database other than the observer, with their locks on outbox_event."""
    return sessions(engine, ("outbox_event",))


def touches_outbox(statement: str) -> bool:
    return re.search(r"\boutbox_event\b", statement, re.IGNORECASE) is not None
