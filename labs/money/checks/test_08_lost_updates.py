"""Stage lost-updates: apply_interest computes in Python (its rule may be slow), so it reads
without a lock and writes with UPDATE ... WHERE version = :read; a deposit that commits in
between is detected and the interest is recomputed. Nothing is ever lost.

The checks stall the learner's rule at a chosen moment and slip a deposit in, then compare
what each operation says it started from with what the account really held."""

from __future__ import annotations

import threading
import time
from decimal import ROUND_HALF_EVEN, Decimal
from types import ModuleType
from typing import Any

import pytest
from _support import (
    READ,
    all_of,
    assert_ledger_agrees,
    assert_nothing_held,
    balance_of,
    describe_errors,
    failures,
    first_of,
    held_during_call,
    posted_sum,
)
from sqlalchemy import Engine

from dojo.checks import CheckFailure, Running, call, first_line, fmt, in_thread, raised, table
from dojo.checks.faults import run_concurrently
from dojo.checks.observers import SESSION_COLUMNS, ensure_pgrowlocks, row_locks, sessions

pytestmark = pytest.mark.stage("lost-updates")

CENT = Decimal("0.01")


def one_percent(balance: Decimal) -> Decimal:
    return (balance * Decimal("0.01")).quantize(CENT, ROUND_HALF_EVEN)


class StallingRule:
    """An interest rule that records every balance it is given and, on its first call, waits
    until the check releases it: the window in which the check deposits."""

    def __init__(self, compute: Any = one_percent, stall_first: bool = True,
                 pause: float = 0.0) -> None:
        self.compute = compute
        self.seen: list[Decimal] = []
        self.entered = threading.Event()
        self.go = threading.Event()
        self.stall_first = stall_first
        self.pause = pause
        self._lock = threading.Lock()

    def __call__(self, balance: Decimal) -> Decimal:
        with self._lock:
            self.seen.append(balance)
            first = len(self.seen) == 1
        if first and self.stall_first:
            self.entered.set()
            self.go.wait(10)
        if self.pause:
            time.sleep(self.pause)  # a pricing call
        return self.compute(balance)


def start_interest(accounts: ModuleType, bank: Engine, account_id: int,
                   rule: StallingRule) -> Running:
    """apply_interest in a thread, once its rule has been called (and is stalled)."""
    job = in_thread(accounts.apply_interest, bank, account_id, rule)
    if not rule.entered.wait(5):
        job.join(5)
        if isinstance(job.error, CheckFailure):
            raise job.error  # a stub: not written yet
        raise CheckFailure("apply_interest() never called the interest rule.",
                           expected="rule(balance) called within 5 s",
                           actual=first_line(job.error) if job.error
                           else f"returned {job.value}", lesson=READ["locking"])
    return job


