"""Accounts: open, deposit, withdraw, transfer, and interest, correct under concurrency.

Every function takes the SQLAlchemy engine it works on (the checks pass their own, and watch
what runs through it); amounts are Decimal end to end.

Which operation uses which lock, and why (fill this in as you write them; an interviewer
will ask):

- deposit:
- withdraw:
- transfer:
- apply_interest:
- idempotency keys:
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal

from sqlalchemy import Engine


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


def open_account(engine: Engine, *, currency: str, customer_id: int | None = None) -> int:
    """Open a CUSTOMER account with a zero balance; returns its id."""
    raise NotImplementedError(
        "insert a CUSTOMER account row in `currency` with balance 0 and return its id "
        "(INSERT ... RETURNING id inside `with engine.begin() as conn:`)")


def balance(engine: Engine, account_id: int) -> Decimal:
    """The account's balance now (AccountNotFound if there is no such account)."""
    raise NotImplementedError("SELECT the account's balance and return it as it comes back "
                              "from psycopg: a Decimal")


def deposit(engine: Engine, account_id: int, amount: Decimal, *,
            idempotency_key: str | None = None) -> Receipt:
    """Add `amount` to a customer account, with a balanced DEPOSIT entry.

    `amount` is a positive Decimal (or int) with at most two decimals: a float raises
    TypeError, zero, negative or finer amounts raise ValueError. With an idempotency key, a
    retry of the same request returns the first Receipt and moves nothing (stage
    idempotency); the key with a different request raises IdempotencyConflict.
    """
    raise NotImplementedError(
        "in one transaction: add to the customer's balance, write a DEPOSIT ledger_entry "
        "with two postings (+amount on the customer, -amount on a SYSTEM clearing account "
        "in the same currency) and return Receipt(entry_id, account_id, amount, new balance)")


def withdraw(engine: Engine, account_id: int, amount: Decimal, *,
             idempotency_key: str | None = None) -> Receipt:
    """Take `amount` out of a customer account, or raise InsufficientFunds (nothing moved).

    Same amount rules and idempotency as deposit.
    """
    raise NotImplementedError(
        "one conditional UPDATE ... SET balance = balance - :amount WHERE id = :id AND "
        "balance >= :amount RETURNING balance; no row returned means InsufficientFunds (or "
        "AccountNotFound); then the WITHDRAWAL entry and its two postings, same transaction")


def transfer(engine: Engine, from_account_id: int, to_account_id: int, amount: Decimal, *,
             idempotency_key: str | None = None) -> TransferReceipt:
    """Move `amount` between two customer accounts of one currency.

    Raises InsufficientFunds, CurrencyMismatch, AccountNotFound, or ValueError (same account,
    bad amount); with a key, idempotent like deposit.
    """
    raise NotImplementedError(
        "lock both account rows in one global order (SELECT ... WHERE id IN (:a, :b) ORDER BY "
        "id FOR NO KEY UPDATE), check currency and balance, update both, write one TRANSFER "
        "entry with two postings")


def apply_interest(engine: Engine, account_id: int, rule: Callable[[Decimal], Decimal], *,
                   max_attempts: int = 20) -> InterestResult:
    """Credit the interest `rule(balance)` computes (a Decimal >= 0), with optimistic locking.

    The rule runs in Python and may be slow (it could call a pricing service): hold no lock,
    no transaction and no connection while it runs. If the account changed meanwhile, read it
    again and recompute; after max_attempts attempts that all found it changed (the rule called
    max_attempts times) raise ConcurrentModification.
    """
    raise NotImplementedError(
        "read balance and version, call rule(balance) outside any transaction, then UPDATE "
        "account SET balance = :new, version = version + 1 WHERE id = :id AND version = "
        ":read; zero rows: someone changed it, loop; one row: write the INTEREST entry")
