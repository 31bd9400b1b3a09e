"""The kit's database helpers against a real PostgreSQL: the learner's schema applied (or its
refusal explained), tables required by a stage, readers, SQLSTATE through wrapped errors."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError

from dojo.checks import CheckFailure, apply_schema, require_tables, rows, scalar, sqlstate
from dojo.checks.database import columns, has_table

SCHEMA = """
CREATE TABLE account (id bigserial PRIMARY KEY, balance numeric(20,4) NOT NULL DEFAULT 0);
CREATE FUNCTION no_negative() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.balance < 0 THEN RAISE EXCEPTION 'balance % below zero', NEW.balance; END IF;
  RETURN NEW;
END $$;
CREATE TRIGGER no_negative BEFORE UPDATE ON account FOR EACH ROW EXECUTE FUNCTION no_negative();
"""


def test_apply_schema_runs_the_file_as_it_is_percent_signs_included(database, tmp_path: Path):
    (tmp_path / "schema.sql").write_text(SCHEMA, encoding="utf-8")
    apply_schema(database.engine, tmp_path)
    assert columns(database.engine, "account") == {"id": "bigint", "balance": "numeric"}
    assert has_table(database.engine, "account") and not has_table(database.engine, "nope")


def test_a_schema_postgresql_refuses_fails_with_its_error(database, tmp_path: Path):
    (tmp_path / "schema.sql").write_text("CREATE TABLE t (id intt);", encoding="utf-8")
    with pytest.raises(CheckFailure) as caught:
        apply_schema(database.engine, tmp_path)
    assert caught.value.what == "schema.sql does not run on a fresh database."
    assert 'type "intt" does not exist' in caught.value.actual


def test_a_missing_schema_file_is_named(database, tmp_path: Path):
    with pytest.raises(CheckFailure, match="schema.sql is missing"):
        apply_schema(database.engine, tmp_path)


def test_require_tables_lists_every_missing_table_and_column(database):
    with database.engine.begin() as conn:
        conn.execute(text("CREATE TABLE account (id int)"))
    with pytest.raises(CheckFailure) as caught:
        require_tables(database.engine, {"account": ("id", "balance"), "posting": ("id",)},
                       "schema", lesson="money#schema")
    failure = caught.value
    assert failure.actual == ("table account has no column balance; there is no table posting "
                              "(columns id)")
    assert failure.lessons == ("money#schema",)
    require_tables(database.engine, {"account": ("id",)}, "schema")  # present: no failure


def test_rows_and_scalar_read_with_named_parameters(database):
    with database.engine.begin() as conn:
        conn.execute(text("CREATE TABLE t (id int, name text)"))
        conn.execute(text("INSERT INTO t VALUES (1, 'a'), (2, 'b')"))
    assert rows(database.engine, "SELECT * FROM t WHERE id > :n ORDER BY id", n=0) == [
        {"id": 1, "name": "a"}, {"id": 2, "name": "b"}]
    assert scalar(database.engine, "SELECT name FROM t WHERE id = :id", id=2) == "b"
    assert scalar(database.engine, "SELECT name FROM t WHERE id = 9") is None


def test_sqlstate_is_found_through_sqlalchemy_and_a_wrapping_error(database):
    with database.engine.begin() as conn:
        conn.execute(text("CREATE TABLE t (id int PRIMARY KEY)"))
        conn.execute(text("INSERT INTO t VALUES (1)"))
    try:
        with database.engine.begin() as conn:
            conn.execute(text("INSERT INTO t VALUES (1)"))
    except IntegrityError as exc:
        direct = exc
    assert sqlstate(direct) == "23505"
    try:
        raise RuntimeError("the learner wrapped it") from direct
    except RuntimeError as wrapped:
        assert sqlstate(wrapped) == "23505"
    assert sqlstate(ValueError("no database here")) is None
    assert sqlstate(None) is None