def test_interest_sees_a_deposit_made_while_it_computed(accounts: ModuleType, bank: Engine,
                                                        funded: Any) -> None:
    account_id = funded("1000.00")
    have_rowlocks = ensure_pgrowlocks(bank)
    rule = StallingRule()
    interest = start_interest(accounts, bank, account_id, rule)
    started = time.monotonic()
    depositor = in_thread(raised, accounts.deposit, bank, account_id, Decimal("50.00"))
    blocked = not depositor.join(3)
    waited = time.monotonic() - started
    evidence = ""
    if blocked:
        evidence = (table(sessions(bank, ("account",)), SESSION_COLUMNS)
                    + "\nrow locks on account: "
                    + (", ".join(f"{r['row_id']} ({r['modes']}) by {r['pids']}"
                                 for r in row_locks(bank, "account")) if have_rowlocks else "n/a"))
    rule.go.set()
    interest.join(15)
    depositor.join(15)
    if blocked:
        raise CheckFailure(
            f"A deposit on account {account_id} waited {waited:.1f} s while apply_interest's rule "
            "was still computing.",
            expected="the deposit commits at once: no lock is held while the rule runs",
            actual="the deposit was blocked until the rule returned",
            evidence="pg_stat_activity + pg_locks while the rule was stalled:\n" + evidence,
            fix="the rule may call a pricing service and take seconds; a row lock (SELECT ... "
                "FOR UPDATE) held through it blocks every payment on the account. Read balance "
                "and version without a lock, compute, then UPDATE ... WHERE version = :read",
            lesson=READ["locking"])
    if interest.error is not None:
        raise CheckFailure("apply_interest() raised after a deposit slipped in.",
                           expected="it detects the change and retries by itself",
                           actual=first_line(interest.error), lesson=READ["locking"])
    result = interest.value
    final = balance_of(bank, account_id)
    expected = Decimal("1050.00") + one_percent(Decimal("1050.00"))
    seen = ", ".join(fmt(b) for b in rule.seen)
    if not (final == expected and result is not None and
            result.balance_before == Decimal("1050.00")):
        raise CheckFailure(
            "A deposit committed while apply_interest was computing, and the result lost "
            "it: a lost update." if final < Decimal("1050.00") + Decimal("10.00")
            else "apply_interest credited interest computed from a balance that no longer "
                 "existed.",
            expected=f"the rule called again with 1050.00 and the balance 1050.00 + 10.50 = "
                     f"{fmt(expected)}",
            actual=f"balance {fmt(final)}; the rule was given: {seen}; apply_interest "
                   f"returned {result}",
            evidence="the interleaving the check forced:\n"
                     "  1. apply_interest read balance 1000.00 and called the rule\n"
                     "  2. while the rule ran, deposit(50.00) committed: balance 1050.00\n"
                     f"  3. apply_interest wrote its result: the balance became {fmt(final)}, "
                     f"though the postings say {fmt(posted_sum(bank, account_id))}",
            fix="UPDATE account SET balance = :new, version = version + 1 WHERE id = :id AND "
                "version = :read_version; zero rows means someone changed the account: read "
                "it again and recompute. Every other balance change must bump version too",
            lesson=(READ["locking"], READ["lost-update"]))
    assert_ledger_agrees(bank, "after interest and a concurrent deposit", [account_id])


def test_interest_sees_withdrawals_and_transfers_made_while_it_computed(
        accounts: ModuleType, bank: Engine, funded: Any) -> None:
    other = funded("1000.00")
    moves = [
        ("withdraw(account, 50.00)", Decimal("-50.00"),
         lambda a: accounts.withdraw(bank, a, Decimal("50.00"))),
        ("transfer(other, account, 50.00)", Decimal("50.00"),
         lambda a: accounts.transfer(bank, other, a, Decimal("50.00"))),
        ("transfer(account, other, 50.00)", Decimal("-50.00"),
         lambda a: accounts.transfer(bank, a, other, Decimal("50.00"))),
        # apply_interest's own write is a balance change too: a second interest that reads
        # the same version and writes first must make the stalled one recompute
        ("another apply_interest(account) (1 % of 1000.00)", Decimal("10.00"),
         lambda a: accounts.apply_interest(bank, a, one_percent)),
    ]
    for label, delta, move in moves:
        account_id = funded("1000.00")
        rule = StallingRule()
        interest = start_interest(accounts, bank, account_id, rule)
        mover = in_thread(raised, move, account_id)
        blocked = not mover.join(3)
        rule.go.set()
        interest.join(15)
        move_error = mover.result(15)  # what the move raised (its NotWritten propagates)
        if move_error is not None:
            raise CheckFailure(f"Setting up: {label} raised while apply_interest computed.",
                               expected="it commits", actual=first_line(move_error),
                               lesson=READ["locking"])
        if interest.error is not None:
            raise CheckFailure(f"apply_interest() raised after {label} slipped in.",
                               expected="it detects the change and retries by itself",
                               actual=first_line(interest.error), lesson=READ["locking"])
        start = Decimal("1000.00") + delta
        expected = start + one_percent(start)
        result = interest.value
        final = balance_of(bank, account_id)
        seen = ", ".join(fmt(b) for b in rule.seen)
        if not (not blocked and final == expected and result is not None and
                result.balance_before == start):
            raise CheckFailure(
                f"{label} committed while apply_interest was computing, and apply_interest "
                "did not notice: its optimistic check only sees changes that bump version.",
                expected=f"the rule called again with {fmt(start)} and the balance "
                         f"{fmt(start)} + {fmt(one_percent(start))} = {fmt(expected)}",
                actual=f"balance {fmt(final)}; the rule was given: {seen}; apply_interest "
                       f"returned {result}" + ("; the move waited for the rule" if blocked
                                               else ""),
                evidence="the interleaving the check forced:\n"
                         "  1. apply_interest read balance 1000.00 (and its version), called "
                         "the rule\n"
                         f"  2. while the rule ran, {label} committed: balance {fmt(start)}\n"
                         f"  3. apply_interest wrote {fmt(final)}; the postings say "
                         f"{fmt(posted_sum(bank, account_id))}"
                         + ("" if final == expected else " (a lost update)"),
                fix="every statement that changes a balance (deposit, withdraw, both legs of "
                    "a transfer, the exchange debit and credit, and apply_interest's own write) "
                    "must also SET version = version + 1, or the UPDATE ... WHERE version = "
                    ":read of apply_interest matches a row that has changed (a trigger that "
                    "bumps it works too)",
                lesson=(READ["locking"], READ["lost-update"]))
    assert_ledger_agrees(bank, "after interest racing withdrawals and transfers")


