"""Stage idempotency: a retried request with the same key moves money once and gets the same
answer, also when the retries race each other; a key reused for another request is refused."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from decimal import Decimal
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from _support import (
    READ,
    assert_ledger_agrees,
    balance_of,
    describe_errors,
    failing_commits,
    failures,
    injected,
    ledger_table,
)
from sqlalchemy import Engine, text

from dojo.checks import CheckFailure, call, first_line, fmt, in_thread, raised, rows
from dojo.checks.faults import run_concurrently, run_in_subprocess, slow_sql
from dojo.checks.observers import record_sql

pytestmark = pytest.mark.stage("idempotency")

RACERS = 32
ROUNDS = 2
SLOW_READ = 0.08  # every plain SELECT answers late: "does the key exist?" is asked by all at once
PLAIN_SELECT = r"(?s)^\s*select(?!.*\bfor\s+(no\s+key\s+)?update)"


def _key_rows(engine: Engine, key: str) -> list[dict[str, Any]]:
    return rows(engine, "SELECT key, request_hash, response::text AS response "
                        "FROM idempotency_key WHERE key = :k", k=key)


def _inexact(first: Any, retry: Any) -> list[str]:
    """The amounts a replayed receipt gives back as what a float made of them: Decimal(10.1)
    for Decimal('10.10')."""
    if not (hasattr(first, "__dict__") and hasattr(retry, "__dict__")):
        return []
    found = []
    for name, value in vars(first).items():
        again = vars(retry).get(name)
        if (isinstance(value, Decimal) and isinstance(again, Decimal | float) and again != value
                and float(again) == float(value)):
            found.append(f"{name}: {value!r} first, {again!r} on the retry")
    return found


def test_same_key_returns_the_stored_response(accounts: ModuleType, bank: Engine,
                                              funded: Any) -> None:
    account_id = funded("100.00")
    # amounts no binary fraction holds (10.10, 110.10): a receipt that went through a float on
    # its way into the stored response does not come back equal
    first = call(accounts.deposit, bank, account_id, Decimal("10.10"), idempotency_key="dep-1")
    call(accounts.deposit, bank, account_id, Decimal("5.00"))  # another request, no key
    retry = call(accounts.deposit, bank, account_id, Decimal("10.10"), idempotency_key="dep-1")
    balance = balance_of(bank, account_id)
    if balance != Decimal("115.10"):
        raise CheckFailure(
            "A retried deposit (same idempotency key) moved the money again.",
            expected="100.00 + 10.10 (key dep-1, once) + 5.00 = 115.10",
            actual=f"balance {fmt(balance)}", evidence=ledger_table(bank, account_id),
            fix="INSERT INTO idempotency_key ... ON CONFLICT DO NOTHING in the same transaction "
                "as the money; zero rows inserted means 'seen before': return the stored response",
            lesson=READ["idempotency"])
    _assert_exact_replay(bank, first, retry, "dep-1")
    if retry != first:
        raise CheckFailure(
            "The retry must get the first answer back, not a new one.",
            expected=f"the stored receipt {first}",
            actual=f"{retry}",
            evidence="the balance has moved since (a 5.00 deposit), so a recomputed answer "
                     "differs: the client that retried would see another balance and another "
                     "entry id for the same operation. Stored response: "
                     + str(_key_rows(bank, "dep-1")),
            fix="store the receipt in idempotency_key.response in the same transaction, and "
                "return it on a retry", lesson=READ["idempotency"])
    out = call(accounts.withdraw, bank, account_id, Decimal("1.01"), idempotency_key="wd-1")
    again = call(accounts.withdraw, bank, account_id, Decimal("1.01"), idempotency_key="wd-1")
    if not (again == out and balance_of(bank, account_id) == Decimal("114.09")):
        raise CheckFailure(
            "A retried withdrawal moved the money again or answered differently.",
            expected=f"balance 114.09 and the same receipt {out}",
            actual=f"balance {fmt(balance_of(bank, account_id))}, receipt {again}",
            lesson=READ["idempotency"])
    # 16 significant digits (14 before the point, as the README's columns hold): a float
    # keeps about 15, so a receipt that went through one and back through str() comes back a
    # cent off, although 10.10 survived it
    rich, heir = funded("0"), funded("0")
    for key, attempt in (
            ("dep-big", lambda: accounts.deposit(bank, rich, Decimal(BIG_DEPOSIT),
                                                 idempotency_key="dep-big")),
            ("tr-big", lambda: accounts.transfer(bank, rich, heir, Decimal(BIG_TRANSFER),
                                                 idempotency_key="tr-big"))):
        first = call(attempt)
        retry = call(attempt)
        _assert_exact_replay(bank, first, retry, key)
        if retry != first:
            raise CheckFailure(
                f"The retry with key {key} must get the first answer back, not a new one.",
                expected=f"the stored receipt {first}", actual=f"{retry}",
                evidence="stored response: " + str(_key_rows(bank, key)),
                lesson=READ["idempotency"])
    assert_ledger_agrees(bank, "after retried deposits and withdrawals",
                         [account_id, rich, heir])


# Amounts of 16 significant digits whose nearest float prints as another cent
# (87654321098765.44, 76543210987654.38): within the 14 digits before the point the README's
# columns hold (98765432109876.53)
BIG_DEPOSIT = "87654321098765.43"
BIG_TRANSFER = "76543210987654.37"


def _assert_exact_replay(bank: Engine, first: Any, retry: Any, key: str) -> None:
    """The replayed receipt has every amount of the first as the same Decimal."""
    inexact = _inexact(first, retry)
    if inexact:
        raise CheckFailure(
            "The retry got the first receipt back with its amounts changed.",
            expected=f"the stored receipt {first}, every amount the same Decimal",
            actual="; ".join(inexact),
            evidence="stored response: " + str(_key_rows(bank, key)),
            fix="store the amounts as decimal strings in the jsonb (str(amount)) and read them "
                "back with Decimal(text): a JSON number comes back as a float, and a float "
                "holds about 15 significant digits (str() of it does not give them back)",
            lesson=(READ["idempotency"], READ["numbers"]))


def test_a_retry_from_another_process_replays(accounts: ModuleType, bank: Engine,
                                              funded: Any, learner: Any) -> None:
    """The key exists for the retry after a crash: it comes from another process (a restart,
    another worker), whose str hashes differ (PYTHONHASHSEED)."""
    account_id, other_id = funded("100.00"), funded("100.00")
    url = bank.url.render_as_string(hide_password=False)
    seed = "2" if os.environ.get("PYTHONHASHSEED") == "1" else "1"
    child = run_in_subprocess(f"{Path(__file__).with_name('_support.py')}:keyed_requests",
                              url, account_id, other_id, timeout=30, path=[str(learner.dir)],
                              env={"PYTHONHASHSEED": seed})
    if child.value is None:
        raise CheckFailure(
            "A keyed deposit and transfer in another process did not complete.",
            expected="deposit(account, 12.37, key 'proc-dep') and transfer(account, other, "
                     "3.21, key 'proc-tr') return",
            actual=(child.error.strip().splitlines() or [""])[-1] if child.error
            else f"exit {child.exit_code}",
            evidence=(child.error or child.stderr or "")[-800:], lesson=READ["idempotency"])
    retries = [("deposit(account, 12.37, key 'proc-dep')",
                lambda: accounts.deposit(bank, account_id, Decimal("12.37"),
                                         idempotency_key="proc-dep")),
               ("transfer(account, other, 3.21, key 'proc-tr')",
                lambda: accounts.transfer(bank, account_id, other_id, Decimal("3.21"),
                                          idempotency_key="proc-tr"))]
    for (label, retry), entry_id in zip(retries, child.value, strict=True):
        error, answer = None, None
        try:
            answer = retry()
        except Exception as exc:
            error = exc
        balances = (balance_of(bank, account_id), balance_of(bank, other_id))
        if (error is None and str(getattr(answer, "entry_id", "")) == entry_id
                and balances == (Decimal("109.16"), Decimal("103.21"))):
            continue
        raise CheckFailure(
            f"{label} first ran in another process; its retry here, with the same key and "
            "the same request, did not replay it.",
            expected=f"the stored receipt (entry {entry_id}), nothing moved again: balances "
                     "109.16 and 103.21",
            actual=(first_line(error) if error is not None else f"{answer}")
                   + f"; balances {fmt(balances[0])} and {fmt(balances[1])}",
            evidence="stored: " + str(_key_rows(bank, "proc-dep") + _key_rows(bank, "proc-tr")),
            fix="the request hash must be the same in every process: hashlib.sha256 of a "
                "canonical text of the request (json.dumps(..., sort_keys=True)), never "
                "hash(), whose str hashes change with each process (PYTHONHASHSEED)"
            if isinstance(error, accounts.IdempotencyConflict) else None,
            lesson=READ["idempotency"])


def test_the_same_amount_spelled_another_way_is_the_same_request(
        accounts: ModuleType, bank: Engine, funded: Any) -> None:
    """Amounts are compared as numbers: a retry that spells the amount another way (10.10
    after 10.1, or as read back from a numeric(20,4) column) is the same request."""
    account_id, other_id = funded("100.00"), funded("0")
    requests = [
        ("deposit", "sp-dep", "10.1", ("10.10", "10.100"),
         lambda m: accounts.deposit(bank, account_id, Decimal(m), idempotency_key="sp-dep")),
        ("withdraw", "sp-wd", "2.30", ("2.3", "2.3000"),
         lambda m: accounts.withdraw(bank, account_id, Decimal(m), idempotency_key="sp-wd")),
        ("transfer", "sp-tr", "3.2", ("3.200",),
         lambda m: accounts.transfer(bank, account_id, other_id, Decimal(m),
                                     idempotency_key="sp-tr")),
    ]
    for op, key, amount, spellings, attempt in requests:
        first = call(attempt, amount)
        for spelled in spellings:
            error, again = None, None
            try:
                again = attempt(spelled)
            except Exception as exc:
                error = exc
            if error is None and again == first:
                continue
            raise CheckFailure(
                f"{op}(Decimal('{amount}')) with key {key}, then its retry as "
                f"{op}(Decimal('{spelled}')) with the same key: the same amount, another "
                "spelling, and the retry was not answered with the first receipt.",
                expected=f"the first receipt again ({first}), nothing moved: amounts are "
                         f"compared as numbers, {amount} and {spelled} are one amount",
                actual=first_line(error) if error is not None else f"it answered {again}",
                evidence="stored under the key: " + str(_key_rows(bank, key))
                         + f"\nbalances now: {fmt(balance_of(bank, account_id))} and "
                         f"{fmt(balance_of(bank, other_id))}",
                fix="hash the amount after normalising it (to cents: format(amount.quantize("
                    "Decimal('0.01')), 'f')), not str() of the Decimal the caller passed"
                if isinstance(error, accounts.IdempotencyConflict) else None,
                lesson=READ["idempotency"])
    balances = (balance_of(bank, account_id), balance_of(bank, other_id))
    if balances != (Decimal("104.60"), Decimal("3.20")):
        raise CheckFailure(
            "Retries with the amount spelled another way moved money again.",
            expected="100.00 + 10.10 - 2.30 - 3.20 = 104.60 and 3.20, each request once",
            actual=f"{fmt(balances[0])} and {fmt(balances[1])}",
            evidence=ledger_table(bank, account_id), lesson=READ["idempotency"])


def test_refused_request_stores_nothing_under_its_key(accounts: ModuleType, bank: Engine,
                                                     funded: Any) -> None:
    other = funded("0")
    refusals = [
        ("withdraw(account, 50.00)", "wd-big",
         lambda a: accounts.withdraw(bank, a, Decimal("50.00"), idempotency_key="wd-big")),
        ("transfer(account, other, 50.00)", "tr-big",
         lambda a: accounts.transfer(bank, a, other, Decimal("50.00"),
                                     idempotency_key="tr-big")),
    ]
    for label, key, attempt in refusals:
        account_id = funded("20.00")
        first = raised(attempt, account_id)
        if not isinstance(first, accounts.InsufficientFunds):
            raise CheckFailure(
                f"Setting up: {label} with 20.00 in the account must be refused.",
                expected="accounts.InsufficientFunds", actual=first_line(first),
                lesson=READ["race"])
        stored_after_refusal = _key_rows(bank, key)
        call(accounts.deposit, bank, account_id, Decimal("100.00"))
        retry = raised(attempt, account_id)
        balance = balance_of(bank, account_id)
        if not (retry is None and balance == Decimal("70.00")):
            raise CheckFailure(
                f"{label} was refused for insufficient funds, then retried with the same key "
                "after a deposit, and the retry was not treated as a new attempt.",
                expected="the retry goes through: balance 20.00 + 100.00 - 50.00 = 70.00",
                actual=f"the retry {'raised ' + first_line(retry) if retry else 'returned'}; "
                       f"balance {fmt(balance)}",
                evidence=f"idempotency_key rows for {key} right after the refusal:\n"
                         + (str(stored_after_refusal) if stored_after_refusal else "(none)")
                         + "\nthe refusal moved no money, so there is nothing to protect from "
                        "a second execution; storing it turns a temporary 'not now' into a "
                        "permanent 'no' for that key",
                fix="claim the key in the money transaction and let the refusal roll it back "
                    "with everything else (raise InsufficientFunds inside engine.begin()): a "
                    "refused request stores nothing, its retry is a new attempt"
                    if stored_after_refusal else None,
                lesson=READ["idempotency"])
    assert_ledger_agrees(bank, "after refused and retried requests")


def test_same_key_for_another_request_is_a_conflict(accounts: ModuleType, bank: Engine,
                                                    funded: Any) -> None:
    account_id, other_id = funded("100.00"), funded("100.00")
    call(accounts.deposit, bank, account_id, Decimal("10.00"), idempotency_key="k-1")
    call(accounts.transfer, bank, account_id, other_id, Decimal("7.50"), idempotency_key="t-1")
    reuses = [
        ("k-1", "a deposit of 10.00", "deposit 20.00 to the same account",
         lambda: accounts.deposit(bank, account_id, Decimal("20.00"), idempotency_key="k-1")),
        ("k-1", "a deposit of 10.00", "deposit 10.00 to another account",
         lambda: accounts.deposit(bank, other_id, Decimal("10.00"), idempotency_key="k-1")),
        ("k-1", "a deposit of 10.00", "withdraw 10.00 from the same account",
         lambda: accounts.withdraw(bank, account_id, Decimal("10.00"), idempotency_key="k-1")),
        ("k-1", "a deposit of 10.00", "transfer 10.00 from that account to another",
         lambda: accounts.transfer(bank, account_id, other_id, Decimal("10.00"),
                                   idempotency_key="k-1")),
        ("t-1", "a transfer of 7.50", "transfer 7.51 between the same accounts",
         lambda: accounts.transfer(bank, account_id, other_id, Decimal("7.51"),
                                   idempotency_key="t-1")),
        ("t-1", "a transfer of 7.50", "transfer 7.50 the other way",
         lambda: accounts.transfer(bank, other_id, account_id, Decimal("7.50"),
                                   idempotency_key="t-1")),
        ("t-1", "a transfer of 7.50", "withdraw 7.50 from the source account",
         lambda: accounts.withdraw(bank, account_id, Decimal("7.50"), idempotency_key="t-1")),
    ]
    for key, first_use, label, reuse in reuses:
        error = raised(reuse)
        if not isinstance(error, accounts.IdempotencyConflict):
            raise CheckFailure(
                f"Key {key} ({first_use}) was reused to {label}.",
                expected="accounts.IdempotencyConflict: a client bug, refused loudly",
                actual=first_line(error) if error else "it returned (the old receipt, or moved "
                                                       "money)",
                evidence="answering the old receipt would tell the client its new request "
                         "succeeded when nothing happened; moving money would defeat the key",
                fix="store a hash of the whole request (operation, accounts, amount) with the "
                    "key and compare it when the key is found" if error is None else None,
                lesson=READ["idempotency"])
    balances = (balance_of(bank, account_id), balance_of(bank, other_id))
    if balances != (Decimal("102.50"), Decimal("107.50")):
        raise CheckFailure(
            "A refused key reuse still moved money.",
            expected="balances 102.50 and 107.50 (100.00 each, a deposit of 10.00 and a "
                     "transfer of 7.50)",
            actual=f"{fmt(balances[0])} and {fmt(balances[1])}", lesson=READ["idempotency"])


def test_racing_retries_move_money_once(accounts: ModuleType, bank: Engine,
                                        funded: Any) -> None:
    for round_no in range(1, ROUNDS + 1):
        account_id = funded("100.00")
        key = f"race-{round_no}"

        def retry(_: int, account_id: int = account_id, key: str = key) -> Any:
            return accounts.deposit(bank, account_id, Decimal("10.00"), idempotency_key=key)

        with record_sql(bank) as log, slow_sql(bank, SLOW_READ, match=PLAIN_SELECT):
            outcomes = run_concurrently(retry, RACERS, timeout=40)
        ok = [o for o in outcomes if o.ok]
        broken = failures(outcomes)
        balance = balance_of(bank, account_id)
        entries = {o.value.entry_id for o in ok}
        if not broken and balance == Decimal("110.00") and len(entries) == 1:
            continue
        movers = [f"worker {o.index}" for o in ok[:2]]
        twice = balance > Decimal("110.00")
        anomaly = ("the deposit was applied more than once" if twice
                   else "some retries failed instead of getting the stored answer" if broken
                   else "retries got different answers")
        raise CheckFailure(
            f"{RACERS} retries of one deposit (key {key}) arrived at the same moment: "
            f"{anomaly} (round {round_no}).",
            expected="balance 110.00 (the deposit once), one ledger entry, and every retry "
                     "returns the same receipt",
            actual=f"balance {fmt(balance)}; {len(entries)} different entry ids returned; "
                   f"{len(broken)} retries raised",
            evidence=(describe_errors(broken) + "\n" if broken else "")
                     + "two retries, statement by statement (every SELECT answered "
                    f"{SLOW_READ * 1000:.0f} ms late):\n"
                     + log.timeline(movers or [f"worker {o.index}" for o in broken[:2]],
                                 match=r"idempotency_key|balance"),
            fix=("several retries each found the key free and moved the money: looking the "
                 "key up and then inserting it is a check-then-act race (exists-then-insert). "
                 "Claim the key first with INSERT ... ON CONFLICT DO NOTHING on its unique "
                 "index, in the transaction that moves the money: a racing duplicate waits for "
                 "the first to commit, then reads the stored response") if twice else
                ("a retry that lost the race for the key must not fail: once the first "
                 "commits, read its stored response and return it") if broken else None,
            lesson=(READ["idempotency"], READ["check-then-act"]))
    assert_ledger_agrees(bank, "after racing retries")


RETRY_WAIT = 4.0  # seconds a retry may take once the failed attempt has rolled back


def test_a_retry_after_a_failed_commit_goes_through(accounts: ModuleType, bank: Engine,
                                                    funded: Any) -> None:
    account_id, other_id = funded("100.00"), funded("100.00")
    attempts = [
        ("deposit(account, 12.34)", "fail-dep", Decimal("112.34"),
         lambda: accounts.deposit(bank, account_id, Decimal("12.34"),
                                  idempotency_key="fail-dep")),
        ("withdraw(account, 2.34)", "fail-wd", Decimal("110.00"),
         lambda: accounts.withdraw(bank, account_id, Decimal("2.34"),
                                   idempotency_key="fail-wd")),
        ("transfer(other, account, 5.55)", "fail-tr", Decimal("115.55"),
         lambda: accounts.transfer(bank, other_id, account_id, Decimal("5.55"),
                                   idempotency_key="fail-tr")),
    ]
    for label, key, after, attempt in attempts:
        with failing_commits(bank, account_id):
            error = raised(attempt)
        left = _key_rows(bank, key)
        if error is None:
            raise CheckFailure(
                f"{label} with key {key} failed at COMMIT (the check made the database refuse "
                "its transaction), and the call returned as if it had succeeded.",
                expected="the call raises (any error): nothing was stored, so its caller must "
                         "not be told it was",
                actual=f"it returned; balance {fmt(balance_of(bank, account_id))}",
                evidence=f"idempotency_key rows for {key} after the failed attempt:\n"
                         + (str(left) if left else "(none)"),
                fix="let the COMMIT's error reach the caller: a receipt is the promise that the "
                    "money moved, and a caller that gets one will not retry",
                lesson=READ["idempotency"])
        retry = in_thread(attempt)
        finished = retry.join(RETRY_WAIT)
        balance = balance_of(bank, account_id)
        if finished and retry.error is None and balance == after:
            continue
        outcome = (f"still waiting after {RETRY_WAIT:.0f} s" if not finished
                   else f"raised {first_line(retry.error)}" if retry.error is not None
                   else "returned")
        raise CheckFailure(
            f"{label} with key {key} failed at COMMIT (the check made the database refuse "
            "its transaction); its retry with the same key did not go through.",
            expected=f"the failed attempt leaves nothing behind, so the retry is a new attempt "
                     f"and moves the money once: balance {fmt(after)}",
            actual=f"the retry {outcome}; balance {fmt(balance)}; the first attempt "
                   + (f"raised {first_line(error)}" if error is not None else "returned")
                   + ("" if error is None or injected(error) else " (not the injected error)"),
            evidence=f"idempotency_key rows for {key} after the failed attempt:\n"
                     + (str(left) if left else "(none)"),
            fix="the key was claimed in a transaction of its own, which committed although the "
                "money's transaction failed: every later retry finds it taken, with no "
                "response. Claim it in the money's transaction, so a failure rolls it back too"
                if left else None,
            lesson=READ["idempotency"])
    assert_ledger_agrees(bank, "after failed commits and their retries")


CRASHED = "dojo-crashed-deposit"  # application_name of the killed process's sessions


def _sessions_named(bank: Engine, name: str) -> list[dict[str, Any]]:
    return rows(bank, "SELECT pid, state, wait_event_type, wait_event, "
                      "pg_blocking_pids(pid) AS blocked_by, left(query, 120) AS query "
                      "FROM pg_stat_activity WHERE application_name = :n ORDER BY pid", n=name)


def test_a_retry_after_a_crash_goes_through(accounts: ModuleType, bank: Engine, funded: Any,
                                            learner: Any) -> None:
    """A keyed deposit in a process of its own waits for the account's row (the check holds
    it) and is killed there (SIGKILL: no except, no finally of its own runs); the database
    ends its sessions. The retry with the same key is a new attempt and goes through."""
    account_id = funded("100.00")
    url = bank.url.update_query_dict({"application_name": CRASHED}).render_as_string(
        hide_password=False)
    holder = bank.connect()
    child: subprocess.Popen[str] | None = None
    try:
        holder.begin()
        holder.execute(text("SELECT 1 FROM account WHERE id = :a FOR UPDATE"), {"a": account_id})
        with tempfile.TemporaryDirectory(prefix="dojo-crash-") as tmp:
            spec = Path(tmp, "spec.json")
            spec.write_text(json.dumps({
                "target": f"{Path(__file__).with_name('_support.py')}:keyed_deposit",
                "args": [url, account_id, "23.47", "crash-dep"], "path": [str(learner.dir)],
                "result": str(Path(tmp, "result.json"))}))
            child = subprocess.Popen([sys.executable, "-m", "dojo.checks.faults", str(spec)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     stdin=subprocess.DEVNULL, start_new_session=True,
                                     text=True)
            holder_pid = holder.exec_driver_sql("SELECT pg_backend_pid()").scalar()
            deadline = time.monotonic() + 15
            waiting: list[dict[str, Any]] = []
            while time.monotonic() < deadline and child.poll() is None and not waiting:
                waiting = [s for s in _sessions_named(bank, CRASHED)
                           if holder_pid in (s["blocked_by"] or [])]
                time.sleep(0.02)
            if not waiting:
                if child.poll() is None:
                    os.killpg(child.pid, signal.SIGKILL)  # our own child's session
                child.wait(10)
                result = Path(tmp, "result.json")
                said = json.loads(result.read_text()) if result.exists() else {}
                raise CheckFailure(
                    f"Setting up: a keyed deposit on account {account_id}, in a process of its "
                    "own, never waited for the account's row, which the check held FOR UPDATE.",
                    expected="the deposit waits for the row lock (every deposit writes the "
                             "account's balance)",
                    actual=f"the child {'returned' if 'value' in said else 'ended'} "
                           f"(exit {child.returncode})",
                    evidence=(said.get("error") or child.stderr.read() if child.stderr
                              else "")[-800:],
                    lesson=READ["idempotency"])
            os.killpg(child.pid, signal.SIGKILL)  # our own child's session, mid-deposit
            child.wait(10)
    finally:
        holder.rollback()
        holder.close()
        if child is not None and child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait(10)
    # the killed process's sessions end once the database sees their connections closed
    deadline = time.monotonic() + 10
    while _sessions_named(bank, CRASHED) and time.monotonic() < deadline:
        time.sleep(0.02)
    left = _key_rows(bank, "crash-dep")
    retry = in_thread(accounts.deposit, bank, account_id, Decimal("23.47"),
                      idempotency_key="crash-dep")
    finished = retry.join(RETRY_WAIT)
    balance = balance_of(bank, account_id)
    if finished and retry.error is None and balance == Decimal("123.47"):
        assert_ledger_agrees(bank, "after a crashed deposit and its retry", [account_id])
        return
    outcome = (f"still waiting after {RETRY_WAIT:.0f} s" if not finished
               else f"raised {first_line(retry.error)}" if retry.error is not None
               else "returned")
    claimed = [r for r in left if r["response"] is None]
    raise CheckFailure(
        "A keyed deposit (key crash-dep) was killed with SIGKILL in its own process while it "
        "waited for the account's row; the retry with the same key did not go through.",
        expected="the killed attempt left nothing behind (the database rolled back what it "
                 "had not committed), so the retry is a new attempt and moves the money "
                 "once: balance 123.47",
        actual=f"the retry {outcome}; balance {fmt(balance)}",
        evidence="idempotency_key rows for crash-dep once the killed process's sessions had "
                 "ended:\n" + (str(left) if left else "(none)")
                 + "\nthe interleaving the check forced:\n"
                 "  1. the check held the account's row FOR UPDATE\n"
                 "  2. the child's deposit waited for it\n"
                 "  3. the check killed the child (SIGKILL) and released the row\n"
                 "  4. the retry, here, with the same key and the same request",
        fix="the key was committed in a transaction of its own before the money moved, and a "
            "killed process runs no cleanup: the key stays claimed with no response, and every "
            "retry waits for an attempt that is gone. Claim it in the money's transaction, so "
            "the database rolls both back when the connection dies" if claimed else None,
        lesson=READ["idempotency"])
