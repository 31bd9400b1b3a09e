"""Stage transfer: both accounts locked in one global order, so opposite transfers never
deadlock, and the total across accounts never changes."""

from __future__ import annotations

import random
import re
import time
from decimal import Decimal
from types import ModuleType
from typing import Any

import pytest
from _support import (
    READ,
    assert_ledger_agrees,
    balance_of,
    describe_errors,
    failures,
    ledger_table,
)
from sqlalchemy import Engine, text

from dojo.checks import (
    CheckFailure,
    call,
    first_line,
    fmt,
    in_thread,
    raised,
    rows,
    scalar,
    sqlstate,
    table,
)
from dojo.checks.faults import run_concurrently, slow_sql
from dojo.checks.observers import ensure_pgrowlocks, record_sql, row_locks

pytestmark = pytest.mark.stage("transfer")

OPPOSITE_WORKERS = 12
OPPOSITE_ROUNDS = 2
# Every statement that takes a row lock on account answers 30 ms late: a transaction that
# locks one row and then the other holds the first while the other side takes the second.
SLOW_LOCK = 0.02
LOCKING = r"for\s+(no\s+key\s+)?update|^\s*update\s+account"


def test_transfer_moves_money_between_accounts(accounts: ModuleType, bank: Engine,
                                               funded: Any) -> None:
    a, b = funded("100.00"), funded("50.00")
    receipt = call(accounts.transfer, bank, a, b, Decimal("30.00"))
    got = (balance_of(bank, a), balance_of(bank, b))
    if got != (Decimal("70.00"), Decimal("80.00")):
        raise CheckFailure(
            "transfer(a, b, 30.00) moved the wrong amounts.", expected="a 70.00, b 80.00",
            actual=f"a {fmt(got[0])}, b {fmt(got[1])}", lesson=READ["transfer"])
    if (receipt.from_balance, receipt.to_balance) != got:
        raise CheckFailure(
            "The TransferReceipt must carry both balances right after the transfer.",
            expected=f"from_balance {fmt(got[0])}, to_balance {fmt(got[1])}",
            actual=f"{receipt}", lesson=READ["transfer"])
    legs = rows(bank, "SELECT account_id, amount FROM posting WHERE entry_id = :e "
                      "ORDER BY amount", e=receipt.entry_id)
    if not ([(r["account_id"], r["amount"]) for r in legs] == [(a, Decimal("-30")),
            (b, Decimal("30"))]):
        raise CheckFailure(
            "A transfer is one ledger entry with two postings.",
            expected=f"entry {receipt.entry_id}: account {a} -30.00, account {b} +30.00",
            actual=str([(r["account_id"], fmt(r["amount"])) for r in legs]) or "no postings",
            lesson=READ["schema"])
    eur = funded("10.00", currency="EUR")
    refusals = [
        ("transfer(a, b, 70.01) with 70.00 in a", (a, b, "70.01"), accounts.InsufficientFunds),
        ("transfer from USD to EUR", (a, eur, "1.00"), accounts.CurrencyMismatch),
        ("transfer(a, a, 1.00)", (a, a, "1.00"), ValueError),
        ("transfer to an account that does not exist", (a, 987654321, "1.00"),
         accounts.AccountNotFound),
    ]
    for label, (src, dst, amount), wanted in refusals:
        error = raised(accounts.transfer, bank, src, dst, Decimal(amount))
        if not isinstance(error, wanted):
            raise CheckFailure(
                f"{label} must be refused.", expected=f"{wanted.__module__}.{wanted.__name__}",
                actual=first_line(error), lesson=READ["transfer"])
    for bad in ("0", "-5.00", "1.005", "0.001"):
        error = raised(accounts.transfer, bank, a, b, Decimal(bad))
        if not isinstance(error, ValueError):
            raise CheckFailure(
                f"transfer(a, b, Decimal('{bad}')) must be refused.",
                expected="ValueError: transfers take the amounts deposit and withdraw take "
                         "(positive, at most 2 decimals)",
                actual=first_line(error) if error else "it returned (money moved)",
                evidence=f"balances now: a {fmt(balance_of(bank, a))}, b "
                         f"{fmt(balance_of(bank, b))}; a sub-cent transfer cannot be paid out "
                         "and leaves fractions no statement shows",
                fix="validate the amount in transfer exactly as in deposit and withdraw (one "
                    "shared function)" if error is None else None,
                lesson=READ["numbers"])
    error = raised(accounts.transfer, bank, a, b, 1.5)
    if not isinstance(error, TypeError | ValueError):
        raise CheckFailure(
            "transfer() accepted a float amount.",
            expected="TypeError (or ValueError): amounts are Decimal", actual=first_line(error)
            if error else "it returned (money moved)", lesson=READ["numbers"])
    after = (balance_of(bank, a), balance_of(bank, b), balance_of(bank, eur))
    if after != (Decimal("70.00"), Decimal("80.00"), Decimal("10.00")):
        raise CheckFailure(
            "A refused transfer moved money.", expected="70.00, 80.00 and 10.00 EUR unchanged",
            actual=", ".join(fmt(x) for x in after), evidence=ledger_table(bank, a),
            lesson=READ["transfer"])
    first = call(accounts.transfer, bank, b, a, Decimal("5.25"), idempotency_key="t-1")
    if (first.from_balance, first.to_balance) != (Decimal("74.75"), Decimal("75.25")) or (
            first.from_account_id, first.to_account_id) != (b, a):
        raise CheckFailure(
            f"transfer(b, a, 5.25), from the higher account id ({b}) to the lower ({a}), "
            "returned a receipt that does not match it.",
            expected=f"from_account_id {b}, from_balance 74.75 (80.00 - 5.25); to_account_id "
                     f"{a}, to_balance 75.25 (70.00 + 5.25)",
            actual=f"{first}",
            evidence=f"balances now: a {fmt(balance_of(bank, a))}, b {fmt(balance_of(bank, b))}",
            lesson=READ["transfer"])
    again = call(accounts.transfer, bank, b, a, Decimal("5.25"), idempotency_key="t-1")
    if not (again == first and balance_of(bank, a) == Decimal("75.25")):
        raise CheckFailure(
            "A retried transfer (same idempotency key) must move the money once.",
            expected=f"a 75.25 and the same receipt twice ({first})",
            actual=f"a {fmt(balance_of(bank, a))}, retry answered {again}",
            lesson=READ["idempotency"])
    # the whole balance: a balance equal to the amount covers it (the account ends at 0.00)
    every_cent = balance_of(bank, a)
    whole = raised(accounts.transfer, bank, a, b, every_cent)
    if whole is not None or balance_of(bank, a) != 0:
        raise CheckFailure(
            f"transfer(a, b, {fmt(every_cent)}), with exactly {fmt(every_cent)} in a, must go "
            "through: a balance equal to the amount covers it.",
            expected=f"a 0.00, b {fmt(balance_of(bank, b) + every_cent)}",
            actual=(first_line(whole) if whole is not None else "it returned")
                   + f"; a {fmt(balance_of(bank, a))}, b {fmt(balance_of(bank, b))}",
            evidence="a customer may empty an account (the CHECK is balance >= 0): only an "
                     "amount above the balance is InsufficientFunds",
            fix="refuse when balance < amount, not balance <= amount"
            if isinstance(whole, accounts.InsufficientFunds) else None,
            lesson=READ["transfer"])
    assert_ledger_agrees(bank, "after transfers and refusals")


