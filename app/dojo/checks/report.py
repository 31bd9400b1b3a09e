"""Formatting evidence for a failure message: values, small tables, indented blocks.

    evidence=table(rows, ("id", "published_at", "attempt_count"))

Everything here returns plain text, so a `CheckFailure` reads the same in the terminal, in
the TUI and in a golden file.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any

CENT = Decimal("0.01")


def indent(block: str, spaces: int) -> str:
    """Every line of `block` indented by `spaces` (trailing blank lines dropped).

    Args:
        block: the text, one or several lines.
        spaces: how many spaces go in front of each line.

    Returns:
        The indented text, without a trailing newline.
    """
    pad = " " * spaces
    return "\n".join(pad + line for line in block.rstrip().splitlines())


def fmt(value: Any) -> str:
    """A value as a learner reads it: a Decimal with whole cents as money (`90.00`, not
    `90.0000`), anything finer as it is; a float as its repr; the rest as `str()`.

    Args:
        value: any value read from the database or returned by learner code.

    Returns:
        Its text.
    """
    if isinstance(value, Decimal):
        if value.is_finite() and value == value.quantize(CENT):
            return format(value.quantize(CENT), "f")
        return format(value, "f")
    if isinstance(value, float):
        return repr(value)
    return str(value)


def short(value: Any, width: int = 40) -> str:
    """`fmt(value)` (dicts and lists as JSON) cut to `width` characters with an ellipsis.

    Args:
        value: what to show.
        width: the most characters the result may have.

    Returns:
        The text, at most `width` characters long.
    """
    text = json.dumps(value, default=str) if isinstance(value, dict | list) else fmt(value)
    return text if len(text) <= width else text[:width - 1] + "…"


def table(rows: Sequence[Mapping[str, Any]] | Sequence[Sequence[Any]], columns: Sequence[str],
          limit: int = 12, width: int = 60, empty: str = "(no rows)") -> str:
    """Rows as a small fixed-width table: a header line, then one line per row.

    Args:
        rows: dicts (read by column name; a missing key shows as None) or sequences (read by
            position, one value per column).
        columns: the column names, in order: the header.
        limit: at most this many rows are shown, then a line `… and N more rows`.
        width: each cell is cut to this many characters (see `short`).
        empty: what to say when there are no rows.

    Returns:
        The table as text, lines without trailing spaces.
    """
    if not rows:
        return empty
    cells = [[short(_cell(row, column, i), width) for i, column in enumerate(columns)]
             for row in rows[:limit]]
    widths = [max(len(column), *(len(r[i]) for r in cells)) for i, column in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
              for r in cells]
    if len(rows) > limit:
        lines.append(f"… and {len(rows) - limit} more rows")
    return "\n".join(lines)


def _cell(row: Mapping[str, Any] | Sequence[Any], column: str, index: int) -> Any:
    if isinstance(row, Mapping):
        return row.get(column)
    return row[index] if index < len(row) else ""


def first_line(exc: BaseException | None, width: int = 160) -> str:
    """An exception as one line, `Type: first line of its message` (the database's own text
    for a SQLAlchemy error), or `nothing (it returned)` for None.

    Args:
        exc: the exception, or None when the call returned.
        width: the most characters the line may have.

    Returns:
        The line.
    """
    if exc is None:
        return "nothing (it returned)"
    detail = str(getattr(exc, "orig", None) or exc).strip().splitlines()
    text = f"{type(exc).__name__}: {detail[0] if detail else ''}"
    return text if len(text) <= width else text[:width - 1] + "…"
