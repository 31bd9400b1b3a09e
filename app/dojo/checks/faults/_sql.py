"""A slow or failing database, through SQLAlchemy's cursor events on the engine."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

# -- a slow or failing database ---------------------------------------------------------------


@contextmanager
def slow_sql(engine: Any, delay: float, match: str = r".") -> Iterator[list[str]]:
    """Sleep `delay` seconds right after every statement whose SQL matches `match` (a regex,
    case-insensitive) runs on `engine`, before the caller gets the result: a slow database that
    widens every race window. Yields the list of statements it slowed.

    Works on SQLAlchemy engines (cursor events); code that bypasses the engine is not seen.
    """
    from sqlalchemy import event

    pattern = re.compile(match, re.IGNORECASE | re.DOTALL)  # SQL spans lines
    slowed: list[str] = []

    def after(conn: Any, cursor: Any, statement: str, *rest: Any) -> None:
        if pattern.search(statement):
            slowed.append(statement)
            time.sleep(delay)

    event.listen(engine, "after_cursor_execute", after)
    try:
        yield slowed
    finally:
        event.remove(engine, "after_cursor_execute", after)


class InjectedFault(RuntimeError):
    """The error fail_sql raises: an exception at a chosen statement, like a crash mid-write."""


@contextmanager
def fail_sql(engine: Any, match: str, *, times: int = 1,
             error: Callable[[str], BaseException] | None = None) -> Iterator[list[str]]:
    """Raise (InjectedFault by default) instead of running the first `times` statements whose
    SQL matches `match` (regex, case-insensitive). Yields the statements it failed.
    """
    from sqlalchemy import event

    pattern = re.compile(match, re.IGNORECASE | re.DOTALL)  # SQL spans lines
    failed: list[str] = []

    def before(conn: Any, cursor: Any, statement: str, *rest: Any) -> None:
        if len(failed) < times and pattern.search(statement):
            failed.append(statement)
            raise (error(statement) if error else
                   InjectedFault(f"injected failure at: {' '.join(statement.split())[:120]}"))

    event.listen(engine, "before_cursor_execute", before)
    try:
        yield failed
    finally:
        event.remove(engine, "before_cursor_execute", before)