def test_opposite_transfers_do_not_deadlock(accounts: ModuleType, bank: Engine,
                                            funded: Any) -> None:
    for round_no in range(1, OPPOSITE_ROUNDS + 1):
        a, b = funded("1000.00"), funded("1000.00")

        def move(index: int, a: int = a, b: int = b) -> Any:
            src, dst = (a, b) if index % 2 == 0 else (b, a)
            return accounts.transfer(bank, src, dst, Decimal("1.00"))

        with record_sql(bank) as log, slow_sql(bank, SLOW_LOCK, match=LOCKING):
            outcomes = run_concurrently(move, OPPOSITE_WORKERS, timeout=40)
        deadlocks = log.errors("40P01")
        dead_workers = sorted({s.worker for s in deadlocks}
                              | {f"worker {o.index}" for o in outcomes
                                 if sqlstate(o.error) == "40P01"})
        if deadlocks or dead_workers:
            detail = deadlocks[0].error if deadlocks else first_line(
                next(o.error for o in outcomes if sqlstate(o.error) == "40P01"))
            detail = re.sub(rf"relation {_oid(bank)} of database \d+", "table account",
                            detail or "")
            raise CheckFailure(
                f"{OPPOSITE_WORKERS} transfers between accounts {a} and {b}, half each way, "
                f"deadlocked (round {round_no} of {OPPOSITE_ROUNDS}).",
                expected="every transfer commits; no deadlock (SQLSTATE 40P01), not even one "
                         "your code retried",
                actual=f"PostgreSQL detected {max(len(deadlocks), 1)} deadlock(s) among "
                       f"{len(dead_workers)} worker(s)",
                evidence=f"deadlocked: {', '.join(dead_workers[:6])}\n"
                         f"PostgreSQL said: {log.name_pids(detail)[:500]}\n\n"
                         f"the workers in that cycle (row locks answered "
                         f"{SLOW_LOCK * 1000:.0f} ms late):\n"
                         + log.timeline((log.pids_in(detail) or _pair(dead_workers))[:2]
                                     + [w for w in dead_workers[:1] if not log.pids_in(detail)],
                                     match=r"\baccount\b"),
                fix="two transfers waited for each other's row locks: one took the rows "
                    "in one order and the other in the opposite order (from, then to: A->B "
                    "holds A and waits for B while B->A holds B and waits for A). Lock both "
                    "rows in one global order, whatever the direction: SELECT ... FROM account "
                    "WHERE id IN (:a, :b) ORDER BY id FOR NO KEY UPDATE",
                lesson=(READ["transfer"], READ["deadlock"]))
        broken = failures(outcomes)
        if broken:
            raise CheckFailure(
                f"Opposite transfers between {a} and {b} failed (round {round_no}).",
                expected="all succeed (both accounts hold 1000.00)",
                actual=f"{len(broken)} raised", evidence=describe_errors(broken),
                lesson=READ["transfer"])
        total = balance_of(bank, a) + balance_of(bank, b)
        if total != Decimal("2000.00"):
            raise CheckFailure(
                "Opposite transfers changed the total.", expected="2000.00",
                actual=fmt(total), evidence=ledger_table(bank, a), lesson=READ["transfer"])
    assert_ledger_agrees(bank, "after opposite transfers")


