"""What PostgreSQL says about the other sessions of a database: open transactions, who holds
which locks and who waits for whom (pg_stat_activity, pg_locks, pg_blocking_pids), and row
locks (pgrowlocks, where the extension can be created).

Run these on an engine of the check's own (the observer's session is left out): learner code
holding a lock must not be able to hide it, and the observer must not queue behind it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import Engine, text

from dojo.checks.database import rows

# The columns worth showing in a failure message, in order (`table(found, SESSION_COLUMNS)`).
SESSION_COLUMNS = ("pid", "state", "xact_open_s", "waiting_on", "blocked_by", "locks",
                   "last_query")


def sessions(engine: Engine, tables: Sequence[str] = ()) -> list[dict[str, Any]]:
    """The other client sessions on this database, now.

    Args:
        engine: the observer's engine (its own session is not listed).
        tables: list the locks held on these tables (all tables when empty).

    Returns:
        One dict per session, ordered by pid: `pid`, `state` (active, idle, idle in
        transaction, …), `xact_open_s` (seconds its transaction has been open, None outside
        one), `backend_xid` (its transaction id once it wrote), `backend_xmin` (the snapshot
        horizon it holds back), `waiting_on` (wait event type), `blocked_by` (pids, from
        pg_blocking_pids), `locks` (granted locks on those tables as `table:Mode`, a row
        lock a waiter queues with as `table:Mode (tuple)`, comma-separated)
        and `last_query` (its latest statement, 70 characters).
    """
    return rows(engine, """
        SELECT a.pid, a.state,
               round(extract(epoch FROM clock_timestamp() - a.xact_start)::numeric, 2)
                   AS xact_open_s,
               a.backend_xid::text AS backend_xid, a.backend_xmin::text AS backend_xmin,
               a.wait_event_type AS waiting_on, pg_blocking_pids(a.pid) AS blocked_by,
               (SELECT string_agg(c.relname || ':' || l.mode
                                  || CASE WHEN l.locktype = 'relation' THEN ''
                                          ELSE ' (' || l.locktype || ')' END, ', '
                                  ORDER BY c.relname, l.mode)
                  FROM pg_locks l JOIN pg_class c ON c.oid = l.relation
                 WHERE l.pid = a.pid AND l.granted AND c.relkind IN ('r', 'p')
                   AND (cardinality(CAST(:tables AS text[])) = 0
                        OR c.relname = ANY(CAST(:tables AS text[])))) AS locks,
               left(regexp_replace(a.query, '\\s+', ' ', 'g'), 70) AS last_query
          FROM pg_stat_activity a
         WHERE a.datname = current_database() AND a.pid <> pg_backend_pid()
           AND a.backend_type = 'client backend'
         ORDER BY a.pid""", tables=list(tables))


def open_transactions(found: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The sessions sitting in a transaction between statements (`idle in transaction`), or
    holding locks on the watched tables: what a slow broker or a long computation should
    never leave behind.

    Args:
        found: sessions from `sessions(...)`.

    Returns:
        Those sessions.
    """
    return [dict(s) for s in found
            if str(s.get("state") or "").startswith("idle in transaction") or s.get("locks")]


def blocked(found: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The sessions waiting for a lock another session holds (pg_blocking_pids not empty)."""
    return [dict(s) for s in found if s.get("blocked_by")]


def lock_holders(engine: Engine, table_name: str) -> list[dict[str, Any]]:
    """Every lock on one table, granted or awaited, with its session.

    Args:
        engine: the observer's engine.
        table_name: the table.

    Returns:
        Dicts ordered by pid: `pid`, `mode`, `granted`, `blocked_by`, `state`, `last_query`.
    """
    return rows(engine, """
        SELECT l.pid, l.mode, l.granted, pg_blocking_pids(l.pid) AS blocked_by, a.state,
               left(regexp_replace(a.query, '\\s+', ' ', 'g'), 70) AS last_query
          FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
         WHERE l.relation = to_regclass(:t) AND l.pid <> pg_backend_pid()
         ORDER BY l.pid, l.mode""", t=table_name)


def ensure_pgrowlocks(engine: Engine) -> bool:
    """Create the pgrowlocks extension if it is not there; False when it cannot be (an
    external server without contrib, or without the privilege). Call it before the race."""
    try:
        with engine.begin() as conn:
            conn.execute(text("CREATE EXTENSION IF NOT EXISTS pgrowlocks"))
        return True
    except Exception:
        return False


def row_locks(engine: Engine, table_name: str, key: str = "id") -> list[dict[str, Any]]:
    """Row locks on a table right now (pgrowlocks), with the key of each locked row.

    Args:
        engine: the observer's engine (`ensure_pgrowlocks` returned True for it).
        table_name: the table (an identifier the check controls, never learner input).
        key: the column that names a row in the message.

    Returns:
        Dicts ordered by key: `row_id`, `modes` and `pids` (comma-separated); [] when
        pgrowlocks is unavailable.
    """
    try:
        return rows(engine, f"""
            SELECT t.{key} AS row_id, array_to_string(l.modes, ', ') AS modes,
                   array_to_string(l.pids, ', ') AS pids
              FROM pgrowlocks('{table_name}') l JOIN {table_name} t ON t.ctid = l.locked_row
             ORDER BY t.{key}""")
    except Exception:
        return []
