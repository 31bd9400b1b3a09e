"""The HTTP client of the exchange-rate provider (its API is in the lab README).

Use the standard library (urllib.request) with a timeout on every request. Sort each answer
into what the caller can act on:

- an OrderResult: FILLED or REJECTED (the provider answered, and we know what it did), or
  NOT_FOUND from get_order (it never executed that key and now never will);
- ProviderError: no usable answer (timeout, reset, 5xx, garbage). The order may or may not
  have executed: the caller must not guess;
- breaker.CircuitOpen (raised by the breaker): nothing was sent.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

from breaker import CircuitBreaker

DEFAULT_TIMEOUT = 2.0  # seconds, for connecting and for each read


class ProviderError(Exception):
    """No usable answer from the provider: the outcome of the request is unknown."""


class ProviderTimeout(ProviderError):
    """The provider did not answer within the timeout."""


@dataclass(frozen=True)
class OrderResult:
    """The provider's answer about one order (by its idempotency key)."""

    status: str  # FILLED | REJECTED | NOT_FOUND
    order_id: str | None = None
    bought_amount: Decimal | None = None
    reason: str | None = None


class FxClient:
    """Calls the provider at `base_url` with `timeout` and, when given, through `breaker`
    (every request: rates, orders, status)."""

    def __init__(self, base_url: str, *, timeout: float = DEFAULT_TIMEOUT,
                 breaker: CircuitBreaker | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.breaker = breaker

    def get_rate(self, sell_currency: str, buy_currency: str) -> Decimal:
        """The provider's current rate: how much `buy_currency` one unit of `sell_currency`
        buys (GET /v1/rates?sell=USD&buy=EUR)."""
        raise NotImplementedError(
            "GET {base_url}/v1/rates?sell=..&buy=.. with urllib.request.urlopen(request, "
            "timeout=self.timeout) and return Decimal(answer['rate'])")

    def place_order(self, key: str, *, sell_currency: str, buy_currency: str,
                    sell_amount: Decimal, rate: Decimal) -> OrderResult:
        """Ask the provider to convert; `key` is its Idempotency-Key (the exchange id), so a
        resend returns the first answer instead of converting twice."""
        raise NotImplementedError(
            "POST /v1/orders with header Idempotency-Key: key and a JSON body whose amounts "
            "are strings; 200 FILLED and 422 REJECTED become an OrderResult, anything else "
            "(timeout, reset, 5xx, 409) raises ProviderError")

    def get_order(self, key: str) -> OrderResult:
        """What the provider did with the order `key`: FILLED, REJECTED or NOT_FOUND."""
        raise NotImplementedError(
            "GET /v1/orders/<key>: 200 FILLED / 422 REJECTED / 404 NOT_FOUND become an "
            "OrderResult; no usable answer raises ProviderError")
