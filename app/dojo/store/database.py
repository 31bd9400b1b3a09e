"""The SQLite engine behind the progress store, set up to survive kill -9.

- WAL journal: a writer killed mid-transaction leaves the last committed state intact, and
  readers (the TUI) never block the writer (the CLI) or the other way round.
- synchronous=FULL: a commit is on disk when it returns, so "earlier commits survive" holds
  for a power cut too, not only for a killed process.
- Every write is one `BEGIN IMMEDIATE … COMMIT`: it takes the write lock up front, so a
  read-modify-write can never interleave with another process's.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event, insert, select, update
from sqlalchemy.engine import Connection
from sqlalchemy.pool import ConnectionPoolEntry

from dojo.store.schema import SCHEMA_VERSION, Base, SchemaVersion

__all__ = ["SCHEMA_VERSION", "MIGRATIONS", "StoreError", "ensure_schema", "open_engine"]

BUSY_TIMEOUT_MS = 10_000
WRITE_OPTION = "dojo_write"

# version -> step that upgrades a database from `version` to `version + 1`.
MIGRATIONS: dict[int, Callable[[Connection], None]] = {}


class StoreError(RuntimeError):
    """The progress database cannot be used as it is (e.g. written by a newer dojo)."""


def corrupt_store(path: Path, exc: Exception) -> StoreError:
    """The error for a progress file SQLite cannot read, after keeping a copy of it.

    The app must never show an empty progress as if nothing had been done: it stops, says
    where the copy is, and how to start fresh."""
    import shutil
    import time

    backup = path.with_name(f"{path.name}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}")
    try:
        shutil.copy2(path, backup)
        kept = f"A copy is kept at {backup}."
    except OSError as copy_error:
        kept = f"(could not copy it: {copy_error})"
    reason = str(getattr(exc, "orig", exc)).strip().splitlines()[0]
    return StoreError(
        f"The progress database {path} is corrupt ({reason}). {kept} To start fresh, "
        f"move it away (`mv {path} {path}.old`) and run dojo again; your lessons and labs are "
        "untouched, only review history and lab progress start over.")


def open_engine(path: Path) -> Engine:
    """An Engine on the SQLite file at `path` (created with its folder if missing)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(f"sqlite:///{path}")

    @event.listens_for(engine, "connect")
    def _configure(dbapi_connection: Any, _record: ConnectionPoolEntry) -> None:
        # Let SQLAlchemy's "begin" event issue BEGIN itself (pysqlite would defer it until
        # the first write, so a transaction's reads would not be part of it).
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA journal_mode = WAL")
        cursor.execute("PRAGMA synchronous = FULL")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _begin(conn: Connection) -> None:
        write = conn.get_execution_options().get(WRITE_OPTION, False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")

    return engine


def ensure_schema(engine: Engine) -> None:
    """Create the tables on first use and run any migration a newer dojo brings."""
    with engine.connect() as conn:
        conn = conn.execution_options(**{WRITE_OPTION: True})
        with conn.begin():
            Base.metadata.create_all(conn)
            current = conn.execute(select(SchemaVersion.version)).scalar()
            if current is None:
                conn.execute(insert(SchemaVersion).values(version=SCHEMA_VERSION))
                return
            if current > SCHEMA_VERSION:
                raise StoreError(f"the progress database is at schema version {current}; this "
                                 f"dojo knows up to {SCHEMA_VERSION}. Upgrade dojo.")
            for version in range(current, SCHEMA_VERSION):
                MIGRATIONS[version](conn)
            conn.execute(update(SchemaVersion).values(version=SCHEMA_VERSION))
