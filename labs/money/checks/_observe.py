"""What the money checks observe while the learner's code runs: every statement by worker
(with what it read back and the errors it hit, even retried ones), statement counts, and the
sessions and row locks PostgreSQL shows. All of it from the outside: SQLAlchemy engine events
and PostgreSQL's own views."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from _support import fmt, rows, short
from sqlalchemy import Engine, event, text

# -- who ran what ------------------------------------------------------------------------------

@dataclass
class Statement:
    at: float
    worker: str
    sql: str
    params: Any
    result: list[tuple[Any, ...]] | None = None
    error: str | None = None
    sqlstate: str | None = None
    pid: int | None = None  # the PostgreSQL backend that ran it


def _compact(sql: str) -> str:
    return re.sub(r"\s+", " ", sql).strip()


def _worker_name() -> str:
    name = threading.current_thread().name
    return name.replace("dojo-worker-", "worker ") if name.startswith("dojo-worker-") else name


@dataclass
class StatementLog:
    """Every statement run through an engine while recording, by worker thread, with what it
    read back (up to 3 rows, peeked without consuming them) and any database error, even one
    the learner's code caught and retried."""

    started: float = field(default_factory=time.monotonic)
    statements: list[Statement] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def workers_by_pid(self) -> dict[int, str]:
        return {s.pid: s.worker for s in self.statements if s.pid is not None}

    def name_pids(self, message: str) -> str:
        """PostgreSQL's text with "process 123" followed by the worker that pid served."""
        names = self.workers_by_pid()
        return re.sub(r"(?i)(process (\d+))", lambda m: f"{m[1]} ({names[int(m[2])]})"
                      if int(m[2]) in names else m[1], message)

    def pids_in(self, message: str) -> list[str]:
        """The workers whose backends a PostgreSQL message names, in order."""
        names = self.workers_by_pid()
        found = []
        for pid in re.findall(r"(?i)process (\d+)", message):
            name = names.get(int(pid))
            if name and name not in found:
                found.append(name)
        return found

    def errors(self, state: str | None = None) -> list[Statement]:
        return [s for s in self.statements if s.error and (state is None or s.sqlstate == state)]

    def by_worker(self, worker: str) -> list[Statement]:
        return [s for s in self.statements if s.worker == worker]

    def timeline(self, workers: Sequence[str], limit: int = 14,
                 match: str | None = None) -> str:
        chosen = [s for s in self.statements if s.worker in workers
                  and (match is None or re.search(match, s.sql, re.IGNORECASE))]
        lines = []
        for s in chosen[:limit]:
            sql = s.sql if len(s.sql) <= 78 else s.sql[:77] + "…"
            line = f"+{(s.at) * 1000:7.1f} ms  {s.worker:<9}  {sql}"
            if s.params:
                line += f"\n{'':23}params {short(_params(s.params), 70)}"
            if s.result is not None:
                got = (short([tuple(fmt(v) for v in r) for r in s.result], 70) if s.result
                       else "(no row)")
                line += f"\n{'':23}-> {got}"
            if s.error:
                line += f"\n{'':23}!! {s.error[:110]}"
            lines.append(line)
        if len(chosen) > limit:
            lines.append(f"… and {len(chosen) - limit} more statements")
        return "\n".join(lines)


def _pid(dbapi_connection: Any) -> int | None:
    try:
        raw = getattr(dbapi_connection, "dbapi_connection", dbapi_connection)
        return int(raw.info.backend_pid)
    except Exception:
        return None


def _params(params: Any) -> Any:
    if isinstance(params, dict):
        return {k: fmt(v) for k, v in params.items()}
    if isinstance(params, list | tuple) and params and isinstance(params[0], dict):
        return [_params(p) for p in params[:2]]
    return params


