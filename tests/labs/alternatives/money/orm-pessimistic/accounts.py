"""Accounts with the SQLAlchemy ORM and pessimistic row locks.

Which operation uses which lock, and why:

- deposit: SELECT ... FOR UPDATE on the customer row (then on the currency's clearing row),
  change the mapped objects, flush. Nothing is decided from an unlocked read.
- withdraw: the same lock; the balance is compared with the amount while the row is locked,
  so a second withdrawal waits and then sees the committed balance.
- transfer: SELECT ... WHERE id IN (a, b) ORDER BY id FOR UPDATE: both rows, lowest id
  first whatever the direction, so opposite transfers queue instead of deadlocking.
- apply_interest: optimistic: the ORM's version_id_col. The row is read and the session
  closed (no connection, no transaction, no lock) while the rule runs; the UPDATE carries
  `WHERE version = <read>` and a StaleDataError means read again and recompute. Every other
  write goes through the same mapper, so it bumps `version` too.
- idempotency keys: looked up before the lock and again once the lock is held (a duplicate
  queued behind the first request then finds its committed response); the key row is
  inserted at the end of the money transaction, and a unique violation on it (a duplicate on
  other rows) rolls everything back and replays.
- clearing accounts are always locked after the customer rows.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from decimal import Decimal
from typing import Any, TypeVar

from models import Account, IdempotencyKey, LedgerEntry, Posting
from sqlalchemy import Engine, select, text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session
from sqlalchemy.orm.exc import StaleDataError

R = TypeVar("R")
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


# -- helpers shared with exchange.py -------------------------------------------------------


def parse_amount(amount: Any) -> Decimal:
    if type(amount) is float:
        raise TypeError("float amounts are refused: binary floating point cannot hold cents")
    if not isinstance(amount, (Decimal, int)) or isinstance(amount, bool):
        raise TypeError(f"an amount is a Decimal, not {type(amount).__name__}")
    amount = Decimal(amount)
    if amount.is_nan() or amount.is_infinite() or amount <= 0:
        raise ValueError(f"an amount is a positive number, got {amount}")
    exact = amount.quantize(CENT)
    if exact != amount:
        raise ValueError(f"{amount} has sub-cent digits")
    return exact


def digest_of(**request: Any) -> str:
    return hashlib.sha256(json.dumps(request, sort_keys=True, default=str).encode()).hexdigest()


def prior_response(session: Session, key: str | None, digest: str) -> Any | None:
    """The stored response for `key` (None if unused); IdempotencyConflict on another
    request. A fresh statement, so after a lock wait it sees what the holder committed."""
    if key is None:
        return None
    found = session.execute(select(IdempotencyKey.request_hash, IdempotencyKey.response)
                            .where(IdempotencyKey.key == key)).first()
    if found is None:
        return None
    if found.request_hash != digest:
        raise IdempotencyConflict(f"key {key!r} belongs to another request")
    return found.response


def remember(session: Session, key: str | None, digest: str, response: Any) -> None:
    if key is not None:
        session.add(IdempotencyKey(key=key, request_hash=digest, response=response))
        session.flush()


def _key_taken(error: IntegrityError) -> bool:
    diag = getattr(error.orig, "diag", None)
    return getattr(error.orig, "sqlstate", None) == "23505" and \
        getattr(diag, "table_name", None) == "idempotency_key"


def idempotent(engine: Engine, key: str | None, digest: str,
               work: Callable[[Session], R], replay: Callable[[Any], R]) -> R:
    """Run `work` in one transaction; replay a stored response instead when there is one."""
    for _ in range(5):
        with Session(engine, expire_on_commit=False) as session:
            stored = prior_response(session, key, digest)
            session.rollback()  # nothing held while we wait for locks below
            if stored is not None:
                return replay(stored)
            try:
                with session.begin():
                    return work(session)
            except IntegrityError as error:
                if key is None or not _key_taken(error):
                    raise
                # a duplicate committed the key first: loop, and replay its response
    raise IdempotencyConflict(f"key {key!r}: the first request never finished")


class _Replay(Exception):
    def __init__(self, response: Any) -> None:
        self.response = response


def clearing_account(engine: Engine, currency: str) -> int:
    """The SYSTEM clearing account of `currency`, created on first use (own transaction)."""
    with engine.begin() as conn:
        made = conn.execute(text(
            "INSERT INTO account (kind, currency, system_purpose) VALUES ('SYSTEM', :c, "
            "'clearing') ON CONFLICT (system_purpose, currency) WHERE kind = 'SYSTEM' "
            "DO NOTHING RETURNING id"), {"c": currency}).scalar()
        if made is not None:
            return int(made)
        return int(conn.execute(text(
            "SELECT id FROM account WHERE kind = 'SYSTEM' AND system_purpose = 'clearing' "
            "AND currency = :c"), {"c": currency}).scalar_one())


def lock_accounts(session: Session, ids: Iterable[int]) -> dict[int, Account]:
    rows = session.scalars(select(Account).where(Account.id.in_(sorted(set(ids))))
                           .order_by(Account.id).with_for_update()).all()
    return {row.id: row for row in rows}


def book(session: Session, kind: str, legs: list[tuple[Account, Decimal]]) -> str:
    """A ledger entry with one posting per leg; updates the mapped balances too."""
    entry = LedgerEntry(id=uuid.uuid4(), kind=kind)
    session.add(entry)
    session.flush()
    for account, amount in legs:
        account.balance += amount
        session.add(Posting(entry_id=entry.id, account_id=account.id, amount=amount,
                            currency=account.currency))
    session.flush()
    return str(entry.id)


def _customer_currency(engine: Engine, account_id: int) -> str:
    with engine.connect() as conn:
        currency = conn.execute(text(
            "SELECT currency FROM account WHERE id = :id AND kind = 'CUSTOMER'"),
            {"id": account_id}).scalar()
    if currency is None:
        raise AccountNotFound(f"there is no customer account {account_id}")
    return str(currency)


def _jsonable(receipt: Any) -> dict[str, Any]:
    return {k: str(v) if isinstance(v, Decimal) else v for k, v in asdict(receipt).items()}


# -- the API -------------------------------------------------------------------------------


def open_account(engine: Engine, *, currency: str, customer_id: int | None = None) -> int:
    """Open a CUSTOMER account with a zero balance; returns its id."""
    if not (isinstance(currency, str) and len(currency) == 3 and currency.isalpha()
            and currency.isupper()):
        raise ValueError(f"{currency!r} is not an ISO 4217 code")
    with Session(engine) as session, session.begin():
        account = Account(kind="CUSTOMER", currency=currency, balance=Decimal("0"),
                          customer_id=customer_id)
        session.add(account)
        session.flush()
        return account.id


def balance(engine: Engine, account_id: int) -> Decimal:
    """The account's balance now (AccountNotFound if there is no such account)."""
    with Session(engine) as session:
        value = session.scalar(select(Account.balance).where(Account.id == account_id))
    if value is None:
        raise AccountNotFound(f"there is no account {account_id}")
    return value


