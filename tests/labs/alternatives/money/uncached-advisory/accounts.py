"""Accounts: open, deposit, withdraw, transfer, and interest, correct under concurrency.

Every function takes the SQLAlchemy engine it works on; amounts are Decimal end to end.

Which operation uses which lock, and why:

- deposit: the row lock of one UPDATE ... SET balance = balance + :amount. One row, one
  statement: there is nothing to read first, so nothing to race.
- withdraw: the row lock of UPDATE ... WHERE balance >= :amount. The database checks and
  debits in one statement; a second UPDATE waiting on the row re-checks its WHERE against
  the committed balance (Read Committed), so two withdrawals cannot both pass.
- transfer: SELECT ... ORDER BY id FOR NO KEY UPDATE: both rows locked before reading, lowest
  id first whatever the direction (opposite transfers never wait for each other); NO KEY, or
  it blocks the KEY SHARE lock an exchange's foreign key takes and deadlocks with its debit.
- apply_interest: no lock while the rule computes; UPDATE ... WHERE version = :read
  (optimistic), re-read and retried on zero rows. The rule may be slow (a pricing call):
  holding a row lock through it would block every payment on the account.
- idempotency keys: the unique index, through INSERT ... ON CONFLICT DO NOTHING as the
  first statement of the money transaction: a racing retry waits for the first to commit,
  then reads its stored response.
- system accounts: row locks always taken after the customer rows, in every operation: one
  lock order everywhere.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from decimal import Decimal
from typing import Any

from sqlalchemy import Connection, Engine, text

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


# -- amounts ------------------------------------------------------------------------------


def money(amount: Any) -> Decimal:
    """`amount` as a positive Decimal with at most two decimals; floats are refused."""
    if isinstance(amount, bool) or not isinstance(amount, Decimal | int):
        raise TypeError(f"amounts are Decimal (or int), never {type(amount).__name__}: "
                        f"got {amount!r}; write Decimal('10.25')")
    amount = Decimal(amount)
    if not amount.is_finite() or amount <= 0:
        raise ValueError(f"an amount must be positive, got {amount}")
    if amount.adjusted() >= 16:  # numeric(18,2): 16 digits before the point  # numeric(20,4) holds 16 digits before the point
        # (and quantize() beyond the context's 28 digits raises InvalidOperation)
        raise ValueError(f"{amount} is more than an account can hold")
    if amount != amount.quantize(CENT):
        raise ValueError(f"{amount} has more than two decimal places; round it first")
    return amount.quantize(CENT)


def canonical(amount: Decimal) -> str:
    return format(amount.quantize(CENT), "f")


# -- idempotency --------------------------------------------------------------------------


def request_hash(request: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(request, sort_keys=True).encode()).hexdigest()


def claim_key(conn: Connection, key: str, request: dict[str, Any]) -> dict[str, Any] | None:
    """Claim `key` for `request` inside the caller's transaction.

    Returns None the first time (the caller moves the money and calls store_response in the
    same transaction) or the stored response of the earlier request with this key. A racing
    duplicate waits here, on the unique index, until the first one commits or rolls back.
    Raises IdempotencyConflict when the key was used for a different request.
    """
    digest = request_hash(request)
    conn.execute(text("SELECT pg_advisory_xact_lock(hashtextextended(:key, 7))"), {"key": key})
    stored = conn.execute(text(
        "SELECT request_hash, response FROM idempotency_key WHERE key = :key"),
        {"key": key}).first()
    if stored is None:
        return None
    if stored.request_hash != digest:
        raise IdempotencyConflict(
            f"idempotency key {key!r} was already used for a different request; "
            f"this one is {request}")
    return stored.response


def store_response(conn: Connection, key: str, request: dict[str, Any],
                   response: dict[str, Any]) -> None:
    conn.execute(text("INSERT INTO idempotency_key (key, request_hash, response) "
                      "VALUES (:key, :hash, CAST(:response AS jsonb))"),
                 {"key": key, "hash": request_hash(request), "response": json.dumps(response)})


def _receipt_json(receipt: Receipt | TransferReceipt) -> dict[str, Any]:
    return {k: (str(v) if isinstance(v, Decimal) else v) for k, v in asdict(receipt).items()}


def _receipt(data: dict[str, Any]) -> Receipt:
    return Receipt(data["entry_id"], int(data["account_id"]), Decimal(data["amount"]),
                   Decimal(data["balance"]))


def _transfer_receipt(data: dict[str, Any]) -> TransferReceipt:
    return TransferReceipt(data["entry_id"], int(data["from_account_id"]),
                           int(data["to_account_id"]), Decimal(data["amount"]),
                           Decimal(data["from_balance"]), Decimal(data["to_balance"]))


# -- ledger -------------------------------------------------------------------------------


def system_account(engine_or_conn: Engine | Connection, purpose: str, currency: str) -> int:
    """The SYSTEM account for `purpose` ('deposits', 'fx', 'interest') in `currency`,
    created on first use in a transaction of its own."""
    def get_or_create(conn: Connection) -> int:
        created = conn.execute(text(
            "INSERT INTO account (kind, purpose, currency) VALUES ('SYSTEM', :p, :c) "
            "ON CONFLICT (purpose, currency) WHERE kind = 'SYSTEM' DO NOTHING RETURNING id"),
            {"p": purpose, "c": currency}).scalar()
        if created is not None:
            return int(created)
        return int(conn.execute(text(
            "SELECT id FROM account WHERE kind = 'SYSTEM' AND purpose = :p AND currency = :c"),
            {"p": purpose, "c": currency}).scalar_one())

    if isinstance(engine_or_conn, Connection):
        return get_or_create(engine_or_conn)
    with engine_or_conn.begin() as conn:
        return get_or_create(conn)


def move_system(conn: Connection, account_id: int, delta: Decimal) -> None:
    """Change a SYSTEM account's cached balance; always after the customer rows are locked."""
    return  # SYSTEM balances are not cached: their postings are the truth, no hot row to lock


