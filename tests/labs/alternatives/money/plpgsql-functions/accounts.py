"""Accounts: open, deposit, withdraw, transfer, and interest, correct under concurrency.

Design: every money movement is ONE call of a PL/pgSQL function (schema.sql), so each is a
single statement in a single short transaction; Python validates, hashes the request for
idempotency and maps the function's outcome to the service's exceptions. No database error is
used for control flow: the functions answer with an outcome code.

Which operation uses which lock, and why:

- deposit: the row lock of `UPDATE ... SET balance = balance + :amount` inside money_move();
  nothing is read first, so there is nothing to race.
- withdraw: the same function, with `AND balance >= :amount` in the UPDATE's WHERE: a second
  withdrawal queued on the row re-evaluates the condition on the committed balance.
- transfer: money_transfer() takes `FOR UPDATE` on both rows ordered by id before reading
  them, so opposite transfers queue instead of deadlocking.
- apply_interest: no lock while the rule runs; money_interest() updates `WHERE version =
  :read` (optimistic). `version` is bumped by a BEFORE UPDATE trigger whenever balance changes,
  so no writer (not even an admin's plain SQL) can forget it.
- idempotency keys: idem_claim() does INSERT ... ON CONFLICT DO NOTHING in the same
  transaction as the movement; a racing duplicate waits on the primary key until the first
  commits, then replays its stored response. A refusal deletes its own claim before commit.
- the per-currency SYSTEM clearing account is always updated after the customer row(s).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from sqlalchemy import Engine, text

CENT = Decimal("0.01")


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


def validate_amount(amount: Any) -> Decimal:
    """A positive Decimal (or int) with at most two decimals."""
    if isinstance(amount, float):
        raise TypeError(f"money is never a float ({amount!r}): pass Decimal('...')")
    if isinstance(amount, bool) or not isinstance(amount, (Decimal, int)):
        raise TypeError(f"money is a Decimal or an int, not {type(amount).__name__}")
    value = Decimal(amount)
    if not value.is_finite():
        raise ValueError(f"{value} is not an amount")
    if value <= 0:
        raise ValueError(f"the amount must be positive, got {value}")
    if value.as_tuple().exponent < -2 and value != value.quantize(CENT):
        raise ValueError(f"{value}: at most two decimal places")
    return value


def fingerprint(operation: str, **fields: Any) -> str:
    canonical = {k: (format(v.normalize(), "f") if isinstance(v, Decimal) else v)
                 for k, v in fields.items()}
    return hashlib.sha256(json.dumps([operation, canonical], sort_keys=True).encode()).hexdigest()


_REFUSAL = {
    "INSUFFICIENT": InsufficientFunds,
    "NOT_FOUND": AccountNotFound,
    "MISMATCH": CurrencyMismatch,
    "CONFLICT": IdempotencyConflict,
}


def refuse(outcome: str, detail: str) -> None:
    if outcome in _REFUSAL:
        raise _REFUSAL[outcome](f"{detail}: {outcome.lower().replace('_', ' ')}")


def call(engine: Engine, sql: str, params: dict[str, Any]) -> tuple[str, dict[str, Any] | None]:
    """One function call, one transaction."""
    with engine.begin() as conn:
        row = conn.execute(text(sql), params).one()
    return row.outcome, row.payload


def open_account(engine: Engine, *, currency: str, customer_id: int | None = None) -> int:
    """Open a CUSTOMER account with a zero balance; returns its id."""
    if not (isinstance(currency, str) and len(currency) == 3 and currency.isascii()
            and currency.isalpha() and currency.isupper()):
        raise ValueError(f"not an ISO currency code: {currency!r}")
    with engine.begin() as conn:
        return conn.execute(text(
            "INSERT INTO account (kind, currency) VALUES ('CUSTOMER', :c) RETURNING id"),
            {"c": currency}).scalar_one()


def balance(engine: Engine, account_id: int) -> Decimal:
    """The account's balance now (AccountNotFound if there is no such account)."""
    with engine.connect() as conn:
        found = conn.execute(text("SELECT balance FROM account WHERE id = :id"),
                             {"id": account_id}).first()
    if found is None:
        raise AccountNotFound(f"account {account_id} does not exist")
    return found.balance