INTEREST_THREAD = "dojo-learner-apply_interest"  # in_thread's name for apply_interest
SLIPPED = Decimal("53.17")
MAX_READS = 6  # statements before the rule tried one by one (a design sends one or two)


class SlipAfterRead:
    """Counts the statements apply_interest sends (on its own thread) before it first calls
    its rule, and after the `slip_at`-th of them has run commits a deposit from another thread
    before letting apply_interest go on: a change between two reads of one attempt."""

    def __init__(self, accounts: ModuleType, bank: Engine, account_id: int,
                 slip_at: int | None) -> None:
        self.accounts, self.bank, self.account_id = accounts, bank, account_id
        self.slip_at = slip_at
        self.seen: list[Decimal] = []
        self.reads: list[str] = []
        self.deposit: Running | None = None
        self.committed_in_window = False

    def rule(self, balance: Decimal) -> Decimal:
        self.seen.append(balance)
        return one_percent(balance)

    def after(self, conn: Any, cursor: Any, statement: str, *rest: Any) -> None:
        if threading.current_thread().name != INTEREST_THREAD or self.seen:
            return
        self.reads.append(" ".join(statement.split())[:110])
        if len(self.reads) == self.slip_at:
            self.deposit = in_thread(raised, self.accounts.deposit, self.bank,
                                     self.account_id, SLIPPED)
            self.committed_in_window = self.deposit.join(3)

    def run(self, start: Decimal) -> Any:
        from sqlalchemy import event

        event.listen(self.bank, "after_cursor_execute", self.after)
        try:
            job = in_thread(self.accounts.apply_interest, self.bank, self.account_id, self.rule)
            finished = job.join(20)
        finally:
            event.remove(self.bank, "after_cursor_execute", self.after)
        if self.deposit is not None:
            error = self.deposit.result(15)
            if error is not None:
                raise CheckFailure(
                    f"Setting up: deposit({fmt(SLIPPED)}) raised after apply_interest's "
                    f"statement {self.slip_at}.", expected="it commits",
                    actual=first_line(error), lesson=READ["locking"])
        if not finished or job.error is not None:
            raise CheckFailure(
                f"apply_interest() on {fmt(start)} "
                + (f"with a deposit committed after its statement {self.slip_at} "
                   if self.slip_at else "")
                + ("did not return within 20 s." if not finished else "raised."),
                expected="it returns, recomputing if the account changed",
                actual=first_line(job.error) if job.error is not None else "still running",
                lesson=READ["locking"])
        return job.value


