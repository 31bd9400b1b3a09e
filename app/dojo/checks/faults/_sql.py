"""A slow or failing database, through SQLAlchemy's events on the engine a check hands to
learner code."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Literal

When = Literal["before", "after", "both"]
_COMMIT_STATEMENT = re.compile(r"^\s*(COMMIT|END)\b", re.IGNORECASE)
_ROLLBACK_STATEMENT = re.compile(r"^\s*(ROLLBACK|ABORT)\b", re.IGNORECASE)
_MARK = "dojo_fail_commit"  # on the connection's info: a matching statement ran in its transaction


@contextmanager
def slow_sql(engine: Any, delay: float, match: str = r".",
             when: When = "after") -> Iterator[list[str]]:
    """Sleep `delay` seconds at every statement whose SQL matches `match` on `engine`: a slow
    database that widens race windows deterministically.

    Args:
        engine: the SQLAlchemy engine learner code was given.
        delay: seconds to sleep at each matching statement (each side, with "both").
        match: a regex, case-insensitive, `.` spanning lines.
        when: "after": the statement has run (and holds its locks) but the caller does not
            have the result yet — widens the window *after* a read or a lock. "before": the
            caller has sent it but the database has not run it yet — widens the window
            between the previous statement and this one (a check-then-act gap, the time
            between a SELECT and the UPDATE that follows it). "both": each.

    Yields:
        The statements it slowed, in order (once each, whatever `when`).

    Works on SQLAlchemy engines (cursor events); code that bypasses the engine is not seen.
    """
    from sqlalchemy import event

    if when not in ("before", "after", "both"):
        raise ValueError(f"when must be 'before', 'after' or 'both', not {when!r}")
    pattern = re.compile(match, re.IGNORECASE | re.DOTALL)  # SQL spans lines
    slowed: list[str] = []

    def before(conn: Any, cursor: Any, statement: str, *rest: Any) -> None:
        if pattern.search(statement):
            slowed.append(statement)
            time.sleep(delay)

    def after(conn: Any, cursor: Any, statement: str, *rest: Any) -> None:
        if pattern.search(statement):
            if when == "after":
                slowed.append(statement)
            time.sleep(delay)

    listeners: list[tuple[str, Callable[..., None]]] = []
    if when in ("before", "both"):
        listeners.append(("before_cursor_execute", before))
    if when in ("after", "both"):
        listeners.append(("after_cursor_execute", after))
    for name, fn in listeners:
        event.listen(engine, name, fn)
    try:
        yield slowed
    finally:
        for name, fn in listeners:
            event.remove(engine, name, fn)


class InjectedFault(RuntimeError):
    """The error fail_sql raises: an exception at a chosen statement or commit, like a crash
    mid-write."""


def _fault(error: Callable[[str], BaseException] | None, where: str) -> BaseException:
    if error is not None:
        return error(where)
    return InjectedFault(f"injected failure at: {' '.join(where.split())[:120]}")


@contextmanager
def fail_sql(engine: Any, match: str, *, times: int = 1, at: Literal["statement", "commit"]
             = "statement", error: Callable[[str], BaseException] | None = None
             ) -> Iterator[list[str]]:
    """Make the database fail where `match` says, through the engine learner code was given.

    Args:
        engine: the SQLAlchemy engine.
        match: a regex, case-insensitive, `.` spanning lines.
        times: fail this many times, then let everything through.
        at: "statement": raise instead of running a statement whose SQL matches `match`.
            "commit": let the statements run, and raise instead of committing a transaction
            in which a matching statement ran — whether the code commits through SQLAlchemy
            (`engine.begin()`, `conn.commit()`) or sends COMMIT itself. Nothing of that
            transaction reaches the database, so a check can prove from the database that
            the writes before the failure were atomic with the rest.
        error: builds the exception to raise from the statement (default: InjectedFault).

    Yields:
        The statements it failed (for "commit", the matching statement of each transaction
        whose commit it failed).
    """
    from sqlalchemy import event

    if at not in ("statement", "commit"):
        raise ValueError(f"at must be 'statement' or 'commit', not {at!r}")
    pattern = re.compile(match, re.IGNORECASE | re.DOTALL)  # SQL spans lines
    failed: list[str] = []
    lock = threading.Lock()

    def take() -> bool:
        with lock:
            if len(failed) >= times:
                return False
            failed.append("")
            return True

    if at == "statement":
        def before(conn: Any, cursor: Any, statement: str, *rest: Any) -> None:
            if pattern.search(statement) and take():
                failed[-1] = statement
                raise _fault(error, statement)

        listeners: list[tuple[str, Callable[..., None]]] = [("before_cursor_execute", before)]
        pool_listeners: list[tuple[str, Callable[..., None]]] = []
    else:
        def fail_commit(conn: Any) -> None:
            statement = conn.info.pop(_MARK, None)
            if statement is not None and take():
                failed[-1] = statement
                raise _fault(error, f"COMMIT (after {' '.join(statement.split())[:90]})")

        def watch(conn: Any, cursor: Any, statement: str, *rest: Any) -> None:
            if _COMMIT_STATEMENT.match(statement):
                fail_commit(conn)  # the code sends COMMIT itself
            elif _ROLLBACK_STATEMENT.match(statement):
                conn.info.pop(_MARK, None)
            elif pattern.search(statement):
                conn.info.setdefault(_MARK, statement)

        def forget(conn: Any) -> None:
            conn.info.pop(_MARK, None)

        def checked_in(dbapi_connection: Any, record: Any) -> None:
            if record is not None:
                record.info.pop(_MARK, None)  # the transaction ended with the checkout

        listeners = [("before_cursor_execute", watch), ("commit", fail_commit),
                     ("rollback", forget)]
        pool_listeners = [("checkin", checked_in)]
    for name, fn in listeners:
        event.listen(engine, name, fn)
    for name, fn in pool_listeners:
        event.listen(engine.pool, name, fn)
    try:
        yield failed
    finally:
        for name, fn in listeners:
            event.remove(engine, name, fn)
        for name, fn in pool_listeners:
            event.remove(engine.pool, name, fn)
