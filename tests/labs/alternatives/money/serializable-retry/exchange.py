"""Currency exchange, SERIALIZABLE edition.

    open      (serializable) claim the key, check the quote, debit the source into the
              clearing account, insert the exchange PENDING; commit
    provider  place_order(exchange id) with no connection held
    settle    (serializable) read the exchange; if it is still PENDING, credit or refund and
              mark it. Read-then-write is safe here: two settlers that both read PENDING
              cannot both commit; the second gets 40001, retries, and finds it settled.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import ROUND_HALF_EVEN, Decimal
from typing import Any

from accounts import (
    CENT,
    CurrencyMismatch,
    InsufficientFunds,
    MoneyError,
    add_to_balance,
    amount_of,
    claim,
    clearing_account,
    customer,
    journal,
    keep,
    request_digest,
    serializable,
    write_balance,
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
    rate = fx.get_rate(sell_currency, buy_currency)
    quote = Quote(str(uuid.uuid4()), sell_currency, buy_currency, rate,
                  clock() + timedelta(seconds=ttl_seconds))
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO quote (id, pair, rate, valid_until) "
                          "VALUES (:id, :pair, :rate, :until)"),
                     {"id": quote.id, "pair": f"{sell_currency}/{buy_currency}", "rate": rate,
                      "until": quote.expires_at})
    return quote


def _load(conn: Connection, exchange_id: str) -> Any:
    return conn.execute(text("SELECT * FROM exchange WHERE id = :id"), {"id": exchange_id}).one()


def _result(row: Any) -> ExchangeResult:
    return ExchangeResult(str(row.id), row.status, row.sold, row.bought, row.note)


def exchange(engine: Engine, fx: FxClient, clock: Clock, *, idempotency_key: str,
             quote_id: str, from_account_id: int, to_account_id: int,
             sell_amount: Decimal) -> ExchangeResult:
    """Sell `sell_amount` from one customer account for the quote's currency into another."""
    amount = amount_of(sell_amount)
    try:
        quote_uuid = str(uuid.UUID(str(quote_id)))
    except ValueError:
        raise QuoteNotFound(f"no quote {quote_id!r}") from None
    digest = request_digest("EXCHANGE", quote_uuid, from_account_id, to_account_id, amount)

    def open_(conn: Connection) -> tuple[ExchangeResult, dict[str, Any] | None]:
        stored = claim(conn, idempotency_key, digest, "EXCHANGE")
        if stored is not None:
            return _result(_load(conn, stored["exchange"])), None
        now = clock()
        quote = conn.execute(text("SELECT * FROM quote WHERE id = :id"), {"id": quote_uuid}).first()
        if quote is None:
            raise QuoteNotFound(f"no quote {quote_id}")
        if now >= quote.valid_until:
            raise QuoteExpired(f"quote {quote_id} is no longer valid")
        if quote.used:
            raise QuoteAlreadyUsed(f"quote {quote_id} has been used")
        sell, buy = quote.pair.split("/")
        source, target = customer(conn, from_account_id), customer(conn, to_account_id)
        if source.currency != sell or target.currency != buy:
            raise CurrencyMismatch(f"quote {quote.pair} does not fit {source.currency} -> "
                                   f"{target.currency}")
        if source.balance < amount:
            raise InsufficientFunds(f"account {from_account_id} has {source.balance}")
        write_balance(conn, from_account_id, source.balance - amount)
        clearing = clearing_account(conn, sell)
        add_to_balance(conn, clearing, amount)
        exchange_id = str(uuid.uuid4())
        journal(conn, "EXCHANGE_OUT", [(from_account_id, -amount, sell), (clearing, amount, sell)],
                exchange=exchange_id)
        conn.execute(text("UPDATE quote SET used = true WHERE id = :id"), {"id": quote_uuid})
        quoted = (amount * quote.rate).quantize(CENT, ROUND_HALF_EVEN)
        conn.execute(text(
            "INSERT INTO exchange (id, quote_id, source_account, target_account, pair, sold, "
            "bought, started_at) VALUES (:id, :q, :s, :t, :pair, :sold, :bought, :now)"),
            {"id": exchange_id, "q": quote_uuid, "s": from_account_id, "t": to_account_id,
             "pair": quote.pair, "sold": amount, "bought": quoted, "now": now})
        keep(conn, idempotency_key, {"exchange": exchange_id})
        return (ExchangeResult(exchange_id, "PENDING", amount, quoted),
                {"sell": sell, "buy": buy, "rate": quote.rate})

    started, order = serializable(engine, open_)
    if order is None:
        return started
    try:
        answer = fx.place_order(started.exchange_id, sell_currency=order["sell"],
                                buy_currency=order["buy"], sell_amount=amount,
                                rate=order["rate"])
    except CircuitOpen:
        return settle(engine, clock, started.exchange_id, None, "not sent: circuit open")[0]
    except ProviderError:
        return started
    return settle(engine, clock, started.exchange_id, answer)[0]