def test_interest_reads_balance_and_version_from_one_moment(accounts: ModuleType,
                                                           bank: Engine, funded: Any) -> None:
    """A deposit commits between two of the statements apply_interest sends before it calls
    its rule (after the first, then after the second, ...): the balance it computes from and
    the version it writes against must come from the same moment, or the deposit is lost."""
    start = Decimal("1234.56")
    dry = SlipAfterRead(accounts, bank, funded(str(start)), slip_at=None)
    dry.run(start)
    for slip_at in range(1, min(len(dry.reads), MAX_READS) + 1):
        account_id = funded(str(start))
        slip = SlipAfterRead(accounts, bank, account_id, slip_at)
        result = slip.run(start)
        final = balance_of(bank, account_id)
        after_deposit = start + SLIPPED
        if slip.committed_in_window:
            # the deposit committed before the rule was called: only one history is left
            good = [(after_deposit, after_deposit + one_percent(after_deposit))]
        else:  # it waited for apply_interest's write: it may come after it
            good = [(after_deposit, after_deposit + one_percent(after_deposit)),
                    (start, start + one_percent(start) + SLIPPED)]
        before = getattr(result, "balance_before", None)
        if (before, final) in good:
            continue
        # the deposit committed before the rule was called, yet the rule's result on the
        # balance before it was written: the version checked was read after the deposit
        stale = before == start and slip.committed_in_window and len(slip.reads) > 1
        reads = "\n".join(f"  {n}. {sql}" + (f"\n     -> deposit({fmt(SLIPPED)}) committed "
                                              f"here: balance {fmt(after_deposit)}"
                                              if n == slip_at else "")
                          for n, sql in enumerate(slip.reads, 1))
        raise CheckFailure(
            f"A deposit of {fmt(SLIPPED)} committed after apply_interest's statement {slip_at} "
            "of its first attempt, before it called the rule, and the interest "
            + ("lost it: a lost update." if final < after_deposit + one_percent(start)
               or stale else "does not match one history."),
            expected=f"the rule given {fmt(after_deposit)} (the balance with the deposit), on "
                     f"the first attempt or on a recompute: balance {fmt(after_deposit)} + "
                     f"{fmt(one_percent(after_deposit))} = "
                     f"{fmt(after_deposit + one_percent(after_deposit))}",
            actual=f"balance {fmt(final)}; the rule was given: "
                   + ", ".join(fmt(b) for b in slip.seen) + f"; apply_interest returned {result}",
            evidence="the statements apply_interest sent before it called the rule:\n" + reads
                     + f"\nthe postings say {fmt(posted_sum(bank, account_id))}",
            fix="read balance and version in one statement (SELECT balance, version FROM "
                "account WHERE id = :id): read apart, a change committed between them pairs "
                "the old balance with the new version, and UPDATE ... WHERE version = :read "
                "lets the stale result through" if stale else None,
            lesson=(READ["locking"], READ["lost-update"]))
    assert_ledger_agrees(bank, "after deposits between apply_interest's reads")


