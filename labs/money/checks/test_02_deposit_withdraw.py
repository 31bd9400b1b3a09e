"""Stage deposit-withdraw: Decimal end to end, one conditional UPDATE per withdrawal, and a
balance that stays exact while many threads and processes hammer one account."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterator
from decimal import Decimal
from types import ModuleType
from typing import Any

import pytest
from _support import (
    READ,
    all_of,
    assert_ledger_agrees,
    balance_of,
    describe_errors,
    failing_commits,
    failures,
    first_of,
    injected,
    ledger_table,
    posted_sum,
    process_hammer,
    see,
)
from sqlalchemy import Engine, text

from dojo.checks import (
    CheckFailure,
    apply_schema,
    call,
    first_line,
    fmt,
    raised,
    rows,
    scalar,
    sqlstate,
    table,
)
from dojo.checks.database import create_database, drop_database
from dojo.checks.faults import run_concurrently, slow_sql
from dojo.checks.observers import record_sql

pytestmark = pytest.mark.stage("deposit-withdraw")

RACE_WORKERS = 40
RACE_ROUNDS = 3
# Every plain SELECT answers 80 ms late: a code path that reads the balance and decides in
# Python has all 40 workers read before any of them writes. The conditional UPDATE does not
# care, and neither does a SELECT ... FOR UPDATE (it is not slowed: it serialises anyway).
SLOW_READ = 0.08
PLAIN_SELECT = r"(?s)^\s*select(?!.*\bfor\s+(no\s+key\s+)?update)"


def _entries_on(engine: Engine, account_id: int) -> int:
    return int(scalar(engine, "SELECT count(DISTINCT entry_id) FROM posting "
                              "WHERE account_id = :id", id=account_id))


def test_amounts_are_exact_decimals(accounts: ModuleType, bank: Engine) -> None:
    account_id = call(accounts.open_account, bank, currency="USD")
    steps: list[tuple[str, str, str]] = [
        ("deposit", "0.10", "0.10"), ("deposit", "0.10", "0.20"), ("deposit", "0.10", "0.30"),
        ("withdraw", "0.20", "0.10"), ("deposit", "98765432109876.43", "98765432109876.53"),
        ("withdraw", "0.01", "98765432109876.52")]
    for op, amount, expected in steps:
        receipt = call(getattr(accounts, op), bank, account_id, Decimal(amount))
        got = getattr(receipt, "balance", receipt)
        if not (isinstance(got, Decimal) and got == Decimal(expected)):
            raise CheckFailure(
                f"{op}({fmt(Decimal(amount))}) returned the wrong balance.",
                expected=f"Receipt.balance == Decimal('{expected}')",
                actual=f"{type(got).__name__} {got!r}",
                evidence="a float cannot hold 0.1 exactly (0.1 + 0.2 = 0.30000000000000004) and "
                         "near 10^14 it cannot hold a cent at all; psycopg maps numeric to "
                         "Decimal, so Decimal all the way needs no conversion anywhere",
                fix="never call float(); pass the Decimal to SQL and return what RETURNING gives",
                lesson=READ["numbers"])
    now = call(accounts.balance, bank, account_id)
    if not (isinstance(now, Decimal) and now == Decimal("98765432109876.52")):
        raise CheckFailure(
            "balance() does not report the exact balance.",
            expected="Decimal('98765432109876.52')", actual=f"{type(now).__name__} {now!r}",
            lesson=READ["numbers"])
    entries = _entries_on(bank, account_id)
    if entries != len(steps):
        raise CheckFailure(
            "Every deposit and withdrawal is one ledger entry.",
            expected=f"{len(steps)} entries with a posting on account {account_id}",
            actual=f"{entries}", evidence=ledger_table(bank, account_id), lesson=READ["schema"])
    # a second currency: its clearing leg belongs on a clearing account of that currency
    euros = call(accounts.open_account, bank, currency="EUR")
    call(accounts.deposit, bank, euros, Decimal("12.34"))
    call(accounts.withdraw, bank, euros, Decimal("2.17"))
    assert_ledger_agrees(bank, "after six deposits and withdrawals in USD, and two in EUR",
                         [account_id, euros])


# 0.1 has no exact binary value, 10.25 has one: a float turned into a Decimal (Decimal(x),
# Decimal(str(x))) passes the two-decimal rule there, so only a type check refuses both
FLOATS = (0.1, 10.25)


def test_float_amounts_are_refused(accounts: ModuleType, bank: Engine, funded: Any) -> None:
    account_id = funded("100.00")
    for op in ("deposit", "withdraw"):
        for amount in FLOATS:
            error = raised(getattr(accounts, op), bank, account_id, amount)
            balance = balance_of(bank, account_id)
            if isinstance(error, TypeError | ValueError) and balance == Decimal("100.00"):
                continue
            raise CheckFailure(
                f"{op}() accepted a float amount ({amount!r}).",
                expected="TypeError (or ValueError): amounts are Decimal; balance 100.00 as "
                         "before",
                actual=(first_line(error) if error else "it returned")
                       + f"; balance {fmt(balance)}",
                evidence="a float that reaches the ledger is already wrong (0.1 is stored as "
                         "0.1000000000000000055511151231257827...); refuse it at the door, "
                         "even one like 10.25 that a Decimal would hold exactly",
                fix="if not isinstance(amount, Decimal): raise TypeError(...), before "
                    "converting or validating anything" if error is None else None,
                lesson=READ["numbers"])


def test_overdraft_and_bad_amounts_are_refused(accounts: ModuleType, bank: Engine,
                                               funded: Any) -> None:
    account_id = funded("100.00")
    error = raised(accounts.withdraw, bank, account_id, Decimal("100.01"))
    if not isinstance(error, accounts.InsufficientFunds):
        raise CheckFailure(
            "Withdrawing 100.01 from 100.00 must be refused.",
            expected="accounts.InsufficientFunds", actual=first_line(error),
            fix="UPDATE ... WHERE id = :id AND balance >= :amount; zero rows means insufficient "
                "funds" if error is None else None, lesson=READ["race"])
    if not (balance_of(bank, account_id) == Decimal("100.00") and
            _entries_on(bank, account_id) == 1):
        raise CheckFailure(
            "A refused withdrawal must leave no trace.",
            expected="balance 100.00 and only the funding deposit in the ledger",
            actual=f"balance {fmt(balance_of(bank, account_id))}",
            evidence=ledger_table(bank, account_id), lesson=READ["race"])
    missing = raised(accounts.withdraw, bank, 987654321, Decimal("1.00"))
    if not isinstance(missing, accounts.AccountNotFound):
        raise CheckFailure(
            "A withdrawal from an account that does not exist must say so.",
            expected="accounts.AccountNotFound", actual=first_line(missing),
            fix="zero rows from the conditional UPDATE: look the account up to tell 'no such "
                "account' from 'insufficient funds'"
            if isinstance(missing, accounts.InsufficientFunds) else None, lesson=READ["race"])
    # every operation on an id that names no account says so: balance() as much as a deposit
    # (an empty account and no account are different answers)
    for what, missing in (("balance(987654321)", raised(accounts.balance, bank, 987654321)),
                          ("deposit(987654321, 1.00)",
                           raised(accounts.deposit, bank, 987654321, Decimal("1.00")))):
        if not isinstance(missing, accounts.AccountNotFound):
            raise CheckFailure(
                f"{what}: account 987654321 does not exist, and the call must say so.",
                expected="accounts.AccountNotFound",
                actual=first_line(missing) if missing is not None
                else "it returned " + repr(call(accounts.balance, bank, 987654321))
                if what.startswith("balance") else "it returned",
                fix="read the account's row (its cached balance): no row means AccountNotFound; "
                    "a sum of postings is 0 for an account that does not exist"
                if missing is None and what.startswith("balance") else None,
                lesson=READ["race"])
    for bad in ("0", "-5.00", "1.005"):
        error = raised(accounts.deposit, bank, account_id, Decimal(bad))
        if not isinstance(error, ValueError):
            raise CheckFailure(
                f"deposit(Decimal('{bad}')) must be refused.",
                expected="ValueError (amounts are positive, with at most 2 decimals)",
                actual=first_line(error), lesson=READ["numbers"])
    # a zero after the cent is not a third decimal: 12.340 is 12.34 (an amount read back from a
    # numeric(20,4) column comes as 12.3400)
    for op, spelled, after in (("deposit", "12.340", "112.34"), ("withdraw", "12.3400", "100.00")):
        error, receipt = None, None
        try:
            receipt = getattr(accounts, op)(bank, account_id, Decimal(spelled))
        except Exception as exc:
            error = exc
        if error is None and getattr(receipt, "balance", None) == Decimal(after) == balance_of(
                bank, account_id):
            continue
        raise CheckFailure(
            f"{op}(Decimal('{spelled}')) must go through: {spelled} is "
            f"{fmt(Decimal(spelled))}, a whole number of cents.",
            expected=f"balance {after}: zeros after the cent are not more than two decimals; "
                     "only a digit other than 0 there is (1.005)",
            actual=(first_line(error) if error is not None else f"it returned {receipt}")
                   + f"; balance {fmt(balance_of(bank, account_id))}",
            fix="compare the value, not its spelling: amount != amount.quantize(Decimal('0.01')) "
                "refuses 1.005 and accepts 12.340; the exponent (as_tuple(), str()) counts the "
                "zeros too" if isinstance(error, ValueError) else None,
            lesson=READ["numbers"])
    receipt = call(accounts.withdraw, bank, account_id, Decimal("100.00"))
    if receipt.balance != 0:
        raise CheckFailure(
            "Withdrawing the whole balance is allowed.", expected="balance 0.00",
            actual=fmt(receipt.balance), lesson=READ["race"])
    assert_ledger_agrees(bank, "after refused and accepted withdrawals", [account_id])


def test_concurrent_withdrawals_never_overdraw(accounts: ModuleType, bank: Engine,
                                               funded: Any) -> None:
    for round_no in range(1, RACE_ROUNDS + 1):
        account_id = funded("100.00")

        def withdraw(_: int, account_id: int = account_id) -> Any:
            return accounts.withdraw(bank, account_id, Decimal("10.00"))

        with record_sql(bank) as log, slow_sql(bank, SLOW_READ, match=PLAIN_SELECT):
            outcomes = run_concurrently(withdraw, RACE_WORKERS, timeout=40)
        ok = [o for o in outcomes if o.ok]
        unexpected = failures(outcomes, (accounts.InsufficientFunds,))
        balance, posted = balance_of(bank, account_id), posted_sum(bank, account_id)
        paid = Decimal("10.00") * len(ok)
        if unexpected:
            raise CheckFailure(
                f"{RACE_WORKERS} concurrent withdrawals of 10.00 from 100.00: some failed with "
                f"errors (round {round_no}).",
                expected="each withdrawal succeeds or raises InsufficientFunds",
                actual=f"{len(unexpected)} raised something else",
                evidence=describe_errors(unexpected) + "\n" + log.timeline(
                    [f"worker {o.index}" for o in unexpected[:2]]),
                fix="one conditional UPDATE ... WHERE balance >= :amount needs no retries and "
                    "cannot fail on a race", lesson=READ["race"])
        if len(ok) == 10 and balance == 0 and posted == 0:
            reported = sorted((o.value.balance for o in ok), reverse=True)
            if reported != [Decimal(90 - 10 * n) for n in range(10)]:
                raise CheckFailure(
                    f"{RACE_WORKERS} concurrent withdrawals of 10.00 from 100.00: the money is "
                    f"right, but the receipts report balances that never existed (round "
                    f"{round_no}).",
                    expected="the 10 receipts report 90.00, 80.00, ..., 0.00: each the balance "
                             "its own withdrawal left",
                    actual="receipts report " + ", ".join(fmt(b) for b in reported),
                    evidence="a receipt's balance must come from the statement that changed "
                             "it (UPDATE ... RETURNING balance), not from a read made before "
                             "the other withdrawals committed",
                    lesson=READ["race"])
            continue
        winners = [f"worker {o.index}" for o in ok[:2]]
        anomaly = ("lost update" if posted != balance or balance != Decimal("100.00") - paid
                   else "overdraft")
        raise CheckFailure(
            f"{RACE_WORKERS} concurrent withdrawals of 10.00 from 100.00 broke the account: "
            f"a {anomaly} (round {round_no} of {RACE_ROUNDS}).",
            expected="exactly 10 succeed, 30 raise InsufficientFunds, balance 0.00, "
                     "postings sum 0.00",
            actual=f"{len(ok)} succeeded ({fmt(paid)} paid out); balance {fmt(balance)}; the "
                   f"account's postings sum to {fmt(posted)}",
            evidence=f"two of the successful workers, statement by statement (every SELECT "
                     f"answered {SLOW_READ * 1000:.0f} ms late):\n"
                     + log.timeline(winners, match=r"\bbalance\b"),
            fix="do not read the balance and decide in Python: both workers read the same "
                "balance and the second write overwrites the first (a lost update). Let the "
                "database decide in one statement: UPDATE account SET balance = balance - "
                ":amount WHERE id = :id AND balance >= :amount, and treat zero rows as "
                "InsufficientFunds",
            lesson=(READ["race"], READ["lost-update"]))
    assert_ledger_agrees(bank, "after the concurrent withdrawals")


HAMMER_OPERATIONS = 24  # per process, over its 4 threads


def test_processes_hammering_one_account_keep_it_exact(accounts: ModuleType, bank: Engine,
                                                       funded: Any, learner: Any) -> None:
    account_id = funded("200.00")
    url = bank.url.render_as_string(hide_password=False)
    worker = functools.partial(process_hammer, str(learner.dir), url, account_id, 7,
                               HAMMER_OPERATIONS)
    lowest: list[Decimal] = []
    done = threading.Event()

    def watch() -> None:  # what any reader sees while the processes hammer
        while not done.is_set():
            lowest.append(balance_of(bank, account_id))
            done.wait(0.02)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        outcomes = run_concurrently(worker, 3, processes=True, timeout=50)
    finally:
        done.set()
        watcher.join(5)
    if not (min(lowest, default=Decimal(0)) >= 0):
        raise CheckFailure(
            "While 3 processes hammered the account, a reader saw a negative balance.",
            expected="the balance never below 0.00", actual=f"lowest seen {fmt(min(lowest))}",
            fix="withdraw with UPDATE ... WHERE balance >= :amount, and keep the CHECK",
            lesson=READ["check"])
    broken = [o for o in outcomes if not o.ok]
    if broken:
        raise CheckFailure(
            "A hammering process did not finish.",
            expected=f"3 processes x 4 threads x {HAMMER_OPERATIONS // 4} operations, each "
                     "returning", actual=describe_errors(broken), lesson=READ["race"])
    results = [r for o in outcomes for r in o.value]
    errors = [r for r in results if r[2] not in ("ok", "refused")]
    if errors:
        raise CheckFailure(
            "Deposits and withdrawals from 3 processes at once raised errors.",
            expected="each operation succeeds or raises InsufficientFunds",
            actual=f"{len(errors)} errors, e.g. {errors[0][0]} {errors[0][1]}: {errors[0][2]}",
            lesson=READ["race"])
    deposited = sum((Decimal(a) for op, a, r in results if op == "deposit" and r == "ok"),
                    Decimal(0))
    withdrawn = sum((Decimal(a) for op, a, r in results if op == "withdraw" and r == "ok"),
                    Decimal(0))
    expected = Decimal("200.00") + deposited - withdrawn
    balance, posted = balance_of(bank, account_id), posted_sum(bank, account_id)
    if not (balance == expected == posted):
        raise CheckFailure(
            f"{len(results)} operations from 3 processes left the wrong balance.",
            expected=f"200.00 + {fmt(deposited)} deposited - {fmt(withdrawn)} withdrawn = "
                     f"{fmt(expected)}, and the postings agree",
            actual=f"balance {fmt(balance)}, postings sum {fmt(posted)} "
                   f"(off by {fmt(balance - expected)}: "
                   f"{'lost updates' if balance != expected else 'postings out of step'})",
            fix="each operation is one transaction: one conditional UPDATE and its postings",
            lesson=READ["race"])
    assert_ledger_agrees(bank, "after the process hammer")


DEPOSITS = [Decimal(f"{n}.{n * 7 % 100:02d}") for n in range(1, 17)]  # 16 distinct amounts


def test_concurrent_deposits_report_the_balance_they_left(accounts: ModuleType, bank: Engine,
                                                          funded: Any) -> None:
    account_id = funded("100.00")

    def deposit(index: int) -> Any:
        return accounts.deposit(bank, account_id, DEPOSITS[index])

    with slow_sql(bank, SLOW_READ, match=PLAIN_SELECT):
        outcomes = run_concurrently(deposit, len(DEPOSITS), timeout=40)
    broken = failures(outcomes)
    if broken:
        raise CheckFailure(
            f"{len(DEPOSITS)} concurrent deposits into one account raised errors.",
            expected="every deposit commits", actual=f"{len(broken)} raised",
            evidence=describe_errors(broken), lesson=READ["race"])
    balance = balance_of(bank, account_id)
    total = Decimal("100.00") + sum(DEPOSITS, Decimal(0))
    history = sorted(((o.value.balance - DEPOSITS[o.index], o.value.balance, o.index)
                      for o in outcomes), key=lambda h: h[1])
    problems = []
    start = Decimal("100.00")
    for before, after, index in history:
        if before != start:
            problems.append(f"worker {index}: deposit {fmt(DEPOSITS[index])} reports balance "
                            f"{fmt(after)}, so it started from {fmt(before)}, but the balance "
                            f"before it was {fmt(start)}")
        start = after
    if balance != total or problems:
        raise CheckFailure(
            f"{len(DEPOSITS)} concurrent deposits of different amounts: the receipts do not "
            "add up to one history.",
            expected=f"balance {fmt(total)}, and the receipts, sorted, each the previous "
                     "one's balance plus its own amount, from 100.00 to the final balance",
            actual=f"balance {fmt(balance)}; receipts off history: {first_of(problems)}",
            evidence=(all_of(problems) + "\n\n" if problems else "")
                     + "each deposit as its receipt reports it (before -> after), every plain "
                     f"SELECT answered {SLOW_READ * 1000:.0f} ms late:\n"
                     + "\n".join(f"{fmt(b):>8} -> {fmt(a):<8} deposit {fmt(DEPOSITS[i])} "
                                 f"(worker {i})" for b, a, i in history),
            fix="report the balance the UPDATE itself returned (UPDATE ... SET balance = "
                "balance + :amount ... RETURNING balance), not one read before it"
                if balance == total else None,
            lesson=(READ["race"], READ["lost-update"]))
    assert_ledger_agrees(bank, "after concurrent deposits", [account_id])


MIXED_WORKERS = 12
# Every statement that takes a row lock on account answers late, with the lock held: two
# transactions that take the customer's and the clearing account's rows in opposite orders
# each hold one and wait for the other.
SLOW_LOCK = 0.02
LOCKING = r"for\s+(no\s+key\s+)?update|^\s*update\s+account"


def test_deposits_and_withdrawals_do_not_deadlock(accounts: ModuleType, bank: Engine,
                                                  funded: Any) -> None:
    account_id = funded("1000.00")

    def move(index: int) -> Any:
        amount = Decimal(f"{index + 1}.25")
        if index % 2 == 0:
            return accounts.deposit(bank, account_id, amount)
        return accounts.withdraw(bank, account_id, amount)

    with record_sql(bank) as log, slow_sql(bank, SLOW_LOCK, match=LOCKING):
        outcomes = run_concurrently(move, MIXED_WORKERS, timeout=40)
    deadlocks = log.errors("40P01")
    dead = sorted({s.worker for s in deadlocks}
                  | {f"worker {o.index}" for o in outcomes if sqlstate(o.error) == "40P01"})
    if dead:
        detail = deadlocks[0].error if deadlocks else first_line(
            next(o.error for o in outcomes if sqlstate(o.error) == "40P01"))
        raise CheckFailure(
            f"{MIXED_WORKERS} deposits and withdrawals on one account (even workers deposit, "
            "odd ones withdraw) deadlocked.",
            expected="every one commits; no deadlock (SQLSTATE 40P01), not even one your code "
                     "retried",
            actual=f"PostgreSQL detected {max(len(deadlocks), 1)} deadlock(s) among "
                   f"{len(dead)} worker(s)",
            evidence=f"deadlocked: {', '.join(dead[:6])}\n"
                     f"PostgreSQL said: {log.name_pids(detail or '')[:400]}\n\n"
                     f"statements on account (row locks answered {SLOW_LOCK * 1000:.0f} ms "
                     "late):\n" + log.timeline((log.pids_in(detail or '') or dead)[:2],
                                               match=r"\baccount\b"),
            fix="two operations took the same rows (the customer's and the SYSTEM clearing "
                "account's) in opposite orders. Take them in one order in every operation: "
                "the customer row first, the clearing account after it, say",
            lesson=see("race deadlock"))
    broken = failures(outcomes)
    if broken:
        raise CheckFailure(
            "Mixed deposits and withdrawals on one account raised errors.",
            expected="every one commits (the account holds 1000.00)",
            actual=f"{len(broken)} raised", evidence=describe_errors(broken),
            lesson=READ["race"])
    assert_ledger_agrees(bank, "after mixed deposits and withdrawals", [account_id])


def test_a_failed_commit_leaves_no_trace(accounts: ModuleType, bank: Engine,
                                         funded: Any) -> None:
    account_id = funded("100.00")
    for op, amount in (("deposit", "12.34"), ("withdraw", "56.78")):
        with failing_commits(bank, account_id):
            error = raised(getattr(accounts, op), bank, account_id, Decimal(amount))
        balance, posted = balance_of(bank, account_id), posted_sum(bank, account_id)
        if balance == posted == Decimal("100.00") and error is not None:
            continue
        moved_alone = balance != posted
        raise CheckFailure(
            f"{op}({amount}) failed at COMMIT (the check made the database refuse the "
            "transaction that wrote its postings), and "
            + ("it left a trace." if balance != Decimal("100.00") or moved_alone else
               "the call returned as if it had succeeded: a receipt for money that never "
               "moved."),
            expected="the call raises (any error), and nothing changed: balance 100.00 and "
                     "postings summing to 100.00, as before the call",
            actual=f"balance {fmt(balance)}, postings sum to {fmt(posted)}; the call "
                   + (f"raised {first_line(error)}" if error else "returned")
                   + ("" if error is None or injected(error) else " (not the injected error)"),
            evidence=ledger_table(bank, account_id),
            fix="the balance change was committed in another transaction than the postings: "
                "do both in one `with engine.begin()` block, so they commit or roll back "
                "together" if moved_alone else
                "let the COMMIT's error reach the caller: a receipt is the promise that the "
                "money moved, and a caller that gets one will not retry"
                if error is None and balance == posted == Decimal("100.00") else None,
            lesson=see("schema race"))
    assert_ledger_agrees(bank, "after failed commits", [account_id])


@pytest.fixture
def second_bank(services: Any, learner: Any, bank: Engine) -> Iterator[Engine]:
    """Another fresh database with the learner's schema, for the same import of the module."""
    db = create_database(services, hint="second_bank")
    try:
        engine = db.make_engine(pool_size=2, max_overflow=0)
        apply_schema(engine, learner.dir)
        yield engine
    finally:
        drop_database(services, db)