def _single(engine: Engine, kind: str, account_id: int, amount: Any,
            idempotency_key: str | None) -> Receipt:
    value = parse_amount(amount)
    digest = digest_of(op=kind, account=account_id, amount=str(value))
    clearing_id = clearing_account(engine, _customer_currency(engine, account_id))
    sign = 1 if kind == "DEPOSIT" else -1

    def work(session: Session) -> Receipt:
        locked = lock_accounts(session, [account_id])
        customer = locked.get(account_id)
        if customer is None or customer.kind != "CUSTOMER":
            raise AccountNotFound(f"there is no customer account {account_id}")
        stored = prior_response(session, idempotency_key, digest)
        if stored is not None:  # a duplicate committed while we waited for the lock
            raise _Replay(stored)
        if sign < 0 and customer.balance < value:
            raise InsufficientFunds(f"account {account_id} holds {customer.balance}, "
                                    f"not {value}")
        clearing = lock_accounts(session, [clearing_id])[clearing_id]
        entry_id = book(session, kind, [(customer, sign * value), (clearing, -sign * value)])
        receipt = Receipt(entry_id, account_id, value, customer.balance)
        remember(session, idempotency_key, digest, _jsonable(receipt))
        return receipt

    def replay(stored: Any) -> Receipt:
        return Receipt(stored["entry_id"], int(stored["account_id"]), Decimal(stored["amount"]),
                       Decimal(stored["balance"]))

    try:
        return idempotent(engine, idempotency_key, digest, work, replay)
    except _Replay as found:
        return replay(found.response)


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
    value = parse_amount(amount)
    if from_account_id == to_account_id:
        raise ValueError("a transfer needs two different accounts")
    digest = digest_of(op="TRANSFER", source=from_account_id, target=to_account_id,
                       amount=str(value))

    def work(session: Session) -> TransferReceipt:
        locked = lock_accounts(session, [from_account_id, to_account_id])
        for account_id in (from_account_id, to_account_id):
            if account_id not in locked or locked[account_id].kind != "CUSTOMER":
                raise AccountNotFound(f"there is no customer account {account_id}")
        stored = prior_response(session, idempotency_key, digest)
        if stored is not None:
            raise _Replay(stored)
        source, target = locked[from_account_id], locked[to_account_id]
        if source.currency != target.currency:
            raise CurrencyMismatch(f"{source.currency} account to {target.currency} account")
        if source.balance < value:
            raise InsufficientFunds(f"account {from_account_id} holds {source.balance}")
        entry_id = book(session, "TRANSFER", [(source, -value), (target, value)])
        receipt = TransferReceipt(entry_id, from_account_id, to_account_id, value,
                                  source.balance, target.balance)
        remember(session, idempotency_key, digest, _jsonable(receipt))
        return receipt

    def replay(stored: Any) -> TransferReceipt:
        return TransferReceipt(stored["entry_id"], int(stored["from_account_id"]),
                               int(stored["to_account_id"]), Decimal(stored["amount"]),
                               Decimal(stored["from_balance"]), Decimal(stored["to_balance"]))

    try:
        return idempotent(engine, idempotency_key, digest, work, replay)
    except _Replay as found:
        return replay(found.response)