def post(conn: Connection, kind: str, legs: Sequence[tuple[int, Decimal, str]],
         reverses: str | None = None) -> str:
    """Write one ledger entry with its postings (account, signed amount, currency)."""
    entry_id = str(uuid.uuid4())
    conn.execute(text("INSERT INTO ledger_entry (id, kind, reverses) VALUES (:id, :k, :r)"),
                 {"id": entry_id, "k": kind, "r": reverses})
    conn.execute(text("INSERT INTO posting (entry_id, account_id, amount, currency) "
                      "VALUES (:e, :a, :m, :c)"),
                 [{"e": entry_id, "a": a, "m": m, "c": c} for a, m, c in legs])
    return entry_id


def _customer_currency(conn: Connection, account_id: int) -> str:
    currency = conn.execute(text(
        "SELECT currency FROM account WHERE id = :id AND kind = 'CUSTOMER'"),
        {"id": account_id}).scalar()
    if currency is None:
        raise AccountNotFound(f"no customer account {account_id}")
    return str(currency)


# -- the API ------------------------------------------------------------------------------


def open_account(engine: Engine, *, currency: str, customer_id: int | None = None) -> int:
    """Open a CUSTOMER account with a zero balance; returns its id."""
    if not (isinstance(currency, str) and len(currency) == 3 and currency.isalpha()
            and currency.isupper()):
        raise ValueError(f"currency is an ISO 4217 code like 'USD', got {currency!r}")
    with engine.begin() as conn:
        return int(conn.execute(text(
            "INSERT INTO account (kind, currency, customer_id) VALUES ('CUSTOMER', :c, :cust) "
            "RETURNING id"), {"c": currency, "cust": customer_id}).scalar_one())


def balance(engine: Engine, account_id: int) -> Decimal:
    """The account's balance now."""
    with engine.connect() as conn:
        value = conn.execute(text("SELECT balance FROM account WHERE id = :id"),
                             {"id": account_id}).scalar()
    if value is None:
        raise AccountNotFound(f"no account {account_id}")
    return Decimal(value)


def deposit(engine: Engine, account_id: int, amount: Decimal, *,
            idempotency_key: str | None = None) -> Receipt:
    """Add `amount` to a customer account, with a balanced DEPOSIT entry."""
    amount = money(amount)
    request = {"op": "deposit", "account_id": account_id, "amount": canonical(amount)}
    with engine.connect() as conn:
        currency = _customer_currency(conn, account_id)
    clearing = system_account(engine, "deposits", currency)
    with engine.begin() as conn:
        if idempotency_key is not None:
            stored = claim_key(conn, idempotency_key, request)
            if stored is not None:
                return _receipt(stored)
        new_balance = conn.execute(text(
            "UPDATE account SET balance = balance + :amount, version = version + 1 "
            "WHERE id = :id AND kind = 'CUSTOMER' RETURNING balance"),
            {"id": account_id, "amount": amount}).scalar_one()
        move_system(conn, clearing, -amount)
        entry_id = post(conn, "DEPOSIT", [(account_id, amount, currency),
                                          (clearing, -amount, currency)])
        receipt = Receipt(entry_id, account_id, amount, Decimal(new_balance))
        if idempotency_key is not None:
            store_response(conn, idempotency_key, request, _receipt_json(receipt))
        return receipt


