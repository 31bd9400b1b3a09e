"""Currency exchange (ORM): tx 1 records the exchange PENDING with the source debited, the
provider is called with no session open, tx 2 settles it under the exchange row's lock.
Reconcilers take a short lease on the PENDING rows they are about to ask the provider about
(UPDATE ... FOR UPDATE SKIP LOCKED, committed at once), so concurrent reconcilers ask about
different exchanges; the settlement itself is guarded by status = 'PENDING' under a row
lock, so the online path and the reconcilers settle each exchange exactly once."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import ROUND_HALF_EVEN, Decimal
from typing import Any

from accounts import (
    CENT,
    AccountNotFound,
    CurrencyMismatch,
    InsufficientFunds,
    MoneyError,
    _Replay,
    book,
    clearing_account,
    digest_of,
    idempotent,
    lock_accounts,
    parse_amount,
    prior_response,
    remember,
)
from breaker import CircuitOpen
from fx_client import FxClient, OrderResult, ProviderError
from models import Account, ExchangeRow, QuoteRow
from sqlalchemy import Engine, or_, select, update
from sqlalchemy.orm import Session

Clock = Callable[[], datetime]
LEASE = timedelta(seconds=60)


class QuoteExpired(MoneyError):
    """The quote's time-to-live has passed; ask for a new one."""


class QuoteNotFound(MoneyError):
    """No quote with that id."""


class QuoteAlreadyUsed(MoneyError):
    """The quote was used by another exchange; a quote is good for one exchange."""


@dataclass(frozen=True)
class Quote:
    id: str
    sell_currency: str
    buy_currency: str
    rate: Decimal
    expires_at: datetime


@dataclass(frozen=True)
class ExchangeResult:
    """Where an exchange stands: PENDING, COMPLETED or FAILED."""

    exchange_id: str
    status: str
    sell_amount: Decimal
    buy_amount: Decimal
    reason: str | None = None


@dataclass(frozen=True)
class ReconcileReport:
    completed: int = 0
    failed: int = 0
    still_pending: int = 0


def _result(row: ExchangeRow) -> ExchangeResult:
    return ExchangeResult(str(row.id), row.status, row.sell_amount, row.buy_amount, row.failure)


def create_quote(engine: Engine, fx: FxClient, clock: Clock, *, sell_currency: str,
                 buy_currency: str, ttl_seconds: float = 30.0) -> Quote:
    """Fetch the provider's rate and store it as a quote that expires `ttl_seconds` after
    `clock()`."""
    rate = fx.get_rate(sell_currency, buy_currency)
    quote = Quote(str(uuid.uuid4()), sell_currency, buy_currency, rate,
                  clock() + timedelta(seconds=ttl_seconds))
    with Session(engine) as session, session.begin():
        session.add(QuoteRow(id=uuid.UUID(quote.id), sell_currency=sell_currency,
                             buy_currency=buy_currency, rate=rate, expires_at=quote.expires_at))
    return quote


def _open(engine: Engine, clock: Clock, key: str, quote_id: uuid.UUID, source_id: int,
          target_id: int, amount: Decimal) -> tuple[ExchangeResult, bool]:
    """Tx 1; returns the exchange and whether this call created it."""
    digest = digest_of(op="EXCHANGE", quote=str(quote_id), source=source_id, target=target_id,
                       amount=str(amount))
    with Session(engine) as session:
        sell = session.scalar(select(QuoteRow.sell_currency).where(QuoteRow.id == quote_id))
    clearing_id = clearing_account(engine, sell) if sell is not None else None

    def work(session: Session) -> tuple[ExchangeResult, bool]:
        quote = session.get(QuoteRow, quote_id, with_for_update=True)
        stored = prior_response(session, key, digest)
        if stored is not None:
            raise _Replay(stored)
        if quote is None or clearing_id is None:
            raise QuoteNotFound(f"no quote {quote_id}")
        now = clock()
        if now >= quote.expires_at:
            raise QuoteExpired(f"quote {quote_id} expired at {quote.expires_at.isoformat()}")
        if quote.consumed_by is not None:
            raise QuoteAlreadyUsed(f"quote {quote_id} was used by exchange {quote.consumed_by}")
        source = lock_accounts(session, [source_id]).get(source_id)
        target = session.get(Account, target_id)
        for account_id, account in ((source_id, source), (target_id, target)):
            if account is None or account.kind != "CUSTOMER":
                raise AccountNotFound(f"there is no customer account {account_id}")
        assert source is not None and target is not None
        if source.currency != quote.sell_currency or target.currency != quote.buy_currency:
            raise CurrencyMismatch(f"the quote sells {quote.sell_currency} for "
                                   f"{quote.buy_currency}")
        if source.balance < amount:
            raise InsufficientFunds(f"account {source_id} holds {source.balance}")
        clearing = lock_accounts(session, [clearing_id])[clearing_id]
        book(session, "FX_DEBIT", [(source, -amount), (clearing, amount)])
        row = ExchangeRow(id=uuid.uuid4(), quote_id=quote_id, from_account_id=source_id,
                          to_account_id=target_id, sell_currency=quote.sell_currency,
                          buy_currency=quote.buy_currency, rate=quote.rate, sell_amount=amount,
                          buy_amount=(amount * quote.rate).quantize(CENT, ROUND_HALF_EVEN),
                          status="PENDING", created_at=now)
        session.add(row)
        quote.consumed_by = row.id
        remember(session, key, digest, {"exchange_id": str(row.id)})
        return _result(row), True

    def replay(stored: Any) -> tuple[ExchangeResult, bool]:
        with Session(engine) as session:
            return _result(session.get_one(ExchangeRow, uuid.UUID(stored["exchange_id"]))), False

    try:
        return idempotent(engine, key, digest, work, replay)
    except _Replay as found:
        return replay(found.response)


