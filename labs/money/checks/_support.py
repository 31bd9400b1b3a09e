"""What only the money checks need: their lesson sections, the tables the README fixes, the
ledger read from the outside, the exchange stages' kit, and the provider's record compared
with the exchanges. Failures, tables, statement records and lock views come from the kit,
`dojo.checks`.

Nothing here reads the learner's internals: only the tables and functions the README fixes.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from types import ModuleType
from typing import Any

from sqlalchemy import Engine

from dojo.checks import CheckFailure, InstantClock, call, first_line, fmt, rows, scalar, table

# Lesson sections the messages send the learner to.
READ = {
    "numbers": "money-service#money-as-numbers-numeric-and-bigdecimal",
    "schema": "money-service#the-schema-accounts-an-append-only-ledger-postings-that-sum-to-zero",
    "race": "money-service#the-race-read-then-write-versus-one-conditional-update",
    "check": "money-service#check-balance--0-the-last-line-of-defence",
    "idempotency": "money-service#idempotency-keys-a-unique-constraint-and-a-stored-response",
    "transfer": "money-service#two-accounts-select--for-update-in-a-fixed-order",
    "exchange": "money-service#exchange-a-quote-a-pending-record-the-provider-call-outside-the-"
                "transaction",
    "reconcile": "money-service#a-timeout-means-i-dont-know-the-reconciliation-job",
    "breaker": "circuit-breaker#the-state-machine",
    "slow": "circuit-breaker#what-counts-as-a-failure-and-what-counts-as-slow",
    "half-open": "circuit-breaker#half-open-probing-safely",
    "locking": "locking#optimistic-locking-detect-the-conflict-at-write-time",
    "lost-update": "locking#the-problem-both-solve-the-lost-update",
    "deadlock": "locking#lock-order-and-how-deadlocks-happen",
    "check-then-act": "idempotent-consumer#why-check-then-act-is-a-race",
    "n-plus-one": "n-plus-one#the-same-problem-without-an-orm",
    "count-queries": "n-plus-one#detecting-it-count-the-statements",
}

# The tables and columns the README fixes (the checks read and write only these).
TABLES = {
    "account": ("id", "kind", "currency", "balance"),
    "ledger_entry": ("id", "kind"),
    "posting": ("id", "entry_id", "account_id", "amount", "currency"),
    "idempotency_key": ("key", "request_hash", "response"),
}
LATER_TABLES = {"exchange": ("id", "status"), "quote": ("id",)}


def see(keys: str) -> tuple[str, ...]:
    """The lesson sections for space-separated READ keys ("race lost-update")."""
    return tuple(READ.get(key, key) for key in keys.split())


# -- the ledger, read from the outside --------------------------------------------------------

def balance_of(engine: Engine, account_id: int) -> Decimal:
    return Decimal(scalar(engine, "SELECT balance FROM account WHERE id = :id", id=account_id))


def posted_sum(engine: Engine, account_id: int) -> Decimal:
    return Decimal(scalar(engine, "SELECT coalesce(sum(amount), 0) FROM posting "
                                  "WHERE account_id = :id", id=account_id))


def postings_of(engine: Engine, account_id: int) -> list[dict[str, Any]]:
    return rows(engine, "SELECT p.id, p.entry_id, e.kind, p.amount, p.currency FROM posting p "
                        "JOIN ledger_entry e ON e.id = p.entry_id WHERE p.account_id = :id "
                        "ORDER BY p.id", id=account_id)


def ledger_problems(engine: Engine, account_ids: Sequence[int] | None = None) -> list[str]:
    """What is wrong with the ledger: customer balances that differ from their postings,
    entries whose postings do not sum to zero per currency, negative customer balances."""
    problems = []
    filter_ids = "AND a.id = ANY(:ids)" if account_ids is not None else ""
    params = {"ids": list(account_ids)} if account_ids is not None else {}
    for r in rows(engine, f"""
            SELECT a.id, a.balance, coalesce(sum(p.amount), 0) AS postings
              FROM account a LEFT JOIN posting p ON p.account_id = a.id
             WHERE a.kind = 'CUSTOMER' {filter_ids}
             GROUP BY a.id, a.balance HAVING a.balance <> coalesce(sum(p.amount), 0)
             ORDER BY a.id""", **params):
        problems.append(f"account {r['id']}: balance {fmt(r['balance'])} but its postings "
                        f"sum to {fmt(r['postings'])}")
    for r in rows(engine, """
            SELECT entry_id, currency, sum(amount) AS imbalance, count(*) AS legs
              FROM posting GROUP BY entry_id, currency HAVING sum(amount) <> 0
             ORDER BY entry_id LIMIT 5"""):
        problems.append(f"entry {r['entry_id']}: its {r['currency']} postings "
                        f"({r['legs']}) sum to {fmt(r['imbalance'])}, not 0")
    for r in rows(engine, "SELECT id, balance FROM account WHERE kind = 'CUSTOMER' "
                          "AND balance < 0 ORDER BY id"):
        problems.append(f"account {r['id']}: negative balance {fmt(r['balance'])}")
    return problems


def assert_ledger_agrees(engine: Engine, what: str, account_ids: Sequence[int] | None = None,
                         read: str = "schema") -> None:
    problems = ledger_problems(engine, account_ids)
    if problems:
        raise CheckFailure(
            f"{what}: the balances and the ledger disagree.",
            expected="every customer balance equals the sum of its postings, and every entry's "
                     "postings sum to zero per currency",
            actual=f"{len(problems)} problem(s)", evidence="\n".join(problems[:10]),
            fix="change the balance and write the entry's postings in the same transaction",
            lesson=see(read))


def ledger_table(engine: Engine, account_id: int, limit: int = 12) -> str:
    return table(postings_of(engine, account_id), ("id", "kind", "amount", "currency",
                                                   "entry_id"), limit)


# -- the exchange stages' kit ----------------------------------------------------------------

@dataclass
class ExchangeKit:
    """The learner's exchange modules, the provider the check runs, and a client factory."""

    accounts: ModuleType
    fx_client: ModuleType
    breaker: ModuleType
    exchange: ModuleType
    provider: Any  # _provider.FxProvider
    clock: InstantClock
    engine: Engine

    def client(self, timeout: float = 1.0, breaker: Any = None) -> Any:
        """The learner's FxClient pointed at the check's provider."""
        return call(self.fx_client.FxClient, self.provider.url, timeout=timeout,
                    breaker=breaker)