# How long the check waits to see the transfer queue behind the row it holds (under load).
QUEUE_WAIT = 30.0


def test_transfer_locks_the_lower_id_first(accounts: ModuleType, bank: Engine, funded: Any,
                                           database: Any) -> None:
    """A transfer from the lower id to the higher must not hold the higher row while it
    waits for the lower one. The heap is laid out so that a scan meets the higher id first
    (a deposit moves the lower account's row to the end of the page); the check then holds
    the lower row itself and reads, from pgrowlocks, what the queued transfer already locked.
    A statement that locks rows as it scans them (one UPDATE ... WHERE id IN (a, b)) shows
    up here every run, without waiting for two transfers to meet in the wrong order."""
    low, high = _across_a_power_of_ten(bank, funded)
    observer = database.make_admin_engine()
    if not ensure_pgrowlocks(observer):
        raise RuntimeError("the check needs the pgrowlocks extension to read row locks")
    layout = _place_after(accounts, bank, observer, low, high)
    # The statistics autovacuum would gather on a live table: the planner then knows account
    # is one page, where a sequential scan (rows met by place) is the cheapest plan. A table
    # never analyzed is assumed to be ten pages and read through its index (ids in order).
    with observer.begin() as conn:
        conn.execute(text("ANALYZE account"))
    holder = observer.connect()
    try:
        holder.execute(text("SELECT 1 FROM account WHERE id = :id FOR NO KEY UPDATE"),
                       {"id": low})
        holder_pid = int(holder.execute(text("SELECT pg_backend_pid()")).scalar_one())
        running = in_thread(accounts.transfer, bank, low, high, Decimal("1.00"))
        seen = _queued_behind(observer, holder_pid, running)
    finally:
        holder.rollback()
        holder.close()
    running.result(QUEUE_WAIT)
    if seen is None:  # it never queued behind the held row: no lock order to judge
        return
    waiter, query, locks, advisory = seen
    taken = [r for r in locks if r["row_id"] == high and str(waiter) in str(r["pids"]).split(", ")
             and r["modes"] != "For Key Share"]
    if taken and not advisory:
        raise CheckFailure(
            f"transfer({low} -> {high}) locked account {high}, the higher id, and then waited "
            f"for account {low}: it takes the rows in an order it does not control.",
            expected="no row lock on the higher account while the transfer waits for the "
                     "lower one (the lower id is locked first, whatever the direction)",
            actual=f"the transfer (pid {waiter}) holds account {high} ({taken[0]['modes']}) "
                   f"and waits for the row of account {low} the check holds",
            evidence=f"row order in the table (ctid, what a sequential scan meets first): "
                     f"{layout}\nthe check holds account {low} (FOR NO KEY UPDATE, pid "
                     f"{holder_pid}); row locks on account then (pgrowlocks):\n"
                     + table(locks, ("row_id", "modes", "pids"))
                     + f"\nthe statement it waits in: {query}\n"
                     "two opposite transfers that each lock as they scan can each hold one "
                     "row and wait for the other: a deadlock whenever the rows' places differ "
                     "between their snapshots",
            fix=("one statement that locks rows as it finds them (UPDATE ... WHERE id IN "
                 "(:a, :b)) locks them in scan order, which every update of a row changes, not "
                 "in id order. " if re.search(r"(?is)\bin\s*\(|=\s*any\s*\(", query) else "")
                + "Lock both rows first with SELECT ... WHERE id IN (:a, :b) ORDER BY id FOR "
                "NO KEY UPDATE, or update them one at a time, lower id first"
                + (f" (lower as numbers: {low} < {high}, though '{high}' sorts before '{low}' "
                   "as text)" if str(high) < str(low)
                   and not re.search(r"(?is)\bin\s*\(|=\s*any\s*\(", query) else ""),
            lesson=(READ["transfer"], READ["deadlock"]))


