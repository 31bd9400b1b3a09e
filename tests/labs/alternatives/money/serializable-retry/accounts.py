"""Accounts: open, deposit, withdraw, transfer, and interest, correct under concurrency.

This implementation decides in Python from plain reads and lets PostgreSQL's SERIALIZABLE
isolation (serializable snapshot isolation) guarantee that the result is the same as some
serial order: a transaction whose reads were overtaken by a concurrent commit fails with
SQLSTATE 40001 and is retried from the start. Writes to several rows go in ascending id
order (customers first, then the clearing account) so that waiting never forms a cycle.

Which operation uses which lock, and why:

- deposit / withdraw: no explicit lock. SELECT balance, decide, UPDATE SET balance = :new,
  all SERIALIZABLE: if two withdrawals read the same balance, the second one to write gets
  40001 (first-updater-wins) and re-reads the new balance on its retry.
- transfer: the same, over two rows; the UPDATEs go in ascending id order, so opposite
  transfers queue on the same first row and never deadlock; the loser retries.
- apply_interest: optimistic, READ COMMITTED: read balance and version, run the rule with
  nothing open, UPDATE ... WHERE version = :read; zero rows: read again and recompute.
  Every write in this module sets version = version + 1.
- idempotency keys: INSERT ... ON CONFLICT DO NOTHING inside the serializable transaction;
  a duplicate that collides with a key committed after its snapshot gets 40001, retries,
  and then reads the stored response.
"""

from __future__ import annotations

import hashlib
import json
import random
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, TypeVar

from sqlalchemy import Connection, Engine, text
from sqlalchemy.exc import DBAPIError

T = TypeVar("T")
CENT = Decimal("0.01")
RETRYABLE = {"40001"}  # serialization_failure


class MoneyError(Exception):
    """Base class of the refusals the service answers with."""


class InsufficientFunds(MoneyError):
    """The account's balance does not cover the amount; nothing was moved."""


class AccountNotFound(MoneyError):
    """No customer account with that id."""


class CurrencyMismatch(MoneyError):
    """The accounts (or the quote) are in different currencies."""


class IdempotencyConflict(MoneyError):
    """The idempotency key was already used for a different request."""


class ConcurrentModification(MoneyError):
    """apply_interest lost the optimistic race more often than max_attempts allows."""


@dataclass(frozen=True)
class Receipt:
    """The answer to a deposit or withdrawal: the ledger entry and the balance right after."""

    entry_id: str
    account_id: int
    amount: Decimal
    balance: Decimal


@dataclass(frozen=True)
class TransferReceipt:
    """The answer to a transfer: the ledger entry and both balances right after."""

    entry_id: str
    from_account_id: int
    to_account_id: int
    amount: Decimal
    from_balance: Decimal
    to_balance: Decimal


@dataclass(frozen=True)
class InterestResult:
    """What apply_interest did: the balance it computed from, the interest, the new balance.
    `entry_id` is None when the rule gave zero interest (nothing posted)."""

    entry_id: str | None
    account_id: int
    balance_before: Decimal
    interest: Decimal
    balance_after: Decimal


# -- infrastructure ------------------------------------------------------------------------


def serializable(engine: Engine, work: Callable[[Connection], T], *, attempts: int = 400) -> T:
    """Run `work` in a SERIALIZABLE transaction, retrying serialization failures with a
    small random backoff. A MoneyError from `work` rolls back and is raised at once."""
    for attempt in range(attempts):
        try:
            with engine.connect() as conn:
                conn.execution_options(isolation_level="SERIALIZABLE")
                with conn.begin():
                    return work(conn)
        except DBAPIError as error:
            if getattr(error.orig, "sqlstate", None) not in RETRYABLE:
                raise
            time.sleep(random.uniform(0, min(0.002 * (attempt + 1), 0.05)))
    raise RuntimeError(f"gave up after {attempts} serialization failures")


def amount_of(amount: Any) -> Decimal:
    if isinstance(amount, float):
        raise TypeError("amounts must not be floats")
    if isinstance(amount, bool) or not isinstance(amount, (int, Decimal)):
        raise TypeError(f"amounts are Decimal or int, got {type(amount).__name__}")
    value = Decimal(amount)
    if not value.is_finite() or value <= 0:
        raise ValueError(f"amount must be positive: {value}")
    if value % CENT != 0:
        raise ValueError(f"amount has more than two decimals: {value}")
    return value.quantize(CENT)


def request_digest(*parts: Any) -> str:
    return hashlib.sha256("|".join(map(str, parts)).encode()).hexdigest()


