"""Currency exchange: a quote with a time-to-live, the exchange in two short transactions
with the provider call between them, and the reconciliation job that settles what a timeout
left PENDING.

    tx 1: claim the idempotency key, use the quote, debit the source into fx clearing,
          record the exchange PENDING; commit (the connection goes back to the pool)
    call: provider.place_order(key = exchange id), with a timeout and the breaker
    tx 2: FILLED -> credit the target, COMPLETED; REJECTED or not sent -> refund, FAILED;
          no answer -> nothing: it stays PENDING for reconcile()
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import ROUND_HALF_EVEN, Decimal

from accounts import (
    CENT,
    AccountNotFound,
    CurrencyMismatch,
    InsufficientFunds,
    MoneyError,
    canonical,
    claim_key,
    money,
    move_system,
    post,
    store_response,
    system_account,
)
from breaker import CircuitOpen
from fx_client import FxClient, OrderResult, ProviderError
from sqlalchemy import Connection, Engine, text

Clock = Callable[[], datetime]


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


def create_quote(engine: Engine, fx: FxClient, clock: Clock, *, sell_currency: str,
                 buy_currency: str, ttl_seconds: float = 30.0) -> Quote:
    """Fetch the provider's rate and store it as a quote that expires `ttl_seconds` after
    `clock()`."""
    rate = fx.get_rate(sell_currency, buy_currency)  # no transaction is open during the call
    now = clock()
    quote = Quote(str(uuid.uuid4()), sell_currency, buy_currency, rate,
                  now + timedelta(seconds=ttl_seconds))
    with engine.begin() as conn:
        conn.execute(text(
            "INSERT INTO quote (id, sell_currency, buy_currency, rate, created_at, expires_at) "
            "VALUES (:id, :sell, :buy, :rate, :now, :expires)"),
            {"id": quote.id, "sell": sell_currency, "buy": buy_currency, "rate": rate,
             "now": now, "expires": quote.expires_at})
    return quote


def _result(conn: Connection, exchange_id: str) -> ExchangeResult:
    row = conn.execute(text(
        "SELECT id, status, sell_amount, buy_amount, failure_reason FROM exchange "
        "WHERE id = :id"), {"id": exchange_id}).one()
    return ExchangeResult(str(row.id), row.status, Decimal(row.sell_amount),
                          Decimal(row.buy_amount), row.failure_reason)


def _start(engine: Engine, clock: Clock, *, idempotency_key: str, quote_id: str,
           from_account_id: int, to_account_id: int, sell_amount: Decimal
           ) -> tuple[ExchangeResult, dict[str, str] | None]:
    """Tx 1. Returns the exchange and, when this call started it, the order to place."""
    request = {"op": "exchange", "quote_id": str(quote_id), "from": from_account_id,
               "to": to_account_id, "amount": canonical(sell_amount)}
    with engine.connect() as conn:
        sell = conn.execute(text("SELECT sell_currency FROM quote WHERE id = :id"),
                            {"id": quote_id}).scalar()
    fx_sell = system_account(engine, "fx", sell) if sell is not None else None
    with engine.begin() as conn:
        stored = claim_key(conn, idempotency_key, request)
        if stored is not None:
            return _result(conn, stored["exchange_id"]), None
        now = clock()
        quote = conn.execute(text(
            "SELECT sell_currency, buy_currency, rate, expires_at, used_at FROM quote "
            "WHERE id = :id FOR UPDATE"), {"id": quote_id}).first()
        if quote is None or fx_sell is None:
            raise QuoteNotFound(f"no quote {quote_id}")
        if quote.expires_at <= now:
            raise QuoteExpired(f"quote {quote_id} expired at {quote.expires_at:%H:%M:%S}; "
                               "ask for a new one")
        if quote.used_at is not None:
            raise QuoteAlreadyUsed(f"quote {quote_id} was already used")
        accounts = {row.id: row for row in conn.execute(text(
            "SELECT id, currency FROM account WHERE id IN (:a, :b) AND kind = 'CUSTOMER'"),
            {"a": from_account_id, "b": to_account_id})}
        for account_id in (from_account_id, to_account_id):
            if account_id not in accounts:
                raise AccountNotFound(f"no customer account {account_id}")
        if (accounts[from_account_id].currency != quote.sell_currency
                or accounts[to_account_id].currency != quote.buy_currency):
            raise CurrencyMismatch(f"the quote sells {quote.sell_currency} for "
                                   f"{quote.buy_currency}")
        buy_amount = (sell_amount * quote.rate).quantize(CENT, ROUND_HALF_EVEN)
        if buy_amount <= 0:  # 0.50 JPY at 0.0067 buys 0.00 USD: a bad amount, not a CHECK error
            raise ValueError(f"{sell_amount} {quote.sell_currency} buys less than a cent of "
                             f"{quote.buy_currency} at {quote.rate}")
        debited = conn.execute(text(
            "UPDATE account SET balance = balance - :amount, version = version + 1 "
            "WHERE id = :id AND balance >= :amount RETURNING balance"),
            {"id": from_account_id, "amount": sell_amount}).scalar()
        if debited is None:
            raise InsufficientFunds(f"account {from_account_id} does not cover {sell_amount}")
        move_system(conn, fx_sell, sell_amount)
        debit_entry = post(conn, "EXCHANGE_DEBIT", [
            (from_account_id, -sell_amount, quote.sell_currency),
            (fx_sell, sell_amount, quote.sell_currency)])
        exchange_id = str(uuid.uuid4())
        conn.execute(text(
            "INSERT INTO exchange (id, quote_id, from_account_id, to_account_id, "
            "sell_currency, sell_amount, buy_currency, buy_amount, debit_entry_id, created_at) "
            "VALUES (:id, :q, :src, :dst, :sell, :amount, :buy, :buy_amount, :entry, :now)"),
            {"id": exchange_id, "q": quote_id, "src": from_account_id, "dst": to_account_id,
             "sell": quote.sell_currency, "amount": sell_amount, "buy": quote.buy_currency,
             "buy_amount": buy_amount, "entry": debit_entry, "now": now})
        conn.execute(text("UPDATE quote SET used_at = :now WHERE id = :id"),
                     {"now": now, "id": quote_id})
        store_response(conn, idempotency_key, request, {"exchange_id": exchange_id})
        order = {"sell_currency": quote.sell_currency, "buy_currency": quote.buy_currency,
                 "sell_amount": canonical(sell_amount), "rate": format(quote.rate, "f")}
        return ExchangeResult(exchange_id, "PENDING", sell_amount, buy_amount), order


def finish(engine: Engine, clock: Clock, exchange_id: str, outcome: OrderResult | None,
           reason: str = "", *, skip_locked: bool = False) -> ExchangeResult:
    """Tx 2: complete (FILLED) or refund (REJECTED, NOT_FOUND, None = not sent) a PENDING
    exchange. Conditional on status = 'PENDING', so the online path and any number of
    reconcilers settle each exchange exactly once."""
    filled = outcome is not None and outcome.status == "FILLED"
    with engine.begin() as conn:
        if skip_locked and conn.execute(text(
                "SELECT 1 FROM exchange WHERE id = :id AND status = 'PENDING' "
                "FOR UPDATE SKIP LOCKED"), {"id": exchange_id}).first() is None:
            return _result(conn, exchange_id)  # settled, or being settled by someone else
        row = conn.execute(text(
            "UPDATE exchange SET status = :status, finished_at = :now, "
            "provider_order_id = :order_id, failure_reason = :reason, "
            "buy_amount = coalesce(:bought, buy_amount) "
            "WHERE id = :id AND status = 'PENDING' "
            "RETURNING from_account_id, to_account_id, sell_currency, sell_amount, "
            "buy_currency, buy_amount, debit_entry_id"),
            {"status": "COMPLETED" if filled else "FAILED", "now": clock(), "id": exchange_id,
             "order_id": outcome.order_id if outcome else None,
             "reason": None if filled else (reason or (outcome.reason if outcome else None)
                                            or (outcome.status if outcome else "not sent")),
             "bought": outcome.bought_amount if filled and outcome else None}).first()
        if row is None:
            return _result(conn, exchange_id)  # someone else settled it: do nothing twice
        if filled:
            fx_buy = system_account(conn, "fx", row.buy_currency)
            amount = Decimal(row.buy_amount)
            conn.execute(text("UPDATE account SET balance = balance + :a, version = version + 1"
                              " WHERE id = :id"), {"a": amount, "id": row.to_account_id})
            move_system(conn, fx_buy, -amount)
            post(conn, "EXCHANGE_CREDIT", [(row.to_account_id, amount, row.buy_currency),
                                           (fx_buy, -amount, row.buy_currency)])
        else:
            fx_sell = system_account(conn, "fx", row.sell_currency)
            amount = Decimal(row.sell_amount)
            conn.execute(text("UPDATE account SET balance = balance + :a, version = version + 1"
                              " WHERE id = :id"), {"a": amount, "id": row.from_account_id})
            move_system(conn, fx_sell, -amount)
            post(conn, "REVERSAL", [(row.from_account_id, amount, row.sell_currency),
                                    (fx_sell, -amount, row.sell_currency)],
                 reverses=str(row.debit_entry_id))
        return _result(conn, exchange_id)


def exchange(engine: Engine, fx: FxClient, clock: Clock, *, idempotency_key: str,
             quote_id: str, from_account_id: int, to_account_id: int,
             sell_amount: Decimal) -> ExchangeResult:
    """Sell `sell_amount` from one customer account for the quote's currency into another.

    Returns COMPLETED (target credited), FAILED (source refunded) or PENDING (the provider's
    answer is unknown; reconcile() settles it). A retry with the same key returns the same
    exchange as it stands now, without debiting or ordering again.
    """
    sell_amount = money(sell_amount)
    try:
        uuid.UUID(str(quote_id))
    except ValueError:  # not a quote id at all; the uuid column would raise DataError
        raise QuoteNotFound(f"no quote {quote_id}") from None
    started, order = _start(engine, clock, idempotency_key=idempotency_key,
                            quote_id=quote_id, from_account_id=from_account_id,
                            to_account_id=to_account_id, sell_amount=sell_amount)
    if order is None:
        return started
    # Outside any transaction and connection: the provider may take seconds.
    try:
        outcome = fx.place_order(started.exchange_id, sell_currency=order["sell_currency"],
                                 buy_currency=order["buy_currency"], sell_amount=sell_amount,
                                 rate=Decimal(order["rate"]))
    except CircuitOpen:
        return finish(engine, clock, started.exchange_id, None, "circuit open: not sent")
    except ProviderError:
        return started  # unknown: it may have converted. Stay PENDING, let reconcile decide.
    return finish(engine, clock, started.exchange_id, outcome)


def reconcile(engine: Engine, fx: FxClient, clock: Clock, *, older_than_seconds: float = 30.0,
              limit: int = 100) -> ReconcileReport:
    """Settle PENDING exchanges created at least `older_than_seconds` ago (by `clock`):
    ask the provider by idempotency key; FILLED completes, REJECTED or NOT_FOUND refunds, no
    answer leaves it PENDING for the next run."""
    cutoff = clock() - timedelta(seconds=older_than_seconds)
    with engine.connect() as conn:
        pending = [str(i) for i in conn.execute(text(
            "SELECT id FROM exchange WHERE status = 'PENDING' AND created_at <= :cutoff "
            "ORDER BY created_at LIMIT :limit"), {"cutoff": cutoff, "limit": limit}).scalars()]
    completed = failed = still_pending = 0
    for exchange_id in pending:
        try:
            outcome = fx.get_order(exchange_id)  # no transaction open while we ask
        except (ProviderError, CircuitOpen):
            still_pending += 1  # still unknown: never a refund on a guess
            continue
        try:
            result = finish(engine, clock, exchange_id, outcome, skip_locked=True)
        except Exception:  # booking failed (a refused COMMIT, say): PENDING for the next run
            still_pending += 1
            continue
        if result.status == "COMPLETED":
            completed += 1
        elif result.status == "FAILED":
            failed += 1
        else:
            still_pending += 1
    return ReconcileReport(completed, failed, still_pending)