@contextmanager
def statement_log(engine: Engine) -> Iterator[StatementLog]:
    log = StatementLog()

    def after(conn: Any, cursor: Any, statement: str, params: Any, *_: Any) -> None:
        result = None
        try:
            if cursor.description is not None and 0 <= cursor.rowcount <= 3:
                result = [tuple(r) for r in cursor.fetchall()]
                if result:
                    cursor.scroll(0, mode="absolute")  # hand the rows back untouched
        except Exception:
            result = None
        with log._lock:
            log.statements.append(Statement(time.monotonic() - log.started, _worker_name(),
                                            _compact(statement), params, result,
                                            pid=_pid(cursor.connection)))

    def failed(context: Any) -> None:
        exc = context.original_exception
        with log._lock:
            log.statements.append(Statement(
                time.monotonic() - log.started, _worker_name(),
                _compact(context.statement or ""), context.parameters, None,
                " ".join(str(exc).split()), getattr(exc, "sqlstate", None),
                _pid(getattr(context.connection, "connection", None))))

    event.listen(engine, "after_cursor_execute", after)
    event.listen(engine, "handle_error", failed)
    try:
        yield log
    finally:
        event.remove(engine, "after_cursor_execute", after)
        event.remove(engine, "handle_error", failed)


@contextmanager
def count_queries(engine: Engine) -> Iterator[list[str]]:
    """Every statement sent through `engine` while inside (SQLAlchemy cursor events)."""
    seen: list[str] = []

    def before(conn: Any, cursor: Any, statement: str, *_: Any) -> None:
        seen.append(_compact(statement))

    event.listen(engine, "before_cursor_execute", before)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", before)


def query_summary(queries: Sequence[str], limit: int = 6) -> str:
    """Statements grouped by text, most repeated first: "100 x SELECT ... WHERE id = %(p)s"."""
    counts: dict[str, int] = {}
    for q in queries:
        counts[q] = counts.get(q, 0) + 1
    ordered = sorted(counts.items(), key=lambda kv: -kv[1])
    lines = [f"{n:4d} x {q if len(q) <= 100 else q[:99] + '…'}" for q, n in ordered[:limit]]
    if len(ordered) > limit:
        lines.append(f"… and {len(ordered) - limit} other statements")
    return "\n".join(lines)


# -- locks, as PostgreSQL sees them ------------------------------------------------------------

def ensure_pgrowlocks(engine: Engine) -> bool:
    try:
        with engine.begin() as conn:
            conn.execute(text("CREATE EXTENSION IF NOT EXISTS pgrowlocks"))
        return True
    except Exception:
        return False


def sessions(engine: Engine, tables: Sequence[str] = ("account",)) -> list[dict[str, Any]]:
    """The other sessions on this database: state, how long their transaction has been
    open, what they wait on, and the locks they hold on `tables` (pg_locks)."""
    return rows(engine, """
        SELECT a.pid, a.state,
               round(extract(epoch FROM clock_timestamp() - a.xact_start)::numeric, 2)
                   AS xact_open_s,
               a.wait_event_type AS waiting_on, pg_blocking_pids(a.pid) AS blocked_by,
               (SELECT string_agg(c.relname || ':' || l.mode, ', ' ORDER BY c.relname)
                  FROM pg_locks l JOIN pg_class c ON c.oid = l.relation
                 WHERE l.pid = a.pid AND l.granted AND c.relname = ANY(:tables)) AS locks,
               left(regexp_replace(a.query, '\\s+', ' ', 'g'), 70) AS last_query
          FROM pg_stat_activity a
         WHERE a.datname = current_database() AND a.pid <> pg_backend_pid()
           AND a.backend_type = 'client backend'
         ORDER BY a.pid""", tables=list(tables))


SESSION_COLUMNS = ("pid", "state", "xact_open_s", "waiting_on", "blocked_by", "locks",
                   "last_query")


def row_locks(engine: Engine, table_name: str = "account") -> list[dict[str, Any]]:
    """Row locks on `table_name` right now (pgrowlocks), with the account ids they cover."""
    try:
        return rows(engine, f"""
            SELECT t.id AS row_id, array_to_string(l.modes, ', ') AS modes,
                   array_to_string(l.pids, ', ') AS pids
              FROM pgrowlocks('{table_name}') l JOIN {table_name} t ON t.ctid = l.locked_row
             ORDER BY t.id""")
    except Exception:
        return []


def in_transaction(sessions_now: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return [s for s in sessions_now if (s["state"] or "").startswith("idle in transaction")
            or (s["xact_open_s"] is not None and s["locks"])]
