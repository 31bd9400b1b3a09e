"""A table's rows as a check shows them: chosen columns, timestamps as text, in a stable
order, ready for `table(...)`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import Engine

from dojo.checks.database import rows

_TIME_TYPES = ("timestamp with time zone", "timestamp without time zone", "date")


def _time_columns(engine: Engine, table_name: str) -> set[str]:
    found = rows(engine, "SELECT column_name, data_type FROM information_schema.columns "
                         "WHERE table_schema = current_schema() AND table_name = :t",
                 t=table_name)
    return {r["column_name"] for r in found if r["data_type"] in _TIME_TYPES}


def snapshot(engine: Engine, table_name: str, columns: Sequence[str] | None = None, *,
             where: str = "TRUE", order_by: str = "1",
             computed: Mapping[str, str] | None = None, **params: Any) -> list[dict[str, Any]]:
    """The rows of one table now, as dicts.

    Timestamps come back as PostgreSQL's text (a runaway backoff past year 9999 must show in
    the message, not crash the check) and UUIDs as str.

    Args:
        engine: the observer's engine.
        table_name: the table (an identifier the check controls).
        columns: the columns to read (None: all of them, in table order).
        where: a filter, with `:name` parameters.
        order_by: the ORDER BY clause (default: the first column).
        computed: extra columns, {name: SQL expression}, e.g.
            {"lease_left": "extract(epoch FROM lease_until - clock_timestamp())"}.
        params: values for the filter's parameters.

    Returns:
        One dict per row.
    """
    times = _time_columns(engine, table_name)
    names = list(columns) if columns is not None else [
        r["column_name"] for r in rows(
            engine, "SELECT column_name FROM information_schema.columns WHERE table_schema "
                    "= current_schema() AND table_name = :t ORDER BY ordinal_position",
            t=table_name)]
    select = [f"{c}::text AS {c}" if c in times else c for c in names]
    select += [f"{expression} AS {name}" for name, expression in (computed or {}).items()]
    found = rows(engine, f"SELECT {', '.join(select)} FROM {table_name} WHERE {where} "
                         f"ORDER BY {order_by}", **params)
    return [{k: (str(v) if type(v).__name__ == "UUID" else v) for k, v in row.items()}
            for row in found]