def test_each_database_has_its_own_clearing_accounts(accounts: ModuleType, bank: Engine,
                                                     second_bank: Engine) -> None:
    """One import of the module, two databases in turn (a process outlives a database: a
    restore, a re-created schema, the next check): what it keeps between calls must not carry
    one database's ids into the other."""
    _clearing_legs_in_another_life(accounts, bank, lambda: second_bank, "second database")


def test_a_recreated_schema_gets_its_own_clearing_accounts(accounts: ModuleType, bank: Engine,
                                                           learner: Any) -> None:
    """The same database, the same URL and the same Engine, its schema dropped and schema.sql
    run again (a restore, a re-created schema): ids kept from before it belong to rows that
    are gone, whatever the cache is keyed by."""
    def recreate() -> Engine:
        with bank.begin() as conn:
            conn.exec_driver_sql("DROP SCHEMA public CASCADE; CREATE SCHEMA public")
        apply_schema(bank, learner.dir)
        return bank

    _clearing_legs_in_another_life(accounts, bank, recreate,
                                   "same database after its schema was re-created")


def _clearing_legs_in_another_life(accounts: ModuleType, bank: Engine,
                                   second: Callable[[], Engine], life: str) -> None:
    """Deposits and withdrawals on `bank`, then on `second()` (another database, or `bank`
    re-created): there, customer accounts over every id the first life gave a SYSTEM account,
    and each clearing leg on a SYSTEM account of the second life."""
    first = call(accounts.open_account, bank, currency="USD")
    call(accounts.deposit, bank, first, Decimal("41.37"))
    call(accounts.withdraw, bank, first, Decimal("3.19"))
    euros = call(accounts.open_account, bank, currency="EUR")
    call(accounts.deposit, bank, euros, Decimal("8.06"))
    system_ids = [int(i) for i in (scalar(bank, "SELECT array_agg(id ORDER BY id) FROM account "
                                                "WHERE kind = 'SYSTEM'") or [])]
    second_bank = second()
    # the second database: customer accounts (inserted by the check) over every id the first
    # one gave a SYSTEM account, then one more for the learner's deposit and withdrawal
    with second_bank.begin() as conn:
        conn.execute(text("INSERT INTO account (kind, currency) SELECT 'CUSTOMER', 'USD' "
                          "FROM generate_series(1, :n)"), {"n": max(system_ids, default=0) + 2})
    customer = call(accounts.open_account, second_bank, currency="USD")
    problems, stale = [], False
    for op, amount in (("deposit", "27.83"), ("withdraw", "5.06")):
        error = raised(getattr(accounts, op), second_bank, customer, Decimal(amount))
        if error is not None:
            problems.append(f"{op}({amount}) raised {first_line(error)}")
            stale = stale or sqlstate(error) in ("23514", "23503")
    legs = rows(second_bank, """
        SELECT e.kind AS entry, p.account_id AS account, a.kind, a.currency, p.amount
          FROM posting p JOIN account a ON a.id = p.account_id
          JOIN ledger_entry e ON e.id = p.entry_id
         WHERE p.entry_id IN (SELECT entry_id FROM posting WHERE account_id = :c)
           AND p.account_id <> :c ORDER BY p.id""", c=customer)
    for leg in legs:
        if leg["kind"] != "SYSTEM" or leg["currency"].strip() != "USD":
            problems.append(f"the {leg['entry']} entry's clearing leg {fmt(leg['amount'])} "
                            f"went to account {leg['account']}, a {leg['currency'].strip()} "
                            f"{leg['kind']} account")
            stale = stale or leg["account"] in system_ids
    if not problems and balance_of(second_bank, customer) != Decimal("22.77"):
        problems.append(f"balance {fmt(balance_of(second_bank, customer))}")
    if problems:
        raise CheckFailure(
            f"The same accounts module, called again with the {life}, moved money wrongly "
            "there.",
            expected=f"in the {life}, deposit 27.83 and withdraw 5.06 go through "
                     "(balance 22.77), each with its clearing leg on a USD SYSTEM account of "
                     "that database",
            actual="; ".join(problems[:3]),
            evidence=f"SYSTEM accounts before: ids {system_ids}; in the {life}, those ids "
                     "are customer accounts. Postings of the entries there:\n"
                     + table(legs, ("entry", "account", "kind", "currency", "amount")),
            fix="an account id kept between calls belongs to the database, and the schema, it "
                "came from: a cache keyed by the engine or its URL outlives a re-created "
                "schema. Look the clearing account up in the transaction that posts to it (by "
                "kind and currency), or check a kept id there" if stale else None,
            lesson=READ["schema"])
