"""The PostgreSQL observers against a real server: statements per worker and backend, open
transactions, lock holders and waiters, row locks, table snapshots."""

from __future__ import annotations

import threading
import time

import pytest
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError

from dojo.checks.faults import run_concurrently
from dojo.checks.observers import (
    blocked,
    count_queries,
    ensure_pgrowlocks,
    lock_holders,
    open_transactions,
    query_summary,
    record_sql,
    row_locks,
    sessions,
    snapshot,
)


@pytest.fixture
def accounts(database):
    with database.engine.begin() as conn:
        conn.execute(text("CREATE TABLE account (id int PRIMARY KEY, balance int NOT NULL, "
                          "opened_at timestamptz NOT NULL DEFAULT '2025-01-16 11:33:00+00', "
                          "ref uuid DEFAULT '5b1f8e36-9a55-4d1c-8c1e-0d6a4f3b2a10')"))
        conn.execute(text("INSERT INTO account (id, balance) VALUES (1, 100), (2, 50)"))
    return database


def test_record_sql_names_each_worker_and_its_backend(accounts) -> None:
    engine = accounts.make_engine(pool_size=4)

    def read(i: int) -> int:
        with engine.connect() as conn:
            return int(conn.execute(text("SELECT balance + :i FROM account WHERE id = 1"),
                                    {"i": i}).scalar_one())

    with record_sql(engine) as log:
        outcomes = run_concurrently(read, 3, timeout=20)
    assert sorted(o.value for o in outcomes) == [100, 101, 102]
    selects = log.matching(r"SELECT balance")
    assert sorted(s.worker for s in selects) == ["worker 0", "worker 1", "worker 2"]
    assert all(s.pid is not None for s in selects)
    assert all(s.result is not None and len(s.result) == 1 for s in selects), \
        "what each statement read back is kept"
    assert [s.worker for s in log.by_worker("worker 1")] == ["worker 1"]
    pid = selects[0].pid
    assert log.name_pids(f"Process {pid} waits for ShareLock") == \
        f"Process {pid} ({selects[0].worker}) waits for ShareLock"
    assert log.pids_in(f"process {pid} and process 1") == [selects[0].worker]
    assert "worker" in log.timeline()


def test_record_sql_keeps_errors_the_code_caught_and_transaction_ids(accounts) -> None:
    engine = accounts.engine
    with record_sql(engine, xid=True) as log:
        with engine.begin() as conn:
            conn.execute(text("UPDATE account SET balance = balance - 1 WHERE id = 1"))
        try:
            with engine.begin() as conn:
                conn.execute(text("INSERT INTO account (id, balance) VALUES (1, 0)"))
        except IntegrityError:
            pass  # the learner's code retried or gave up: the log still shows it
    update = log.matching(r"^UPDATE")[0]
    assert update.rowcount == 1 and update.xid is not None
    [failed] = log.errors("23505")
    assert "duplicate key" in (failed.error or "")


def test_count_queries_and_the_summary_group_repeated_statements(accounts) -> None:
    with count_queries(accounts.engine) as seen, accounts.engine.connect() as conn:
        for i in (1, 2, 1):
            conn.execute(text("SELECT balance FROM account WHERE id = :id"), {"id": i})
        conn.execute(text("SELECT count(*) FROM account"))
    assert len(seen) == 4
    summary = query_summary(seen)
    assert summary.splitlines()[0].startswith("   3 x SELECT balance FROM account WHERE id =")


def test_an_open_transaction_holding_a_lock_is_seen_with_its_waiter(accounts) -> None:
    observer = accounts.make_engine()
    have_rowlocks = ensure_pgrowlocks(observer)
    with accounts.engine.connect() as holder:
        holder.begin()
        holder.execute(text("UPDATE account SET balance = 0 WHERE id = 1"))
        holder_pid = holder.execute(text("SELECT pg_backend_pid()")).scalar_one()
        waiting = threading.Event()

        def wait_for_the_row() -> None:
            with accounts.engine.begin() as conn:
                waiting.set()
                conn.execute(text("UPDATE account SET balance = 1 WHERE id = 1"))

        waiter = threading.Thread(target=wait_for_the_row, daemon=True)
        waiter.start()
        assert waiting.wait(10)
        deadline = time.monotonic() + 10
        while not blocked(sessions(observer, ("account",))) and time.monotonic() < deadline:
            time.sleep(0.02)
        found = sessions(observer, ("account",))
        held = lock_holders(observer, "account")
        locked_rows = row_locks(observer, "account") if have_rowlocks else None
        holder.rollback()
        waiter.join(10)
    [holding] = [s for s in found if s["pid"] == holder_pid]
    assert holding["state"] == "idle in transaction"
    assert holding["xact_open_s"] is not None and holding["backend_xid"] is not None
    assert "account:RowExclusiveLock" in holding["locks"]
    assert holder_pid in [s["pid"] for s in open_transactions(found)]
    [waiter_row] = blocked(found)
    assert waiter_row["blocked_by"] == [holder_pid]
    assert {(h["pid"], h["granted"]) for h in held if h["mode"] == "RowExclusiveLock"} >= {
        (holder_pid, True)}
    if locked_rows is not None:
        assert [(r["row_id"], r["pids"]) for r in locked_rows] == [(1, str(holder_pid))]


def test_sessions_leave_the_observer_out_and_show_nothing_when_all_is_idle(accounts) -> None:
    with accounts.engine.connect() as conn:
        conn.execute(text("SELECT 1"))
        conn.commit()
        assert open_transactions(sessions(accounts.make_engine())) == []


def test_a_snapshot_shows_timestamps_as_text_uuids_as_str_and_computed_columns(accounts):
    rows = snapshot(accounts.engine, "account", ("id", "opened_at", "ref"), where="id = :id",
                    computed={"double": "balance * 2"}, id=1)
    [row] = rows
    assert isinstance(row["opened_at"], str) and row["opened_at"].startswith("2025-01-16")
    assert row["ref"] == "5b1f8e36-9a55-4d1c-8c1e-0d6a4f3b2a10" and row["double"] == 200
    every = snapshot(accounts.engine, "account", order_by="id DESC")
    assert [r["id"] for r in every] == [2, 1] and set(every[0]) == {"id", "balance",
                                                                    "opened_at", "ref"}
