"""PostgreSQL for checks: the `database` fixture (a fresh database per test, dropped
afterwards), the learner's schema.sql applied to it, and small readers for the state a check
looks at.

    apply_schema(database.engine, learner.dir)
    require_tables(engine, {"account": ("id", "balance")}, stage="schema")
    balance = scalar(engine, "SELECT balance FROM account WHERE id = :id", id=7)
    rows(engine, "SELECT * FROM posting WHERE account_id = :id", id=7)
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, text

from dojo.checks.failure import CheckFailure
from dojo.checks.guard import check_database_name, check_database_server
from dojo.runner import ledger
from dojo.services.manager import Endpoints
from dojo.services.postgres import libpq_url, with_database


@dataclass
class Database:
    """A database of this test's own, owned by a role of its own.

    `url` / `dsn` / `engine` log in as that role: it owns the database and what the learner's
    schema creates in it, and nothing else (no superuser, no other database, no COPY TO
    PROGRAM). Learner code gets these. `admin_url` is the server's administrator on the same
    database, for observers that need more (another role's sessions, extensions); a check
    never hands it to learner code. On a server where dojo may not create roles, `role` is
    "" and both URLs are the administrator's.
    """

    name: str
    url: str
    dsn: str
    engine: Engine
    admin_url: str = ""
    role: str = ""
    _engines: list[Engine] = field(default_factory=list, repr=False)

    def make_engine(self, **kwargs: Any) -> Engine:
        """Another engine on this database as its own role (own pool, own options),
        disposed at teardown."""
        engine = create_engine(self.url, **kwargs)
        self._engines.append(engine)
        return engine

    def make_admin_engine(self, **kwargs: Any) -> Engine:
        """An engine as the server's administrator, for observers only; disposed at
        teardown."""
        engine = create_engine(self.admin_url or self.url, **kwargs)
        self._engines.append(engine)
        return engine


def _admin(endpoints: Endpoints, dbname: str | None = None) -> Any:
    import psycopg

    url = endpoints.database_url if dbname is None else with_database(endpoints.database_url,
                                                                      dbname)
    return psycopg.connect(libpq_url(url), autocommit=True, connect_timeout=10)


def _may_create_roles(conn: Any) -> bool:
    row = conn.execute("SELECT rolsuper OR rolcreaterole FROM pg_roles "
                       "WHERE rolname = current_user").fetchone()
    return bool(row and row[0])


def _as_role(url: str, role: str, password: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).set(username=role, password=password).render_as_string(
        hide_password=False)


def create_database(endpoints: Endpoints, hint: str = "") -> Database:
    """A fresh `dojo_…` database and the role that owns it (see `Database`)."""
    import secrets

    from psycopg import sql

    check_database_server(endpoints)
    tag = "".join(ch for ch in hint.lower() if ch.isalnum())[:20]
    name = f"dojo_{tag + '_' if tag else ''}{uuid.uuid4().hex[:10]}"
    check_database_name(name)
    ident = sql.Identifier(name)
    role, password = "", ""
    with _admin(endpoints) as conn:
        if _may_create_roles(conn):
            role, password = name, secrets.token_urlsafe(18)
            ledger.record("role", role)  # before it exists: a kill between leaks nothing
            conn.execute(sql.SQL(
                "CREATE ROLE {} LOGIN PASSWORD {} NOSUPERUSER NOCREATEDB NOCREATEROLE "
                "NOREPLICATION NOBYPASSRLS").format(ident, sql.Literal(password)))
        ledger.record("database", name)
        if role:
            conn.execute(sql.SQL("CREATE DATABASE {} OWNER {}").format(ident, ident))
            # no other role gets in: parallel runs' roles included
            conn.execute(sql.SQL("REVOKE CONNECT, TEMPORARY ON DATABASE {} FROM PUBLIC")
                         .format(ident))
        else:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(ident))
    admin_url = with_database(endpoints.database_url, name)
    if role:
        # created by the administrator, usable by the owner: lock observers read row locks
        with _admin(endpoints, name) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pgrowlocks")
    url = _as_role(admin_url, role, password) if role else admin_url
    engine = create_engine(url, pool_pre_ping=True)
    db = Database(name=name, url=url, dsn=libpq_url(url), engine=engine, admin_url=admin_url,
                  role=role)
    db._engines.append(engine)
    return db


def drop_database(endpoints: Endpoints, db: Database) -> None:
    from psycopg import sql

    check_database_name(db.name)
    for engine in db._engines:
        engine.dispose()
    with _admin(endpoints) as conn:
        _forget_statements(conn, db.name)
        # FORCE ends sessions learner code left open (a crashed worker, a leaked connection).
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
            sql.Identifier(db.name)))
        if db.role:
            check_database_name(db.role)
            conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(db.role)))



def _forget_statements(conn: Any, name: str) -> None:
    """Drop the database's entries from pg_stat_statements, where the server loads it.

    The view keeps a dropped database's statements until it is full (pg_stat_statements.max,
    5000 by default), then evicts the least used entries, those of live databases included:
    after a few hundred checks the incident lab's rare statements (3 calls) vanished between
    two of its own snapshots. Forgetting each database's entries as it goes keeps the view to
    the databases that exist. Needs the extension in the administrator's database (the
    embedded server has it; on another dojo server it is created there once); a server where
    that is refused keeps its entries, as it did before.
    """
    import psycopg

    try:
        loaded = conn.execute("SELECT current_setting('shared_preload_libraries')").fetchone()
        if not loaded or "pg_stat_statements" not in str(loaded[0]):
            return
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        conn.execute("SELECT pg_stat_statements_reset(0, oid, 0) FROM pg_database "
                     "WHERE datname = %s", (name,))
    except psycopg.Error:
        pass


# -- the learner's schema -----------------------------------------------------------------


def apply_schema(engine: Engine, learner_dir: Path, file: str = "schema.sql") -> None:
    """Run the learner's schema file on the (fresh) database, in one transaction.

    The file goes to psycopg as it is, without parameters, so a `%` in a PL/pgSQL RAISE is
    not taken for a placeholder.

    Args:
        engine: the database's engine (the `database` fixture's, or one of its own).
        learner_dir: the directory under test (`learner.dir`).
        file: the schema file's name in it.

    Raises:
        CheckFailure: the file is missing, or PostgreSQL refused it (its error as evidence).
    """
    path = learner_dir / file
    if not path.exists():
        raise CheckFailure(f"{file} is missing from the code under test.",
                           expected=f"{file} next to the lab's other files",
                           actual=f"no {file} in {learner_dir}")
    raw = engine.raw_connection()
    try:
        cursor = raw.cursor()
        try:
            cursor.execute(path.read_text(encoding="utf-8"))
        finally:
            cursor.close()
        raw.commit()
    except Exception as exc:
        detail = str(exc).strip() or repr(exc)
        raise CheckFailure(f"{file} does not run on a fresh database.",
                           expected=f"{file} runs on an empty PostgreSQL database",
                           actual=f"PostgreSQL refused it: {detail.splitlines()[0]}",
                           evidence=detail) from exc
    finally:
        raw.close()


def columns(engine: Engine, table_name: str) -> dict[str, str]:
    """The columns of a table in the current schema.

    Args:
        engine: the database.
        table_name: the table's name.

    Returns:
        {column: data type as information_schema names it ("numeric", "uuid", …)}; {} when
        there is no such table.
    """
    with engine.connect() as conn:
        found = conn.execute(text(
            "SELECT column_name, data_type FROM information_schema.columns "
            "WHERE table_schema = current_schema() AND table_name = :t ORDER BY ordinal_position"),
            {"t": table_name})
        return {r.column_name: r.data_type for r in found}


def require_tables(engine: Engine, tables: Mapping[str, Sequence[str]], stage: str,
                   lesson: str | None = None) -> None:
    """Fail plainly when schema.sql lacks a table or a column the checks of `stage` use.

    Args:
        engine: the database with the learner's schema applied.
        tables: {table: the columns the checks read or write}.
        stage: the stage whose README section defines them (named in the message).
        lesson: the lesson section to read, if any.

    Raises:
        CheckFailure: something is missing; every missing table and column is listed.
    """
    problems = []
    for name, wanted in tables.items():
        found = columns(engine, name)
        if not found:
            problems.append(f"there is no table {name}"
                            + (f" (columns {', '.join(wanted)})" if wanted else ""))
            continue
        missing = [c for c in wanted if c not in found]
        if missing:
            problems.append(f"table {name} has no column {', '.join(missing)}")
    if problems:
        raise CheckFailure(
            f"schema.sql does not have what stage {stage} needs.",
            expected=", ".join(f"table {name}" + (f" ({', '.join(cols)})" if cols else "")
                               for name, cols in tables.items()),
            actual="; ".join(problems),
            lesson=lesson,
            fix=f"add it to schema.sql as the lab README shows (stage {stage})")


# -- reading state --------------------------------------------------------------------------


def rows(engine: Engine, sql: str, **params: Any) -> list[dict[str, Any]]:
    """Run a query on a connection of its own; every row as a dict.

    Args:
        engine: the database.
        sql: the query, with `:name` parameters.
        params: their values.

    Returns:
        The rows, as {column: value}.
    """
    with engine.connect() as conn:
        return [dict(r) for r in conn.execute(text(sql), params).mappings()]


def scalar(engine: Engine, sql: str, **params: Any) -> Any:
    """The first column of the first row of a query (None when there is no row).

    Args:
        engine: the database.
        sql: the query, with `:name` parameters.
        params: their values.

    Returns:
        The value.
    """
    with engine.connect() as conn:
        return conn.execute(text(sql), params).scalar()


def has_table(engine: Engine, name: str) -> bool:
    """Whether `name` (a table, possibly schema-qualified) exists."""
    return bool(scalar(engine, "SELECT to_regclass(:n) IS NOT NULL", n=name))


def sqlstate(exc: BaseException | None) -> str | None:
    """The SQLSTATE of a database error, wherever SQLAlchemy or psycopg put it, following the
    exception's causes (learner code may wrap it).

    Args:
        exc: any exception, or None.

    Returns:
        The five-character code ("40001", "23505", …), or None when no database error is in
        the chain.
    """
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        code = getattr(exc, "sqlstate", None) or getattr(getattr(exc, "orig", None),
                                                         "sqlstate", None)
        if code:
            return str(code)
        exc = exc.__cause__ or exc.__context__
    return None