def _across_a_power_of_ten(bank: Engine, funded: Any) -> tuple[int, int]:
    """Two funded accounts whose ids straddle a power of ten (9 and 10, 99 and 103): "lower
    id" means the number, and ids compared as text ('10' < '9') put these two the other way.
    Ids burnt in a rolled-back INSERT bring the next id past the power of ten; accounts are
    then opened until such a pair exists, however the ids are handed out."""
    low = funded("100.00")
    if str(low).rstrip("0") == "1":  # 1, 10, 100 sort before every id one digit longer
        low = funded("100.00")
    power = 10 ** len(str(low))
    with bank.connect() as conn:
        next_id = int(conn.execute(text(
            "INSERT INTO account (kind, currency) VALUES ('SYSTEM', 'USD') RETURNING id"
        )).scalar_one())
        if power - next_id - 1 > 0:
            conn.execute(text("INSERT INTO account (kind, currency) SELECT 'SYSTEM', 'USD' "
                              "FROM generate_series(1, :n)"), {"n": power - next_id - 1})
        conn.rollback()
    opened = []
    for _ in range(120):
        high = funded("100.00")
        opened.append(high)
        if low < high and str(low) > str(high):
            return low, high
    raise RuntimeError(f"no account opened after account {low} ({opened}) has an id that "
                       "sorts before it as text; the check cannot choose its pair")


def _place_after(accounts: ModuleType, bank: Engine, observer: Engine, low: int,
                 high: int) -> str:
    """Deposit into `low` until its live row sits after `high`'s in the heap (an update
    writes a new row version; a scan meets rows by place, not by id). Returns the layout."""
    for _ in range(4):
        places = {r["id"]: r["ctid"] for r in rows(
            observer, "SELECT id, ctid::text AS ctid FROM account WHERE id IN (:a, :b)",
            a=low, b=high)}
        if _ctid(places[low]) > _ctid(places[high]):
            return f"account {high} at {places[high]}, account {low} at {places[low]}"
        call(accounts.deposit, bank, low, Decimal("1.00"))
    raise RuntimeError(f"four deposits into account {low} left its row before account "
                       f"{high}'s in the table ({places}); the check cannot lay the rows out")


def _ctid(value: str) -> tuple[int, int]:
    block, item = value.strip("()").split(",")
    return int(block), int(item)