def settle(engine: Engine, clock: Clock, exchange_id: str, answer: OrderResult | None,
           note: str | None = None) -> tuple[ExchangeResult, bool]:
    """Complete (FILLED) or refund (anything else) a PENDING exchange, once. Returns the
    exchange and whether this call settled it."""
    def work(conn: Connection) -> tuple[ExchangeResult, bool]:
        row = _load(conn, exchange_id)
        if row.status != "PENDING":
            return _result(row), False
        sell, buy = row.pair.split("/")
        if answer is not None and answer.status == "FILLED":
            bought = answer.bought_amount if answer.bought_amount is not None else row.bought
            add_to_balance(conn, row.target_account, bought)
            clearing = clearing_account(conn, buy)
            add_to_balance(conn, clearing, -bought)
            journal(conn, "EXCHANGE_IN", [(row.target_account, bought, buy),
                                          (clearing, -bought, buy)],
                    exchange=exchange_id, order=answer.order_id)
            conn.execute(text("UPDATE exchange SET status = 'COMPLETED', bought = :b, "
                              "settled_at = :now WHERE id = :id"),
                         {"b": bought, "now": clock(), "id": exchange_id})
        else:
            add_to_balance(conn, row.source_account, row.sold)
            clearing = clearing_account(conn, sell)
            add_to_balance(conn, clearing, -row.sold)
            journal(conn, "EXCHANGE_REFUND", [(row.source_account, row.sold, sell),
                                              (clearing, -row.sold, sell)], exchange=exchange_id)
            conn.execute(text("UPDATE exchange SET status = 'FAILED', note = :n, "
                              "settled_at = :now WHERE id = :id"),
                         {"n": note or (answer.reason or answer.status if answer else "not sent"),
                          "now": clock(), "id": exchange_id})
        return _result(_load(conn, exchange_id)), True

    return serializable(engine, work)


def reconcile(engine: Engine, fx: FxClient, clock: Clock, *, older_than_seconds: float = 30.0,
              limit: int = 100) -> ReconcileReport:
    """Settle PENDING exchanges created at least `older_than_seconds` ago (by `clock`)."""
    with engine.connect() as conn:
        waiting = [str(i) for i in conn.execute(text(
            "SELECT id FROM exchange WHERE status = 'PENDING' AND started_at <= :cutoff "
            "ORDER BY started_at LIMIT :n"),
            {"cutoff": clock() - timedelta(seconds=older_than_seconds), "n": limit}).scalars()]
    report = {"COMPLETED": 0, "FAILED": 0, "PENDING": 0}
    for exchange_id in waiting:
        try:
            answer = fx.get_order(exchange_id)
        except (ProviderError, CircuitOpen):
            report["PENDING"] += 1
            continue
        try:
            result, settled_here = settle(engine, clock, exchange_id, answer)
        except Exception:  # booking failed: PENDING for the next run, and the run goes on
            report["PENDING"] += 1
            continue
        if settled_here:
            report[result.status] += 1
    return ReconcileReport(report["COMPLETED"], report["FAILED"], report["PENDING"])