def _settle(engine: Engine, clock: Clock, exchange_id: str, outcome: OrderResult | None,
            why: str | None = None) -> tuple[ExchangeResult, bool]:
    """Tx 2 (FILLED: credit; REJECTED / NOT_FOUND / not sent: refund). Returns the exchange
    and whether this call settled it."""
    filled = outcome is not None and outcome.status == "FILLED"
    with Session(engine) as session:
        currencies = session.execute(select(ExchangeRow.sell_currency, ExchangeRow.buy_currency)
                                     .where(ExchangeRow.id == uuid.UUID(exchange_id))).one()
    clearing_id = clearing_account(engine, currencies.buy_currency if filled
                                   else currencies.sell_currency)
    with Session(engine, expire_on_commit=False) as session, session.begin():
        row = session.get_one(ExchangeRow, uuid.UUID(exchange_id), with_for_update=True)
        if row.status != "PENDING":
            return _result(row), False
        if filled:
            assert outcome is not None
            if outcome.bought_amount is not None:
                row.buy_amount = outcome.bought_amount
            target = lock_accounts(session, [row.to_account_id])[row.to_account_id]
            clearing = lock_accounts(session, [clearing_id])[clearing_id]
            book(session, "FX_CREDIT", [(target, row.buy_amount), (clearing, -row.buy_amount)])
            row.status, row.order_ref = "COMPLETED", outcome.order_id
        else:
            source = lock_accounts(session, [row.from_account_id])[row.from_account_id]
            clearing = lock_accounts(session, [clearing_id])[clearing_id]
            book(session, "FX_REFUND", [(source, row.sell_amount), (clearing, -row.sell_amount)])
            row.status = "FAILED"
            row.failure = why or (outcome.reason if outcome else None) or \
                (outcome.status if outcome else "not sent")
        row.lease_until = None
        return _result(row), True


def exchange(engine: Engine, fx: FxClient, clock: Clock, *, idempotency_key: str,
             quote_id: str, from_account_id: int, to_account_id: int,
             sell_amount: Decimal) -> ExchangeResult:
    """Sell `sell_amount` from one customer account for the quote's currency into another."""
    amount = parse_amount(sell_amount)
    try:
        quote_uuid = uuid.UUID(str(quote_id))
    except ValueError:
        raise QuoteNotFound(f"{quote_id!r} is not a quote id") from None
    started, created = _open(engine, clock, idempotency_key, quote_uuid, from_account_id,
                             to_account_id, amount)
    if not created:
        return started
    with Session(engine) as session:
        row = session.get_one(ExchangeRow, uuid.UUID(started.exchange_id))
        order = (row.sell_currency, row.buy_currency, row.rate)
    try:
        answer = fx.place_order(started.exchange_id, sell_currency=order[0],
                                buy_currency=order[1], sell_amount=amount, rate=order[2])
    except CircuitOpen:
        return _settle(engine, clock, started.exchange_id, None, "circuit open: not sent")[0]
    except ProviderError:
        return started  # the provider may or may not have converted: reconcile() finds out
    return _settle(engine, clock, started.exchange_id, answer)[0]


def reconcile(engine: Engine, fx: FxClient, clock: Clock, *, older_than_seconds: float = 30.0,
              limit: int = 100) -> ReconcileReport:
    """Settle PENDING exchanges created at least `older_than_seconds` ago (by `clock`)."""
    now = clock()
    claim = (select(ExchangeRow.id)
             .where(ExchangeRow.status == "PENDING",
                    ExchangeRow.created_at <= now - timedelta(seconds=older_than_seconds),
                    or_(ExchangeRow.lease_until.is_(None), ExchangeRow.lease_until <= now))
             .order_by(ExchangeRow.created_at).limit(limit)
             .with_for_update(skip_locked=True))
    with engine.begin() as conn:
        leased = [str(i) for i in conn.execute(
            update(ExchangeRow).where(ExchangeRow.id.in_(claim.scalar_subquery()))
            .values(lease_until=now + LEASE).returning(ExchangeRow.id)).scalars()]
    completed = failed = pending = 0
    for exchange_id in leased:
        try:
            answer = fx.get_order(exchange_id)
            result, by_us = _settle(engine, clock, exchange_id, answer)
        except Exception:  # no answer, or its booking failed: still unknown here
            pending += 1
            with engine.begin() as conn:  # give it back to the next run at once
                conn.execute(update(ExchangeRow)
                             .where(ExchangeRow.id == uuid.UUID(exchange_id),
                                    ExchangeRow.status == "PENDING")
                             .values(lease_until=None))
            continue
        if by_us:
            completed += result.status == "COMPLETED"
            failed += result.status == "FAILED"
    return ReconcileReport(completed, failed, pending)