def withdraw(engine: Engine, account_id: int, amount: Decimal, *,
             idempotency_key: str | None = None) -> Receipt:
    """Take `amount` out of a customer account, or raise InsufficientFunds."""
    amount = money(amount)
    request = {"op": "withdraw", "account_id": account_id, "amount": canonical(amount)}
    with engine.connect() as conn:
        currency = _customer_currency(conn, account_id)
    clearing = system_account(engine, "deposits", currency)
    with engine.begin() as conn:
        if idempotency_key is not None:
            stored = claim_key(conn, idempotency_key, request)
            if stored is not None:
                return _receipt(stored)
        # The database decides: a concurrent UPDATE waiting on this row re-checks the WHERE
        # against the committed balance (Read Committed), so two withdrawals cannot both pass.
        new_balance = conn.execute(text(
            "UPDATE account SET balance = balance - :amount, version = version + 1 "
            "WHERE id = :id AND kind = 'CUSTOMER' AND balance >= :amount RETURNING balance"),
            {"id": account_id, "amount": amount}).scalar()
        if new_balance is None:
            raise InsufficientFunds(f"account {account_id} does not cover {amount}")
        move_system(conn, clearing, amount)
        entry_id = post(conn, "WITHDRAWAL", [(account_id, -amount, currency),
                                             (clearing, amount, currency)])
        receipt = Receipt(entry_id, account_id, amount, Decimal(new_balance))
        if idempotency_key is not None:
            store_response(conn, idempotency_key, request, _receipt_json(receipt))
        return receipt


def transfer(engine: Engine, from_account_id: int, to_account_id: int, amount: Decimal, *,
             idempotency_key: str | None = None) -> TransferReceipt:
    """Move `amount` between two customer accounts of one currency."""
    amount = money(amount)
    if from_account_id == to_account_id:
        raise ValueError("a transfer needs two different accounts")
    request = {"op": "transfer", "from": from_account_id, "to": to_account_id,
               "amount": canonical(amount)}
    with engine.begin() as conn:
        if idempotency_key is not None:
            stored = claim_key(conn, idempotency_key, request)
            if stored is not None:
                return _transfer_receipt(stored)
        # Both rows, lowest id first, whatever the direction: one global lock order.
        rows = {row.id: row for row in conn.execute(text(
            "SELECT id, kind, currency, balance FROM account WHERE id IN (:a, :b) "
            "ORDER BY id FOR NO KEY UPDATE"), {"a": from_account_id, "b": to_account_id})}
        for account_id in (from_account_id, to_account_id):
            if account_id not in rows or rows[account_id].kind != "CUSTOMER":
                raise AccountNotFound(f"no customer account {account_id}")
        source, target = rows[from_account_id], rows[to_account_id]
        if source.currency != target.currency:
            raise CurrencyMismatch(f"account {from_account_id} is in {source.currency}, "
                                   f"account {to_account_id} in {target.currency}")
        if source.balance < amount:
            raise InsufficientFunds(f"account {from_account_id} does not cover {amount}")
        update = text("UPDATE account SET balance = balance + :d, version = version + 1 "
                      "WHERE id = :id RETURNING balance")
        from_balance = conn.execute(update, {"d": -amount, "id": from_account_id}).scalar_one()
        to_balance = conn.execute(update, {"d": amount, "id": to_account_id}).scalar_one()
        entry_id = post(conn, "TRANSFER", [(from_account_id, -amount, source.currency),
                                           (to_account_id, amount, source.currency)])
        receipt = TransferReceipt(entry_id, from_account_id, to_account_id, amount,
                                  Decimal(from_balance), Decimal(to_balance))
        if idempotency_key is not None:
            store_response(conn, idempotency_key, request, _receipt_json(receipt))
        return receipt


def apply_interest(engine: Engine, account_id: int, rule: Callable[[Decimal], Decimal], *,
                   max_attempts: int = 20) -> InterestResult:
    """Credit the interest `rule(balance)` computes, with optimistic locking.

    The rule runs in Python and may be slow, so no lock or transaction is held while it
    runs: read balance and version, compute, then UPDATE ... WHERE version = :read. Zero rows
    means someone changed the account meanwhile: read again and recompute.
    """
    for _ in range(max_attempts):
        with engine.connect() as conn:
            row = conn.execute(text(
                "SELECT balance, version, currency FROM account "
                "WHERE id = :id AND kind = 'CUSTOMER'"), {"id": account_id}).first()
        if row is None:
            raise AccountNotFound(f"no customer account {account_id}")
        before = Decimal(row.balance)
        interest = rule(before)
        if not isinstance(interest, Decimal) or interest < 0:
            raise ValueError(f"the interest rule must return a Decimal >= 0, got {interest!r}")
        if interest == 0:
            return InterestResult(None, account_id, before, interest, before)
        interest = money(interest)
        clearing = system_account(engine, "interest", row.currency)
        with engine.begin() as conn:
            after = conn.execute(text(
                "UPDATE account SET balance = :after, version = version + 1 "
                "WHERE id = :id AND version = :version RETURNING balance"),
                {"after": before + interest, "id": account_id,
                 "version": row.version}).scalar()
            if after is None:
                continue  # changed since we read it: the transaction ends, nothing written
            move_system(conn, clearing, -interest)
            entry_id = post(conn, "INTEREST", [(account_id, interest, row.currency),
                                               (clearing, -interest, row.currency)])
        return InterestResult(entry_id, account_id, before, interest, Decimal(after))
    raise ConcurrentModification(
        f"account {account_id} changed under apply_interest {max_attempts} times in a row")