def claim(conn: Connection, key: str | None, digest: str, operation: str) -> Any | None:
    """None: this transaction owns `key` (or there is none); else the stored response."""
    if key is None:
        return None
    mine = conn.execute(text(
        "INSERT INTO idempotency_key (key, request_hash, operation) VALUES (:k, :h, :op) "
        "ON CONFLICT (key) DO NOTHING RETURNING 1"), {"k": key, "h": digest, "op": operation}
    ).scalar()
    if mine:
        return None
    found = conn.execute(text("SELECT request_hash, response FROM idempotency_key WHERE key = :k"),
                         {"k": key}).one()
    if found.request_hash != digest:
        raise IdempotencyConflict(f"idempotency key {key!r} was used for another request")
    return found.response


def keep(conn: Connection, key: str | None, response: dict[str, Any]) -> None:
    if key is not None:
        conn.execute(text("UPDATE idempotency_key SET response = CAST(:r AS jsonb) WHERE key = :k"),
                     {"k": key, "r": json.dumps(response)})


def clearing_account(conn: Connection, currency: str) -> int:
    label = f"clearing:{currency}"
    found = conn.execute(text("SELECT id FROM account WHERE label = :l"), {"l": label}).scalar()
    if found is not None:
        return int(found)
    conn.execute(text("INSERT INTO account (kind, currency, label) VALUES ('SYSTEM', :c, :l) "
                      "ON CONFLICT (label) WHERE label IS NOT NULL DO NOTHING"),
                 {"c": currency, "l": label})
    return int(conn.execute(text("SELECT id FROM account WHERE label = :l"),
                            {"l": label}).scalar_one())


def write_balance(conn: Connection, account_id: int, new_balance: Decimal) -> None:
    conn.execute(text("UPDATE account SET balance = :b, version = version + 1 WHERE id = :id"),
                 {"b": new_balance, "id": account_id})


def add_to_balance(conn: Connection, account_id: int, delta: Decimal) -> Decimal:
    return conn.execute(text("UPDATE account SET balance = balance + :d, version = version + 1 "
                             "WHERE id = :id RETURNING balance"),
                        {"d": delta, "id": account_id}).scalar_one()


def journal(conn: Connection, kind: str, legs: Sequence[tuple[int, Decimal, str]],
            **metadata: Any) -> str:
    entry_id = str(uuid.uuid4())
    conn.execute(text("INSERT INTO ledger_entry (id, kind, metadata) "
                      "VALUES (:id, :k, CAST(:m AS jsonb))"),
                 {"id": entry_id, "k": kind, "m": json.dumps(metadata)})
    for account_id, amount, currency in legs:
        conn.execute(text("INSERT INTO posting (entry_id, account_id, amount, currency) "
                          "VALUES (:e, :a, :x, :c)"),
                     {"e": entry_id, "a": account_id, "x": amount, "c": currency})
    return entry_id


def customer(conn: Connection, account_id: int) -> Any:
    row = conn.execute(text("SELECT id, currency, balance FROM account "
                            "WHERE id = :id AND kind = 'CUSTOMER'"), {"id": account_id}).first()
    if row is None:
        raise AccountNotFound(f"customer account {account_id} does not exist")
    return row


def _receipt(data: dict[str, Any]) -> Receipt:
    return Receipt(data["entry"], data["account"], Decimal(data["amount"]),
                   Decimal(data["balance"]))


# -- the API -------------------------------------------------------------------------------


def open_account(engine: Engine, *, currency: str, customer_id: int | None = None) -> int:
    """Open a CUSTOMER account with a zero balance; returns its id."""
    if not (isinstance(currency, str) and len(currency) == 3 and currency.isalpha()
            and currency.isupper()):
        raise ValueError(f"bad currency code {currency!r}")
    with engine.begin() as conn:
        return int(conn.execute(text("INSERT INTO account (currency) VALUES (:c) RETURNING id"),
                                {"c": currency}).scalar_one())


def balance(engine: Engine, account_id: int) -> Decimal:
    """The account's balance now (AccountNotFound if there is no such account)."""
    with engine.connect() as conn:
        value = conn.execute(text("SELECT balance FROM account WHERE id = :id"),
                             {"id": account_id}).scalar()
    if value is None:
        raise AccountNotFound(f"account {account_id} does not exist")
    return value


