"""Currency exchange with the provider call between two database calls:

    fx_start()   one statement: claim the key, lock and check the quote, debit the source
                 into the clearing account, record the exchange PENDING; committed
    provider     place_order(key = exchange id), nothing of ours open or checked out
    fx_settle()  one statement, guarded by status = 'PENDING': FILLED credits the target,
                 REJECTED (or not sent) refunds the source; a ProviderError settles nothing

Every "now" comes from clock(); the functions receive it as a parameter.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from accounts import MoneyError, fingerprint, refuse, validate_amount
from breaker import CircuitOpen
from fx_client import FxClient, OrderResult, ProviderError
from sqlalchemy import Engine, text

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


_QUOTE_REFUSAL = {"QUOTE_EXPIRED": QuoteExpired, "QUOTE_NOT_FOUND": QuoteNotFound,
                  "QUOTE_USED": QuoteAlreadyUsed}


def _as_result(payload: dict[str, Any]) -> ExchangeResult:
    return ExchangeResult(str(payload["exchange_id"]), payload["status"],
                          Decimal(payload["sell_amount"]), Decimal(payload["buy_amount"]),
                          payload.get("reason"))


def create_quote(engine: Engine, fx: FxClient, clock: Clock, *, sell_currency: str,
                 buy_currency: str, ttl_seconds: float = 30.0) -> Quote:
    """Fetch the provider's rate and store it as a quote that expires `ttl_seconds` after
    `clock()`."""
    rate = fx.get_rate(sell_currency, buy_currency)
    now = clock()
    expires = now + timedelta(seconds=ttl_seconds)
    with engine.begin() as conn:
        quote_id = conn.execute(text(
            "INSERT INTO quote (sell_currency, buy_currency, rate, quoted_at, expires_at) "
            "VALUES (:s, :b, :r, :now, :exp) RETURNING id"),
            {"s": sell_currency, "b": buy_currency, "r": rate, "now": now, "exp": expires}
        ).scalar_one()
    return Quote(str(quote_id), sell_currency, buy_currency, rate, expires)


def _settle(engine: Engine, clock: Clock, exchange_id: str, result: str,
            outcome: OrderResult | None = None, reason: str | None = None
            ) -> tuple[ExchangeResult, bool]:
    """Settle once; also says whether this call did it (False: someone else had)."""
    with engine.begin() as conn:
        payload = conn.execute(text(
            "SELECT fx_settle(:id, :result, :bought, :ref, :reason, :now)"),
            {"id": exchange_id, "result": result,
             "bought": outcome.bought_amount if outcome else None,
             "ref": outcome.order_id if outcome else None,
             "reason": reason or (outcome.reason if outcome else None), "now": clock()}
        ).scalar_one()
    return _as_result(payload), bool(payload["settled_now"])


def exchange(engine: Engine, fx: FxClient, clock: Clock, *, idempotency_key: str,
             quote_id: str, from_account_id: int, to_account_id: int,
             sell_amount: Decimal) -> ExchangeResult:
    """Sell `sell_amount` from one customer account for the quote's currency into another."""
    amount = validate_amount(sell_amount)
    try:
        quote_uuid = str(uuid.UUID(str(quote_id)))
    except ValueError:
        raise QuoteNotFound(f"{quote_id!r} is not a quote id") from None
    digest = fingerprint("exchange", quote=quote_uuid, source=from_account_id,
                         target=to_account_id, amount=amount)
    with engine.begin() as conn:
        row = conn.execute(text(
            "SELECT * FROM fx_start(:key, :hash, :quote, :src, :dst, :amount, :now)"),
            {"key": idempotency_key, "hash": digest, "quote": quote_uuid,
             "src": from_account_id, "dst": to_account_id, "amount": amount, "now": clock()}
        ).one()
    if row.outcome in _QUOTE_REFUSAL:
        raise _QUOTE_REFUSAL[row.outcome](f"quote {quote_id}: {row.outcome.lower()}")
    refuse(row.outcome, f"exchange {idempotency_key!r}")
    started = _as_result(row.payload)
    if row.outcome == "REPLAY":
        return started  # the same exchange, as it stands now: no second debit, no new order
    try:
        answer = fx.place_order(started.exchange_id, sell_currency=row.payload["sell_currency"],
                                buy_currency=row.payload["buy_currency"], sell_amount=amount,
                                rate=Decimal(row.payload["rate"]))
    except CircuitOpen:
        return _settle(engine, clock, started.exchange_id, "NOT_SENT",
                       reason="circuit open: the order was not sent")[0]
    except ProviderError:
        return started  # unknown outcome: PENDING until reconcile() learns it
    return _settle(engine, clock, started.exchange_id, answer.status, answer)[0]


def reconcile(engine: Engine, fx: FxClient, clock: Clock, *, older_than_seconds: float = 30.0,
              limit: int = 100) -> ReconcileReport:
    """Settle PENDING exchanges created at least `older_than_seconds` ago (by `clock`)."""
    with engine.connect() as conn:
        candidates = [str(i) for i in conn.execute(text(
            "SELECT id FROM exchange WHERE status = 'PENDING' AND created_at <= :before "
            "ORDER BY created_at, id LIMIT :n"),
            {"before": clock() - timedelta(seconds=older_than_seconds), "n": limit}).scalars()]
    tally = {"COMPLETED": 0, "FAILED": 0, "PENDING": 0}
    for exchange_id in candidates:
        try:
            answer = fx.get_order(exchange_id)
        except (ProviderError, CircuitOpen):
            tally["PENDING"] += 1
            continue
        try:
            settled, by_us = _settle(engine, clock, exchange_id, answer.status, answer)
        except Exception:  # booking failed: PENDING for the next run, and the run goes on
            tally["PENDING"] += 1
            continue
        if by_us:  # what another reconciler settled is its own to report
            tally[settled.status] += 1
    return ReconcileReport(tally["COMPLETED"], tally["FAILED"], tally["PENDING"])