def apply_interest(engine: Engine, account_id: int, rule: Callable[[Decimal], Decimal], *,
                   max_attempts: int = 20) -> InterestResult:
    """Credit the interest `rule(balance)` computes (a Decimal >= 0), with optimistic locking
    (the ORM's version counter); nothing is held while the rule runs."""
    for _ in range(max_attempts):
        with Session(engine, expire_on_commit=False) as session:
            snapshot = session.scalars(select(Account).where(
                Account.id == account_id, Account.kind == "CUSTOMER")).first()
        # the session is closed: `snapshot` is detached, its connection back in the pool
        if snapshot is None:
            raise AccountNotFound(f"there is no customer account {account_id}")
        before = snapshot.balance
        interest = rule(before)
        if not isinstance(interest, Decimal) or interest < 0:
            raise ValueError(f"the rule must return a Decimal >= 0, not {interest!r}")
        if interest == 0:
            return InterestResult(None, account_id, before, interest, before)
        interest = parse_amount(interest)
        clearing_id = clearing_account(engine, snapshot.currency)
        try:
            with Session(engine, expire_on_commit=False) as session, session.begin():
                account = session.merge(snapshot, load=False)  # still at the version read
                account.balance = before + interest
                session.flush()  # UPDATE ... WHERE id = :id AND version = :read
                clearing = lock_accounts(session, [clearing_id])[clearing_id]
                clearing.balance -= interest
                entry = LedgerEntry(id=uuid.uuid4(), kind="INTEREST")
                session.add(entry)
                session.flush()
                session.add_all([
                    Posting(entry_id=entry.id, account_id=account_id, amount=interest,
                            currency=snapshot.currency),
                    Posting(entry_id=entry.id, account_id=clearing_id, amount=-interest,
                            currency=snapshot.currency)])
        except StaleDataError:
            continue  # changed since we read it: read again, recompute
        return InterestResult(str(entry.id), account_id, before, interest, before + interest)
    raise ConcurrentModification(
        f"account {account_id} changed under apply_interest {max_attempts} times in a row")