def _queued_behind(observer: Engine, holder_pid: int, running: Any
                   ) -> tuple[int, str, list[dict[str, Any]], bool] | None:
    """Poll until a session waits for `holder_pid`; then what it has locked: (its pid, the
    statement it waits in, the row locks on account, whether it holds an advisory lock).
    None when the transfer ended, or never queued, within QUEUE_WAIT."""
    deadline = time.monotonic() + QUEUE_WAIT
    while time.monotonic() < deadline and running.alive:
        waiting = rows(observer, "SELECT pid, left(regexp_replace(query, '\\s+', ' ', 'g'), "
                                 "160) AS query FROM pg_stat_activity "
                                 "WHERE :h = ANY(pg_blocking_pids(pid)) ORDER BY pid",
                       h=holder_pid)
        if waiting:
            pid = int(waiting[0]["pid"])
            advisory = bool(scalar(observer, "SELECT count(*) FROM pg_locks WHERE pid = :p "
                                             "AND locktype = 'advisory' AND granted", p=pid))
            return pid, str(waiting[0]["query"]), row_locks(observer, "account"), advisory
        time.sleep(0.02)
    return None


def _oid(engine: Engine) -> int:
    return int(scalar(engine, "SELECT 'account'::regclass::oid"))


def _pair(workers: list[str]) -> list[str]:
    """One even (a->b) and one odd (b->a) worker among the deadlocked ones."""
    even = [w for w in workers if w.split()[-1].isdigit() and int(w.split()[-1]) % 2 == 0]
    odd = [w for w in workers if w.split()[-1].isdigit() and int(w.split()[-1]) % 2 == 1]
    return (even[:1] + odd[:1]) or workers[:2]


def test_transfers_keep_the_total(accounts: ModuleType, bank: Engine, funded: Any) -> None:
    ids = [funded("100.00") for _ in range(5)]
    plans = []
    rng = random.Random(42)
    for _ in range(30):
        plan = []
        for _ in range(4):
            src, dst = rng.sample(ids, 2)
            plan.append((src, dst, Decimal(rng.choice(("5.00", "12.50", "33.00", "60.00")))))
        plans.append(plan)

    def work(index: int) -> list[Any]:
        done = []
        for src, dst, amount in plans[index]:
            try:
                done.append(accounts.transfer(bank, src, dst, amount))
            except accounts.InsufficientFunds:
                done.append(None)
        return done

    with slow_sql(bank, 0.02, match=r"(?s)^\s*select(?!.*\bfor\s+(no\s+key\s+)?update)"):
        outcomes = run_concurrently(work, len(plans), timeout=45)
    broken = failures(outcomes)
    deadlocked = [o for o in broken if sqlstate(o.error) == "40P01"]
    if deadlocked:
        raise CheckFailure(
            "Concurrent transfers among five accounts deadlocked: two of them waited for "
            "each other's account row locks.",
            expected="each transfer succeeds or raises InsufficientFunds; no deadlock "
                     "(SQLSTATE 40P01)",
            actual=f"{len(deadlocked)} workers raised a deadlock",
            evidence=describe_errors(broken),
            fix="take the lock you will write with, on both rows, in id order, before "
                "changing either (SELECT ... WHERE id IN (:a, :b) ORDER BY id FOR NO KEY "
                "UPDATE, or two single-row UPDATEs in id order). Rows locked in different "
                "orders deadlock, and so does a shared lock (FOR SHARE, FOR KEY SHARE) that "
                "two transfers hold and each then upgrades to write; one UPDATE ... WHERE id "
                "IN (:a, :b) locks its rows in scan order, not id order",
            lesson=(READ["transfer"], READ["deadlock"]))
    if broken:
        raise CheckFailure(
            "Concurrent transfers among five accounts raised errors.",
            expected="each transfer succeeds or raises InsufficientFunds",
            actual=f"{len(broken)} workers raised", evidence=describe_errors(broken),
            lesson=READ["transfer"])
    balances = {i: balance_of(bank, i) for i in ids}
    total = sum(balances.values(), Decimal(0))
    receipts = [r for o in outcomes for r in o.value if r is not None]
    entries = int(scalar(bank, "SELECT count(DISTINCT entry_id) FROM posting "
                               "WHERE account_id = ANY(:ids) AND amount < 0", ids=ids))
    if not (total == Decimal("500.00") and min(balances.values()) >= 0):
        raise CheckFailure(
            f"{len(receipts)} concurrent transfers among five accounts of 100.00 changed the "
            "total or overdrew an account.",
            expected="the total stays 500.00 and no balance goes below 0",
            actual=f"total {fmt(total)}; balances "
                   + ", ".join(f"{i}: {fmt(v)}" for i, v in balances.items()),
            fix="lock both rows (ORDER BY id FOR NO KEY UPDATE) before reading the source balance, "
                "then update both in the same transaction", lesson=READ["transfer"])
    if entries != len(receipts):
        raise CheckFailure(
            "Every successful transfer is one ledger entry, and only those are.",
            expected=f"{len(receipts)} transfer entries",
            actual=f"{entries} entries with a debit on these accounts", lesson=READ["schema"])
    assert_ledger_agrees(bank, "after concurrent transfers", ids)


