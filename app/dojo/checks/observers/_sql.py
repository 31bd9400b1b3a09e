"""Every statement learner code sends through an engine: by worker thread and PostgreSQL
backend, with its row count, what it read back, its transaction and any error (even one the
code caught and retried). From SQLAlchemy's cursor events, never the learner's internals."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Engine, event

from dojo.checks.report import fmt, short

WORKER_PREFIX = "dojo-worker-"  # the thread names run_concurrently gives its workers


@dataclass
class Statement:
    """One statement as the database ran it.

    Attributes:
        at: seconds since recording started.
        worker: the thread that sent it ("worker 3" for run_concurrently's workers, else the
            thread's name).
        sql: the statement as sent.
        params: its parameters.
        rowcount: rows it affected or returned (-1 when the driver does not know; 0 on error).
        result: up to `peek` rows it read back (None when it returned no rows or more than
            `peek`, or on error).
        error: the database's message when it failed, else None.
        sqlstate: the error's SQLSTATE.
        pid: the PostgreSQL backend that ran it.
        xid: the id of the transaction it ran in, once one was assigned (with `xid=True`).
    """

    at: float
    worker: str
    sql: str
    params: Any
    rowcount: int = -1
    result: list[tuple[Any, ...]] | None = None
    error: str | None = None
    sqlstate: str | None = None
    pid: int | None = None
    xid: str | None = None

    @property
    def compact(self) -> str:
        """The SQL on one line, white space folded."""
        return " ".join(self.sql.split())


def _worker_name() -> str:
    name = threading.current_thread().name
    return name.replace(WORKER_PREFIX, "worker ") if name.startswith(WORKER_PREFIX) else name


def _pid(dbapi_connection: Any) -> int | None:
    try:
        raw = getattr(dbapi_connection, "dbapi_connection", dbapi_connection)
        return int(raw.info.backend_pid)
    except Exception:
        return None


def _shown(params: Any) -> Any:
    if isinstance(params, dict):
        return {k: fmt(v) for k, v in params.items()}
    if isinstance(params, list | tuple) and params and isinstance(params[0], dict):
        return [_shown(p) for p in params[:2]]
    return params


@dataclass
class StatementLog:
    """What `record_sql` saw. Iterating it gives the statements in the order they ran."""

    started: float = field(default_factory=time.monotonic)
    statements: list[Statement] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __iter__(self) -> Iterator[Statement]:
        return iter(list(self.statements))

    def __len__(self) -> int:
        return len(self.statements)

    def matching(self, pattern: str) -> list[Statement]:
        """The statements whose SQL matches `pattern` (a regex, case-insensitive)."""
        found = re.compile(pattern, re.IGNORECASE | re.DOTALL)
        return [s for s in self.statements if found.search(s.sql)]

    def errors(self, state: str | None = None) -> list[Statement]:
        """The statements that failed (with SQLSTATE `state`, when given)."""
        return [s for s in self.statements if s.error and (state is None or s.sqlstate == state)]

    def by_worker(self, worker: str) -> list[Statement]:
        """The statements one worker sent."""
        return [s for s in self.statements if s.worker == worker]

    def workers_by_pid(self) -> dict[int, str]:
        """{PostgreSQL backend pid: the worker it served}."""
        return {s.pid: s.worker for s in self.statements if s.pid is not None}

    def name_pids(self, message: str) -> str:
        """PostgreSQL's text with each "process 123" followed by the worker that pid served
        (a deadlock report names backends, the learner thinks in workers)."""
        names = self.workers_by_pid()
        return re.sub(r"(?i)(process (\d+))", lambda m: f"{m[1]} ({names[int(m[2])]})"
                      if int(m[2]) in names else m[1], message)

    def pids_in(self, message: str) -> list[str]:
        """The workers whose backends a PostgreSQL message names, in order."""
        names = self.workers_by_pid()
        found: list[str] = []
        for pid in re.findall(r"(?i)process (\d+)", message):
            name = names.get(int(pid))
            if name and name not in found:
                found.append(name)
        return found

    def timeline(self, workers: Sequence[str] | None = None, limit: int = 14,
                 match: str | None = None) -> str:
        """The statements as a timeline: time, worker, SQL, its parameters, what it read
        back (`->`) and its error (`!!`).

        Args:
            workers: only these workers (None: all).
            limit: at most this many statements, then a count of the rest.
            match: only statements matching this regex (case-insensitive).

        Returns:
            The timeline as text.
        """
        chosen = [s for s in self.statements if (workers is None or s.worker in workers)
                  and (match is None or re.search(match, s.sql, re.IGNORECASE))]
        lines = []
        for s in chosen[:limit]:
            sql = s.compact if len(s.compact) <= 78 else s.compact[:77] + "…"
            line = f"+{s.at * 1000:7.1f} ms  {s.worker:<9}  {sql}"
            if s.params:
                line += f"\n{'':23}params {short(_shown(s.params), 70)}"
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


@contextmanager
def record_sql(engine: Engine, *, peek: int = 3, xid: bool = False) -> Iterator[StatementLog]:
    """Record every statement run through `engine` while inside the block.

    Args:
        engine: the engine the check hands to learner code.
        peek: keep what a statement read back when it returned at most this many rows; they
            are read without being consumed (the cursor is scrolled back). 0 turns it off.
        xid: also ask, after each statement, for the id of the transaction it ran in (one
            more round trip per statement: leave it off in races).

    Yields:
        The StatementLog, filled as statements run (errors included, from `handle_error`).
    """
    log = StatementLog()

    def after(conn: Any, cursor: Any, statement: str, params: Any, *_: Any) -> None:
        result = None
        try:
            if peek and cursor.description is not None and 0 <= cursor.rowcount <= peek:
                result = [tuple(r) for r in cursor.fetchall()]
                if result:
                    cursor.scroll(0, mode="absolute")  # hand the rows back untouched
        except Exception:
            result = None
        transaction = None
        if xid:
            row = cursor.connection.execute(
                "SELECT pg_current_xact_id_if_assigned()::text").fetchone()
            transaction = row[0] if row else None
        with log._lock:
            log.statements.append(Statement(time.monotonic() - log.started, _worker_name(),
                                            statement, params, cursor.rowcount, result,
                                            pid=_pid(cursor.connection), xid=transaction))

    def failed(context: Any) -> None:
        exc = context.original_exception
        with log._lock:
            log.statements.append(Statement(
                time.monotonic() - log.started, _worker_name(), context.statement or "",
                context.parameters, 0, None, " ".join(str(exc).split()),
                getattr(exc, "sqlstate", None),
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
    """Every statement sent through `engine` while inside, on one line each, in order (a
    lighter `record_sql` for counting: nothing is peeked or asked).

    Yields:
        The list, filled as statements are sent.
    """
    seen: list[str] = []

    def before(conn: Any, cursor: Any, statement: str, *_: Any) -> None:
        seen.append(" ".join(statement.split()))

    event.listen(engine, "before_cursor_execute", before)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", before)


def query_summary(queries: Sequence[str], limit: int = 6) -> str:
    """Statements grouped by text, most repeated first: `100 x SELECT … WHERE id = %(p)s`.

    Args:
        queries: statements (from `count_queries`).
        limit: at most this many distinct statements, then a count of the others.

    Returns:
        The summary as text.
    """
    counts: dict[str, int] = {}
    for q in queries:
        counts[q] = counts.get(q, 0) + 1
    ordered = sorted(counts.items(), key=lambda kv: -kv[1])
    lines = [f"{n:4d} x {q if len(q) <= 100 else q[:99] + '…'}" for q, n in ordered[:limit]]
    if len(ordered) > limit:
        lines.append(f"… and {len(ordered) - limit} other statements")
    return "\n".join(lines)
