"""Currency exchange: a quote with a time-to-live, the exchange in two short transactions
with the provider call between them, and the reconciliation job that settles what a timeout
left PENDING.

    tx 1: claim the idempotency key, use the quote, debit the source into a SYSTEM fx
          account, record the exchange PENDING; commit
    call: fx.place_order(str(exchange id), ...) with no transaction or connection held
    tx 2: FILLED -> credit the target, COMPLETED; REJECTED or not sent -> refund, FAILED;
          no answer -> nothing: it stays PENDING for reconcile()

Every time you need "now", call clock() (an aware datetime): the checks move that clock.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from accounts import MoneyError
from fx_client import FxClient
from sqlalchemy import Engine

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
    raise NotImplementedError(
        "fx.get_rate(sell, buy) with no transaction open, then INSERT the quote with "
        "expires_at = clock() + ttl_seconds and return Quote(...)")


def exchange(engine: Engine, fx: FxClient, clock: Clock, *, idempotency_key: str,
             quote_id: str, from_account_id: int, to_account_id: int,
             sell_amount: Decimal) -> ExchangeResult:
    """Sell `sell_amount` from one customer account for the quote's currency into another.

    Returns COMPLETED (target credited), FAILED (source refunded) or PENDING (the provider's
    answer is unknown; reconcile() settles it). Raises QuoteExpired, QuoteNotFound,
    QuoteAlreadyUsed, InsufficientFunds, CurrencyMismatch, AccountNotFound, ValueError (a bad
    amount) or IdempotencyConflict without moving money or sending an order. A retry with the
    same key returns the same exchange as it stands now.
    """
    raise NotImplementedError(
        "tx 1 (key, quote valid by clock(), conditional debit, PENDING row) and commit; then "
        "fx.place_order(str(exchange_id), ...) outside any transaction; then tx 2 for FILLED "
        "or REJECTED, and nothing for ProviderError")


def reconcile(engine: Engine, fx: FxClient, clock: Clock, *, older_than_seconds: float = 30.0,
              limit: int = 100) -> ReconcileReport:
    """Settle PENDING exchanges created at least `older_than_seconds` ago (by `clock`):
    ask the provider by idempotency key; FILLED completes, REJECTED or NOT_FOUND refunds, no
    answer leaves it PENDING for the next run. Safe to run in several processes at once."""
    raise NotImplementedError(
        "SELECT the old PENDING exchange ids, then for each: fx.get_order(str(id)) and settle "
        "with UPDATE exchange SET status = ... WHERE id = :id AND status = 'PENDING'")