def _move(engine: Engine, op: str, account_id: int, amount: Any,
          idempotency_key: str | None) -> Receipt:
    value = validate_amount(amount)
    digest = fingerprint(op, account=account_id, amount=value) if idempotency_key else None
    outcome, payload = call(engine, "SELECT * FROM money_move(:op, :account, :amount, :key, :hash)",
                            {"op": op, "account": account_id, "amount": value,
                             "key": idempotency_key, "hash": digest})
    refuse(outcome, f"{op} of {value} on account {account_id}")
    assert payload is not None
    return Receipt(str(payload["entry_id"]), int(payload["account_id"]),
                   Decimal(payload["amount"]), Decimal(payload["balance"]))


def deposit(engine: Engine, account_id: int, amount: Decimal, *,
            idempotency_key: str | None = None) -> Receipt:
    """Add `amount` to a customer account, with a balanced DEPOSIT entry."""
    return _move(engine, "deposit", account_id, amount, idempotency_key)


def withdraw(engine: Engine, account_id: int, amount: Decimal, *,
             idempotency_key: str | None = None) -> Receipt:
    """Take `amount` out of a customer account, or raise InsufficientFunds (nothing moved)."""
    return _move(engine, "withdraw", account_id, amount, idempotency_key)


def transfer(engine: Engine, from_account_id: int, to_account_id: int, amount: Decimal, *,
             idempotency_key: str | None = None) -> TransferReceipt:
    """Move `amount` between two customer accounts of one currency."""
    value = validate_amount(amount)
    if from_account_id == to_account_id:
        raise ValueError("cannot transfer from an account to itself")
    digest = (fingerprint("transfer", source=from_account_id, target=to_account_id, amount=value)
              if idempotency_key else None)
    outcome, payload = call(
        engine, "SELECT * FROM money_transfer(:a, :b, :amount, :key, :hash)",
        {"a": from_account_id, "b": to_account_id, "amount": value, "key": idempotency_key,
         "hash": digest})
    refuse(outcome, f"transfer of {value} from {from_account_id} to {to_account_id}")
    assert payload is not None
    return TransferReceipt(str(payload["entry_id"]), int(payload["from_account_id"]),
                           int(payload["to_account_id"]), Decimal(payload["amount"]),
                           Decimal(payload["from_balance"]), Decimal(payload["to_balance"]))


def apply_interest(engine: Engine, account_id: int, rule: Callable[[Decimal], Decimal], *,
                   max_attempts: int = 20) -> InterestResult:
    """Credit the interest `rule(balance)` computes (a Decimal >= 0), with optimistic locking;
    nothing is held while the rule runs."""
    for _attempt in range(max_attempts):
        with engine.connect() as conn:
            seen = conn.execute(text(
                "SELECT balance, version FROM account WHERE id = :id AND kind = 'CUSTOMER'"),
                {"id": account_id}).first()
        if seen is None:
            raise AccountNotFound(f"account {account_id} does not exist")
        interest = rule(seen.balance)
        if not isinstance(interest, Decimal) or not interest.is_finite() or interest < 0:
            raise ValueError(f"an interest rule returns a Decimal >= 0, not {interest!r}")
        if interest == 0:
            return InterestResult(None, account_id, seen.balance, interest, seen.balance)
        interest = validate_amount(interest)
        outcome, payload = call(engine, "SELECT * FROM money_interest(:id, :version, :interest)",
                                {"id": account_id, "version": seen.version, "interest": interest})
        if outcome == "STALE":
            continue
        assert payload is not None
        return InterestResult(str(payload["entry_id"]), account_id, seen.balance, interest,
                              Decimal(payload["balance"]))
    raise ConcurrentModification(
        f"account {account_id} kept changing: gave up after {max_attempts} attempts")