def test_interest_and_deposits_form_one_history(accounts: ModuleType, bank: Engine,
                                                funded: Any) -> None:
    account_id = funded("1000.00")
    rule = StallingRule(compute=lambda b: (b * Decimal("0.001")).quantize(CENT),
                        stall_first=False, pause=0.01)
    interest_workers = 6
    amounts = [Decimal(f"{n}.{n:02d}") for n in range(1, 19)]  # distinct deposits

    def work(index: int) -> Any:
        if index < interest_workers:
            return accounts.apply_interest(bank, account_id, rule, max_attempts=200)
        return accounts.deposit(bank, account_id, amounts[index - interest_workers])

    outcomes = run_concurrently(work, interest_workers + len(amounts), timeout=40)
    broken = failures(outcomes)
    if broken:
        raise CheckFailure(
            "Interest and deposits on one account at once raised errors.",
            expected="every apply_interest retries until it wins; every deposit commits",
            actual=f"{len(broken)} raised", evidence=describe_errors(broken),
            lesson=READ["locking"])
    history = []
    for o in outcomes:
        if o.index < interest_workers:
            history.append((o.value.balance_before, o.value.balance_after,
                            f"interest {fmt(o.value.interest)} (worker {o.index})"))
        else:
            amount = amounts[o.index - interest_workers]
            history.append((o.value.balance - amount, o.value.balance,
                            f"deposit {fmt(amount)} (worker {o.index})"))
    history.sort(key=lambda h: (h[0], h[1]))
    final = balance_of(bank, account_id)
    problems = []
    starts: dict[Decimal, list[str]] = {}
    for before, _, label in history:
        starts.setdefault(before, []).append(label)
    for before, labels in starts.items():
        if len(labels) > 1:
            problems.append(f"{len(labels)} operations all started from {fmt(before)} ("
                            + ", ".join(labels[:3]) + "): only one of them can have, the "
                            "others overwrote it")
    expected_start = Decimal("1000.00")
    for before, after, label in history if not problems else ():
        if before != expected_start:
            problems.append(f"{label} started from {fmt(before)}, but the balance then was "
                            f"{fmt(expected_start)}")
        expected_start = after
    if expected_start != final:
        problems.append(f"the last operation ended at {fmt(expected_start)}, but the balance "
                        f"is {fmt(final)}")
    lines = [f"{fmt(b):>10} -> {fmt(a):<10} {label}" for b, a, label in history]
    if problems:
        raise CheckFailure(
            f"{len(history)} operations ({interest_workers} interest, {len(amounts)} deposits) "
            "do not form one history: some started from a balance another had already changed "
            "(a lost update).",
            expected="sorted by the balance they started from, each operation starts where the "
                     "previous one ended, from 1000.00 to the final balance",
            actual=first_of(problems),
            evidence=all_of(problems) + "\n\neach operation, as it reported itself (before "
                     "-> after):\n"
                     + "\n".join(lines[:24]),
            fix="every write that depends on a read must fail when the row changed in between: "
                "UPDATE ... WHERE version = :read_version (and version = version + 1 in every "
                "balance change), retrying on zero rows", lesson=READ["locking"])
    assert_ledger_agrees(bank, "after concurrent interest and deposits", [account_id])


def test_nothing_is_held_while_the_rule_computes(accounts: ModuleType, bank: Engine,
                                                 funded: Any) -> None:
    account_id = funded("1000.00")
    rule = StallingRule()
    interest = start_interest(accounts, bank, account_id, rule)
    try:
        time.sleep(0.1)  # the rule is stalled: whatever the code holds, it holds now
        held = held_during_call(bank, ("account", "posting", "ledger_entry"))
    finally:
        rule.go.set()
        interest.join(15)
    assert_nothing_held(held, "apply_interest's rule", "locking",
                        note="the rule may call a pricing service and take seconds; an open "
                             "transaction holds back VACUUM and a pooled connection for all that "
                             "time, even without a row lock")
    if interest.error is not None:
        raise CheckFailure("apply_interest() raised.", expected="an InterestResult",
                           actual=first_line(interest.error), lesson=READ["locking"])
    # the retry: the first call's write finds the account changed (the rule deposits while it
    # computes), and the second call, the recompute, must hold nothing either
    account_id = funded("1000.00")
    rule = RetryStallingRule(accounts, bank, account_id)
    interest = start_interest(accounts, bank, account_id, rule)
    try:
        time.sleep(0.1)
        held = held_during_call(bank, ("account", "posting", "ledger_entry"))
    finally:
        rule.go.set()
        interest.join(15)
    assert_nothing_held(held, "apply_interest's rule, called again after its first write found "
                              "the account changed (a deposit of 12.34),", "locking",
                        note="the recompute is an attempt like the first: read, close the "
                             "connection, call the rule, then write in a new transaction; a "
                             "retry inside the write transaction holds it through the rule")
    if interest.error is not None:
        raise CheckFailure("apply_interest() raised after a deposit made its first write miss.",
                           expected="it reads again, recomputes and writes",
                           actual=first_line(interest.error), lesson=READ["locking"])


