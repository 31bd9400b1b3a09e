"""Fixtures for the DLQ checks (on top of the kit's kafka and learner).

The ledger database: one PostgreSQL database per run, with every schema dropped and the
learner's schema.sql applied again before each check. CREATE DATABASE copies a template and
costs about a second on a loaded machine, which two dozen checks would pay each; a reset
costs a tenth of that and isolates as well (sessions a previous check left behind are ended
first, as DROP DATABASE … WITH (FORCE) would).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from _support import DLQLab
from sqlalchemy import Engine, create_engine, text

from dojo.checks import InstantClock, apply_schema
from dojo.checks.database import Database, create_database, drop_database


@dataclass(frozen=True)
class LedgerDatabase:
    """The database a check hands to learner code: its SQLAlchemy URL and an engine."""

    url: str
    engine: Engine


@pytest.fixture
def lab(kafka: Any, learner: Any) -> DLQLab:
    """The learner's code bound to this test's topics."""
    # Records go back and forth between consumers that have caught up (consumer, DLT,
    # replay, source again): at Tansu's 500 ms a fetch, waiting made a fifth of the run.
    kafka.tansu_fetch_wait_ms = 100
    return DLQLab(kafka, learner)


@pytest.fixture(scope="session")
def _run_database(services: Any) -> Iterator[Database]:
    db = create_database(services, hint="dlq")
    try:
        yield db
    finally:
        drop_database(services, db)


def _reset(db: Database) -> None:
    """End every other session the test's role opened on `db` (the learner code's; not an
    autovacuum worker or an observer's, which the role may not signal), drop every schema but
    the system ones, and give back an empty `public`."""
    with db.engine.connect() as conn:
        conn.execute(text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                          "WHERE datname = current_database() AND pid <> pg_backend_pid() "
                          "AND backend_type = 'client backend' AND usename = current_user"))
        schemas = conn.execute(text(
            "SELECT nspname FROM pg_namespace WHERE nspname NOT LIKE 'pg\\_%' "
            "AND nspname <> 'information_schema'")).scalars().all()
        for name in schemas:
            conn.execute(text(f'DROP SCHEMA "{name}" CASCADE'))
        conn.execute(text("CREATE SCHEMA public"))
        conn.commit()


@pytest.fixture
def ledger_database(_run_database: Database, learner: Any) -> Iterator[LedgerDatabase]:
    """An empty database with the learner's schema.sql applied (this check's own)."""
    _run_database.engine.dispose()
    _reset(_run_database)
    engine = create_engine(_run_database.url, pool_pre_ping=True)
    try:
        apply_schema(engine, learner.dir)
        yield LedgerDatabase(_run_database.url, engine)
    finally:
        engine.dispose()


@pytest.fixture
def ledger_db(ledger_database: LedgerDatabase) -> Engine:
    """The ledger database's engine."""
    return ledger_database.engine


@pytest.fixture
def clock() -> InstantClock:
    """Real time plus every second slept: backoff costs no real time."""
    return InstantClock()
