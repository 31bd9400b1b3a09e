"""slow_sql and fail_sql against a real PostgreSQL: where the delay falls (before or after the
statement runs), and a failure injected at COMMIT that leaves nothing behind."""

from __future__ import annotations

import threading
import time

import pytest
from sqlalchemy import text
from sqlalchemy.exc import OperationalError

from dojo.checks.faults import InjectedFault, fail_sql, slow_sql


@pytest.fixture
def counters(database):
    with database.engine.begin() as conn:
        conn.execute(text("CREATE TABLE counter (id int PRIMARY KEY, n int NOT NULL)"))
        conn.execute(text("INSERT INTO counter VALUES (1, 0)"))
    return database.engine


def _wait_for(slowed: list[str]) -> None:
    deadline = time.monotonic() + 10
    while not slowed:
        assert time.monotonic() < deadline, "the slowed statement never started"
        time.sleep(0.005)


def _row_locked_by_another_session(engine) -> bool:
    with engine.connect() as conn:
        conn.execute(text("SET lock_timeout = '1ms'"))
        try:
            conn.execute(text("SELECT n FROM counter WHERE id = 1 FOR UPDATE NOWAIT"))
        except OperationalError as exc:
            assert getattr(exc.orig, "sqlstate", None) == "55P03"
            return True
        finally:
            conn.rollback()
    return False


def _update_in_thread(engine) -> threading.Thread:
    def update() -> None:
        with engine.begin() as conn:
            conn.execute(text("UPDATE counter SET n = n + 1 WHERE id = 1"))

    thread = threading.Thread(target=update, daemon=True)
    thread.start()
    return thread


def test_slow_sql_after_holds_the_result_back_once_the_statement_ran(counters):
    with slow_sql(counters, 1.5, match=r"UPDATE counter", when="after") as slowed:
        thread = _update_in_thread(counters)
        _wait_for(slowed)
        # the UPDATE has run: its row lock is held while the caller waits for the result
        assert _row_locked_by_another_session(counters)
        thread.join(10)
    assert len(slowed) == 1


def test_slow_sql_before_delays_the_statement_itself(counters):
    with slow_sql(counters, 1.5, match=r"UPDATE counter", when="before") as slowed:
        thread = _update_in_thread(counters)
        _wait_for(slowed)
        # the UPDATE has not run yet: nothing is locked, the gap before it is open
        assert not _row_locked_by_another_session(counters)
        thread.join(10)
    assert len(slowed) == 1
    with counters.connect() as conn:
        assert conn.execute(text("SELECT n FROM counter")).scalar_one() == 1


def test_slow_sql_before_opens_the_window_between_two_statements_of_one_function(counters):
    """Read-then-write: with the write delayed, another writer commits in between and its
    update is lost, every time (the race a check wants to reach)."""
    read_done = threading.Event()

    def read_then_write() -> None:
        with counters.begin() as conn:
            n = conn.execute(text("SELECT n FROM counter WHERE id = 1")).scalar_one()
            read_done.set()
            conn.execute(text("UPDATE counter SET n = :n WHERE id = 1"), {"n": n + 1})

    with slow_sql(counters, 1.5, match=r"^UPDATE counter SET n = %", when="before"):
        thread = threading.Thread(target=read_then_write, daemon=True)
        thread.start()
        assert read_done.wait(10)
        with counters.begin() as conn:  # lands inside the widened window
            conn.execute(text("UPDATE counter SET n = n + 10 WHERE id = 1"))
        thread.join(10)
    with counters.connect() as conn:
        assert conn.execute(text("SELECT n FROM counter")).scalar_one() == 1  # +10 was lost


def test_slow_sql_both_delays_each_side(counters):
    with slow_sql(counters, 0.2, match=r"SELECT 42", when="both") as slowed:
        started = time.monotonic()
        with counters.connect() as conn:
            conn.execute(text("SELECT 42"))
        took = time.monotonic() - started
    assert took >= 0.4
    assert slowed == ["SELECT 42"]


def test_slow_sql_refuses_an_unknown_when(counters):
    with pytest.raises(ValueError, match="when"), slow_sql(counters, 0.1, when="during"):  # type: ignore[arg-type]
        pass


@pytest.fixture
def two_tables(database):
    with database.engine.begin() as conn:
        conn.execute(text("CREATE TABLE a (x int); CREATE TABLE b (x int)"))
    return database.engine


def _count(engine, table: str) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text(f"SELECT count(*) FROM {table}")).scalar_one())


def test_fail_sql_at_commit_of_an_engine_begin_block_leaves_nothing(two_tables):
    engine = two_tables
    with fail_sql(engine, r"INSERT INTO b", at="commit") as failed:
        with pytest.raises(InjectedFault, match="COMMIT"), engine.begin() as conn:
            conn.execute(text("INSERT INTO a VALUES (1)"))
            conn.execute(text("INSERT INTO b VALUES (1)"))
    assert failed == ["INSERT INTO b VALUES (1)"]
    assert (_count(engine, "a"), _count(engine, "b")) == (0, 0)


def test_fail_sql_at_commit_also_catches_a_commit_sent_as_sql(two_tables):
    engine = two_tables
    with fail_sql(engine, r"INSERT INTO b", at="commit") as failed:
        with engine.connect() as conn, pytest.raises(InjectedFault):
            conn.execute(text("INSERT INTO a VALUES (1)"))
            conn.execute(text("INSERT INTO b VALUES (1)"))
            conn.execute(text("COMMIT"))
    assert len(failed) == 1
    assert (_count(engine, "a"), _count(engine, "b")) == (0, 0)


def test_fail_sql_at_commit_lets_other_transactions_and_later_ones_commit(two_tables):
    engine = two_tables
    with fail_sql(engine, r"INSERT INTO b", at="commit", times=1) as failed:
        with engine.begin() as conn:  # no matching statement: commits
            conn.execute(text("INSERT INTO a VALUES (1)"))
        with pytest.raises(InjectedFault), engine.begin() as conn:
            conn.execute(text("INSERT INTO b VALUES (1)"))
        with engine.begin() as conn:  # `times` used up
            conn.execute(text("INSERT INTO b VALUES (2)"))
    assert len(failed) == 1
    assert (_count(engine, "a"), _count(engine, "b")) == (1, 1)


def test_fail_sql_at_commit_forgets_a_transaction_that_rolled_back(two_tables):
    engine = two_tables
    with fail_sql(engine, r"INSERT INTO b", at="commit") as failed:
        with engine.connect() as conn:
            conn.execute(text("INSERT INTO b VALUES (1)"))
            conn.rollback()
            conn.execute(text("INSERT INTO a VALUES (1)"))
            conn.commit()
    assert failed == []
    assert (_count(engine, "a"), _count(engine, "b")) == (1, 0)


def test_fail_sql_with_a_custom_error(two_tables):
    with fail_sql(two_tables, r"INSERT INTO a", error=lambda sql: TimeoutError(sql)), \
            pytest.raises(TimeoutError), two_tables.begin() as conn:
        conn.execute(text("INSERT INTO a VALUES (1)"))