class RetryStallingRule(StallingRule):
    """Deposits 12.34 into the account on its first call (so that attempt's write misses), and
    stalls on its second call, the recompute, until the check releases it."""

    def __init__(self, accounts: ModuleType, bank: Engine, account_id: int) -> None:
        super().__init__(stall_first=False)
        self.accounts, self.bank, self.account_id = accounts, bank, account_id

    def __call__(self, balance: Decimal) -> Decimal:
        with self._lock:
            self.seen.append(balance)
            calls = len(self.seen)
        if calls == 1:
            self.accounts.deposit(self.bank, self.account_id, Decimal("12.34"))
        elif calls == 2:
            self.entered.set()
            self.go.wait(10)
        return self.compute(balance)


def test_zero_interest_changes_nothing(accounts: ModuleType, bank: Engine,
                                       funded: Any) -> None:
    # 1 % of 0.37 is 0.0037: 0.00 to the cent; an empty account earns a bare 0
    for label, amount, rule in (("one_percent (0.00 on 0.37)", "0.37", one_percent),
                                ("a rule that returns Decimal('0')", "0",
                                 lambda balance: Decimal("0"))):
        account_id = funded(amount)
        try:
            result: Any = call(accounts.apply_interest, bank, account_id, rule)
        except CheckFailure:
            raise  # a stub: not written yet
        except Exception as exc:
            result = exc
        final = balance_of(bank, account_id)
        if isinstance(result, BaseException) or final != Decimal(amount):
            raise CheckFailure(
                f"apply_interest with {label} on an account holding {fmt(Decimal(amount))}: "
                "zero interest is an answer, not an error.",
                expected=f"it returns and the balance stays {fmt(Decimal(amount))} (the "
                         "README's rules return a Decimal >= 0)",
                actual=(f"it raised {first_line(result)}" if isinstance(result, BaseException)
                        else f"it returned {result}") + f"; balance {fmt(final)}",
                fix="accept 0 from the rule: no interest, so nothing to write; refuse only a "
                    "negative result (the amount check of deposit and withdraw refuses 0, so it "
                    "does not fit here)"
                if isinstance(result, ValueError) else None,
                lesson=READ["locking"])
    assert_ledger_agrees(bank, "after zero interest")


class MovingRule:
    """An interest rule that deposits into the account every time it is called, while the
    rule 'computes': each attempt's write then finds the account changed."""

    def __init__(self, accounts: ModuleType, bank: Engine, account_id: int) -> None:
        self.accounts, self.bank, self.account_id = accounts, bank, account_id
        self.seen: list[Decimal] = []

    def __call__(self, balance: Decimal) -> Decimal:
        self.seen.append(balance)
        self.accounts.deposit(self.bank, self.account_id, Decimal("1.00"))
        return one_percent(balance)


def test_interest_gives_up_after_max_attempts(accounts: ModuleType, bank: Engine,
                                              funded: Any) -> None:
    account_id = funded("1000.00")
    rule = MovingRule(accounts, bank, account_id)
    job = in_thread(accounts.apply_interest, bank, account_id, rule, max_attempts=3)
    job.join(15)
    if isinstance(job.error, CheckFailure):
        raise job.error  # a stub: not written yet
    calls = len(rule.seen)
    if not (isinstance(job.error, accounts.ConcurrentModification) and calls == 3):
        raise CheckFailure(
            "apply_interest(max_attempts=3) on an account that changes during every attempt.",
            expected="the rule called 3 times (3 attempts, each finding the account changed), "
                     "then accounts.ConcurrentModification; no interest posted",
            actual=f"the rule was called {calls} time(s); apply_interest "
                   + (f"raised {first_line(job.error)}" if job.error is not None
                      else f"returned {job.value}" if not job.alive else "is still running"),
            evidence="the balances the rule was given: "
                     + ", ".join(fmt(b) for b in rule.seen[:8])
                     + f"; the balance now {fmt(balance_of(bank, account_id))}",
            fix="max_attempts counts attempts, the first one included: for attempt in "
                "range(max_attempts), not range(1 + max_attempts)"
            if calls == 4 and isinstance(job.error, accounts.ConcurrentModification) else None,
            lesson=READ["locking"])
    assert_ledger_agrees(bank, "after interest gave up", [account_id])


