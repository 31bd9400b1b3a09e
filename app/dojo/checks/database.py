"""The `database` fixture: a fresh PostgreSQL database per test, dropped afterwards."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Engine, create_engine

from dojo.checks.guard import check_database_name, check_database_server
from dojo.runner import ledger
from dojo.services.manager import Endpoints
from dojo.services.postgres import libpq_url, with_database


@dataclass
class Database:
    """A database of this test's own. `url` is for SQLAlchemy, `dsn` for psycopg.connect()."""

    name: str
    url: str
    dsn: str
    engine: Engine
    _engines: list[Engine] = field(default_factory=list, repr=False)

    def make_engine(self, **kwargs: Any) -> Engine:
        """Another engine on this database (own pool, own options), disposed at teardown."""
        engine = create_engine(self.url, **kwargs)
        self._engines.append(engine)
        return engine


def _admin(endpoints: Endpoints) -> Any:
    import psycopg

    return psycopg.connect(libpq_url(endpoints.database_url), autocommit=True, connect_timeout=10)


def create_database(endpoints: Endpoints, hint: str = "") -> Database:
    check_database_server(endpoints)
    tag = "".join(ch for ch in hint.lower() if ch.isalnum())[:20]
    name = f"dojo_{tag + '_' if tag else ''}{uuid.uuid4().hex[:10]}"
    check_database_name(name)
    ledger.record("database", name)  # before it exists: a kill between the two leaks nothing
    with _admin(endpoints) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = with_database(endpoints.database_url, name)
    engine = create_engine(url, pool_pre_ping=True)
    db = Database(name=name, url=url, dsn=libpq_url(url), engine=engine)
    db._engines.append(engine)
    return db


def drop_database(endpoints: Endpoints, db: Database) -> None:
    check_database_name(db.name)
    for engine in db._engines:
        engine.dispose()
    with _admin(endpoints) as conn:
        # FORCE ends sessions learner code left open (a crashed worker, a leaked connection).
        conn.execute(f'DROP DATABASE IF EXISTS "{db.name}" WITH (FORCE)')