SPENDERS = 8
SLOW_READ = 0.08
PLAIN_SELECT = r"(?s)^\s*select(?!.*\bfor\s+(no\s+key\s+)?update)"


def test_transfers_racing_for_one_balance_are_refused_cleanly(
        accounts: ModuleType, bank: Engine, funded: Any) -> None:
    source = funded("100.00")
    targets = [funded("0") for _ in range(SPENDERS)]

    def spend(index: int) -> Any:
        return accounts.transfer(bank, source, targets[index], Decimal("30.00"))

    with record_sql(bank) as log, slow_sql(bank, SLOW_READ, match=PLAIN_SELECT):
        outcomes = run_concurrently(spend, SPENDERS, timeout=40)
    ok = [o for o in outcomes if o.ok]
    broken = failures(outcomes, (accounts.InsufficientFunds,))
    balance = balance_of(bank, source)
    checked = log.errors("23514")  # refused by the CHECK, even where the code caught it
    if not broken and len(ok) == 3 and balance == Decimal("10.00") and checked:
        raise CheckFailure(
            f"{SPENDERS} transfers of 30.00 from one account holding 100.00, at the same "
            f"moment: 3 went through and {SPENDERS - 3} raised InsufficientFunds, but "
            f"{len(checked)} of the refusals were the database's CHECK refusing an UPDATE "
            "(SQLSTATE 23514), turned into InsufficientFunds.",
            expected="your code decides on the balance it locked and never sends a debit the "
                     "balance does not cover: no check_violation on the engine",
            actual=f"{len(checked)} statement(s) failed with SQLSTATE 23514",
            evidence=f"{checked[0].worker}, statement by statement:\n"
                     + log.timeline([checked[0].worker], match=r"\baccount\b"),
            fix="compare the locked balance with the amount and raise InsufficientFunds "
                "before the UPDATE: the CHECK is the safety net for a bug, not the rule",
            lesson=(READ["transfer"], READ["check"]))
    if not broken and len(ok) == 3 and balance == Decimal("10.00"):
        assert_ledger_agrees(bank, "after transfers racing for one balance")
        return
    vetoed = [o for o in broken if sqlstate(o.error) == "23514"]
    raise CheckFailure(
        f"{SPENDERS} transfers of 30.00 from one account holding 100.00, at the same moment: "
        + ("the database's CHECK, not your code, refused the ones the balance did not cover."
           if vetoed else "they did not end as 3 transfers and 5 refusals."),
        expected=f"3 succeed, {SPENDERS - 3} raise InsufficientFunds, the source keeps 10.00",
        actual=f"{len(ok)} succeeded, "
               f"{sum(isinstance(o.error, accounts.InsufficientFunds) for o in outcomes)} "
               f"InsufficientFunds, {len(broken)} raised something else; source "
               f"{fmt(balance)}",
        evidence=(describe_errors(broken) + "\n" if broken else "")
                 + f"two workers, statement by statement (every plain SELECT answered "
                 f"{SLOW_READ * 1000:.0f} ms late):\n"
                 + log.timeline([f"worker {o.index}" for o in (vetoed or ok)[:2]],
                                match=r"\baccount\b"),
        fix="the balance was judged on a read made before the rows were locked, so every "
            "transfer saw 100.00. Lock both rows first (SELECT ... ORDER BY id FOR NO KEY "
            "UPDATE) and decide on what that locked read returns" if vetoed else None,
        lesson=(READ["transfer"], READ["race"]))