# -- races ------------------------------------------------------------------------------------

def failures(outcomes: Sequence[Any], allowed: tuple[type[BaseException], ...] = ()
             ) -> list[Any]:
    """Outcomes that raised something other than `allowed` (refusals the API documents)."""
    return [o for o in outcomes if o.error is not None and not isinstance(o.error, allowed)]


def describe_errors(outcomes: Sequence[Any], limit: int = 4) -> str:
    lines = [f"worker {o.index}: {first_line(o.error)}" for o in outcomes[:limit]]
    if len(outcomes) > limit:
        lines.append(f"… and {len(outcomes) - limit} more")
    return "\n".join(lines)


def process_hammer(impl_dir: str, url: str, account_id: int, seed: int, operations: int,
                   index: int) -> list[list[str]]:
    """One hammering process: `operations` deposits and withdrawals on one account through the
    learner's accounts module, each run in a process of its own. Returns [op, amount, result]
    with result "ok", "refused" (InsufficientFunds) or the error."""
    import random
    import sys

    from sqlalchemy import create_engine

    sys.path.insert(0, impl_dir)
    import accounts

    engine = create_engine(url, pool_size=4, max_overflow=0)
    rng = random.Random(seed * 1000 + index)
    out: list[list[str]] = []
    lock = threading.Lock()

    def worker(n: int) -> None:
        for _ in range(n):
            op = rng.choice(("deposit", "withdraw", "withdraw"))
            amount = Decimal(rng.choice(("1.10", "2.35", "3.05", "0.45")))
            try:
                getattr(accounts, op)(engine, account_id, amount)
                result = "ok"
            except accounts.InsufficientFunds:
                result = "refused"
            except Exception as exc:
                result = f"{type(exc).__name__}: {exc}"[:200]
            with lock:
                out.append([op, str(amount), result])

    threads = [threading.Thread(target=worker, args=(operations // 4,)) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    engine.dispose()
    return out


# -- exchanges against what the provider did -------------------------------------------------

def exchange_anomalies(kit: ExchangeKit, source: int, target: int, funded_with: Decimal
                       ) -> tuple[list[str], str]:
    """Compare every exchange (status) with what the provider recorded (converted or not) and
    the customer balances with both. Returns (named anomalies, a table of the evidence)."""
    exchanges = rows(kit.engine, "SELECT id::text AS id, status, sell_amount FROM exchange "
                                 "ORDER BY created_at, id")
    converted = kit.provider.converted()
    anomalies: list[str] = []
    evidence = []
    for ex in exchanges:
        order = converted.get(ex["id"])
        provider_says = ("converted " + fmt(order.bought_amount)) if order else (
            "rejected" if ex["id"] in kit.provider.orders else
            "voided (NOT_FOUND)" if ex["id"] in kit.provider.voided else "never received")
        evidence.append({"exchange": ex["id"][:8], "status": ex["status"],
                         "provider": provider_says})
        if ex["status"] == "FAILED" and order:
            anomalies.append(f"double money: exchange {ex['id']} was refunded, but the "
                             f"provider converted it ({fmt(order.bought_amount)} EUR bought)")
        if ex["status"] == "COMPLETED" and not order:
            anomalies.append(f"money from nowhere: exchange {ex['id']} was credited, but "
                             "the provider never converted it")
    refunded_or_open = sum((Decimal(ex["sell_amount"]) for ex in exchanges
                            if ex["status"] != "FAILED"), Decimal(0))
    credited = sum((converted[ex["id"]].bought_amount for ex in exchanges
                    if ex["status"] == "COMPLETED" and ex["id"] in converted), Decimal(0))
    src, dst = balance_of(kit.engine, source), balance_of(kit.engine, target)
    owed = funded_with - refunded_or_open
    if src != owed:
        anomalies.append(f"source balance {fmt(src)} USD, expected {fmt(owed)} (funded "
                         f"{fmt(funded_with)}, minus the exchanges not refunded): "
                         f"{'refunded twice' if src > owed else 'debited twice'}")
    if dst != credited:
        anomalies.append(f"target balance {fmt(dst)} EUR, expected {fmt(credited)} (what the "
                         f"COMPLETED exchanges bought): "
                         + ("credited more than the provider bought" if dst > credited
                            else "credit missing"))
    return anomalies, table(evidence, ("exchange", "status", "provider"))