def _single(engine: Engine, kind: str, account_id: int, amount: Any,
            key: str | None) -> Receipt:
    value = amount_of(amount)
    digest = request_digest(kind, account_id, value)

    def work(conn: Connection) -> Receipt:
        stored = claim(conn, key, digest, kind)
        if stored is not None:
            return _receipt(stored)
        row = customer(conn, account_id)
        new_balance = row.balance + value if kind == "DEPOSIT" else row.balance - value
        if new_balance < 0:
            raise InsufficientFunds(f"account {account_id} has {row.balance}, needs {value}")
        write_balance(conn, account_id, new_balance)
        clearing = clearing_account(conn, row.currency)
        add_to_balance(conn, clearing, value if kind == "WITHDRAWAL" else -value)
        sign = 1 if kind == "DEPOSIT" else -1
        entry = journal(conn, kind, [(account_id, sign * value, row.currency),
                                     (clearing, -sign * value, row.currency)])
        response = {"entry": entry, "account": account_id, "amount": str(value),
                    "balance": str(new_balance)}
        keep(conn, key, response)
        return _receipt(response)

    return serializable(engine, work)


def deposit(engine: Engine, account_id: int, amount: Decimal, *,
            idempotency_key: str | None = None) -> Receipt:
    """Add `amount` to a customer account, with a balanced DEPOSIT entry."""
    return _single(engine, "DEPOSIT", account_id, amount, idempotency_key)


def withdraw(engine: Engine, account_id: int, amount: Decimal, *,
             idempotency_key: str | None = None) -> Receipt:
    """Take `amount` out of a customer account, or raise InsufficientFunds (nothing moved)."""
    return _single(engine, "WITHDRAWAL", account_id, amount, idempotency_key)


def transfer(engine: Engine, from_account_id: int, to_account_id: int, amount: Decimal, *,
             idempotency_key: str | None = None) -> TransferReceipt:
    """Move `amount` between two customer accounts of one currency."""
    value = amount_of(amount)
    if from_account_id == to_account_id:
        raise ValueError("source and target are the same account")
    digest = request_digest("TRANSFER", from_account_id, to_account_id, value)

    def work(conn: Connection) -> TransferReceipt:
        stored = claim(conn, idempotency_key, digest, "TRANSFER")
        if stored is not None:
            return TransferReceipt(stored["entry"], stored["from"], stored["to"],
                                   Decimal(stored["amount"]), Decimal(stored["from_balance"]),
                                   Decimal(stored["to_balance"]))
        source, target = customer(conn, from_account_id), customer(conn, to_account_id)
        if source.currency != target.currency:
            raise CurrencyMismatch(f"{source.currency} -> {target.currency}")
        if source.balance < value:
            raise InsufficientFunds(f"account {from_account_id} has {source.balance}")
        after = {from_account_id: source.balance - value, to_account_id: target.balance + value}
        for account_id in sorted(after):  # ascending id: one write order for every transfer
            write_balance(conn, account_id, after[account_id])
        entry = journal(conn, "TRANSFER", [(from_account_id, -value, source.currency),
                                           (to_account_id, value, source.currency)])
        keep(conn, idempotency_key, {
            "entry": entry, "from": from_account_id, "to": to_account_id, "amount": str(value),
            "from_balance": str(after[from_account_id]),
            "to_balance": str(after[to_account_id])})
        return TransferReceipt(entry, from_account_id, to_account_id, value,
                               after[from_account_id], after[to_account_id])

    return serializable(engine, work)


def apply_interest(engine: Engine, account_id: int, rule: Callable[[Decimal], Decimal], *,
                   max_attempts: int = 20) -> InterestResult:
    """Credit the interest `rule(balance)` computes (a Decimal >= 0), with optimistic
    locking; nothing is open while the rule runs."""
    conflicts = 0
    while conflicts < max_attempts:
        with engine.connect() as conn:
            read = conn.execute(text("SELECT balance, version, currency FROM account "
                                     "WHERE id = :id AND kind = 'CUSTOMER'"),
                                {"id": account_id}).first()
            conn.rollback()
        if read is None:
            raise AccountNotFound(f"customer account {account_id} does not exist")
        interest = rule(read.balance)
        if not isinstance(interest, Decimal) or interest < 0:
            raise ValueError(f"rule returned {interest!r}; expected a Decimal >= 0")
        if interest == 0:
            return InterestResult(None, account_id, read.balance, interest, read.balance)
        interest = amount_of(interest)
        with engine.begin() as conn:
            done = conn.execute(text(
                "UPDATE account SET balance = balance + :i, version = version + 1 "
                "WHERE id = :id AND version = :v RETURNING balance"),
                {"i": interest, "id": account_id, "v": read.version}).scalar()
            if done is None:
                conflicts += 1
                continue
            clearing = clearing_account(conn, read.currency)
            add_to_balance(conn, clearing, -interest)
            entry = journal(conn, "INTEREST", [(account_id, interest, read.currency),
                                               (clearing, -interest, read.currency)],
                            computed_from=str(read.balance))
        return InterestResult(entry, account_id, read.balance, interest, done)
    raise ConcurrentModification(f"account {account_id}: {conflicts} conflicts in a row")