def test_interest_sees_exchanges_settled_while_it_computed(kit: Any, funded: Any) -> None:
    accounts, bank = kit.accounts, kit.engine
    fx = kit.client(timeout=0.4)
    cases = []
    # the target is credited by the online exchange while interest computes on it
    source, target = funded("500.00"), funded("200.00", currency="EUR")
    quote = kit.quote(fx)
    rule = StallingRule()
    interest = start_interest(accounts, bank, target, rule)
    # ... and its source debited, while another interest computes on the source
    debit_rule = StallingRule()
    debit_interest = start_interest(accounts, bank, source, debit_rule)
    result = kit.start(fx, quote, source, target, "137.29", "credit")
    rule.go.set()
    debit_rule.go.set()
    interest.join(15)
    debit_interest.join(15)
    credited = kit.provider.orders[str(result.exchange_id)].bought_amount \
        if str(result.exchange_id) in kit.provider.orders else Decimal(0)
    cases.append(("an exchange's debit of the source", source, Decimal("362.71"),
                  debit_interest, debit_rule))
    cases.append(("an exchange's credit of the target", target, Decimal("200.00") + credited,
                  interest, rule))
    # the source is refunded by reconcile while interest computes on it
    refunded = funded("300.00")
    kit.provider.script(place="drop")
    pending = kit.start(fx, kit.quote(fx), refunded, target, "50.00", "refund")
    kit.provider.script(place="fill")
    rule = StallingRule()
    interest = start_interest(accounts, bank, refunded, rule)
    kit.clock.advance(60)
    call(kit.exchange.reconcile, bank, fx, kit.clock, older_than_seconds=30)
    rule.go.set()
    interest.join(15)
    cases.append((f"reconcile's refund of exchange {pending.exchange_id}", refunded,
                  Decimal("300.00"), interest, rule))
    for label, account_id, start, job, stalled in cases:
        if job.error is not None:
            raise CheckFailure(f"apply_interest() raised after {label} slipped in.",
                               expected="it detects the change and retries by itself",
                               actual=first_line(job.error), lesson=READ["locking"])
        expected = start + one_percent(start)
        final = balance_of(bank, account_id)
        if final != expected or job.value.balance_before != start:
            raise CheckFailure(
                f"{label[0].upper()}{label[1:]} committed while apply_interest was computing, "
                "and apply_interest did not notice: its optimistic check only sees changes "
                "that bump version.",
                expected=f"the rule called again with {fmt(start)} and the balance "
                         f"{fmt(start)} + {fmt(one_percent(start))} = {fmt(expected)}",
                actual=f"balance {fmt(final)}; the rule was given: "
                       + ", ".join(fmt(b) for b in stalled.seen)
                       + f"; apply_interest returned {job.value}",
                evidence=f"the postings of account {account_id} sum to "
                         f"{fmt(posted_sum(bank, account_id))}"
                         + ("" if final == posted_sum(bank, account_id) else " (a lost update)"),
                fix=("the exchange's debit of the source" if "debit" in label else
                     "the exchange's settlement (the credit of the target and the refund of the "
                     "source)") + " must SET version = version + 1 like every other balance "
                    "change",
                lesson=(READ["locking"], READ["lost-update"]))
    assert_ledger_agrees(bank, "after interest racing exchange settlements")
