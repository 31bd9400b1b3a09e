"""The HTTP client of the exchange-rate provider (its API is in the lab README).

Every call has a timeout and, when a breaker is given, goes through it. The client sorts
each answer into what the caller can act on:

- an OrderResult: FILLED or REJECTED (the provider answered, and we know what it did), or
  NOT_FOUND from get_order (it never executed that key and now never will);
- ProviderError: no usable answer (timeout, reset, 5xx, garbage). The order may or may not
  have executed: the caller must not guess;
- breaker.CircuitOpen: nothing was sent.
"""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

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
    """Calls the provider at `base_url` with `timeout` and, optionally, a circuit breaker."""

    def __init__(self, base_url: str, *, timeout: float = DEFAULT_TIMEOUT,
                 breaker: CircuitBreaker | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.breaker = breaker

    def _request(self, method: str, path: str, *, body: dict[str, Any] | None = None,
                 headers: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(
            self.base_url + path, data=data, method=method,
            headers={"Content-Type": "application/json", "Accept": "application/json",
                     **(headers or {})})
        try:
            try:
                with urllib.request.urlopen(request, timeout=self.timeout) as response:
                    status, raw = response.status, response.read()
            except urllib.error.HTTPError as error:  # a 4xx: its body is read here, inside
                status, raw = error.code, error.read()  # the try that wraps read errors
        except TimeoutError as error:
            raise ProviderTimeout(f"{method} {path}: no answer within {self.timeout} s") \
                from error
        except urllib.error.URLError as error:
            if isinstance(error.reason, TimeoutError):
                raise ProviderTimeout(f"{method} {path}: no answer within {self.timeout} s") \
                    from error
            raise ProviderError(f"{method} {path}: {error.reason}") from error
        except OSError as error:  # reset, refused, broken pipe, RemoteDisconnected
            raise ProviderError(f"{method} {path}: {error}") from error
        except http.client.HTTPException as error:  # a body cut short (IncompleteRead)
            raise ProviderError(f"{method} {path}: {type(error).__name__}: {error}") from error
        if status >= 500:
            raise ProviderError(f"{method} {path}: the provider answered {status}")
        try:
            payload = json.loads(raw or b"{}")
        except ValueError as error:
            raise ProviderError(f"{method} {path}: unreadable answer {raw[:80]!r}") from error
        return status, payload

    def _call(self, method: str, path: str, **kwargs: Any) -> tuple[int, dict[str, Any]]:
        if self.breaker is None:
            return self._request(method, path, **kwargs)
        return self.breaker.call(lambda: self._request(method, path, **kwargs))

    def get_rate(self, sell_currency: str, buy_currency: str) -> Decimal:
        """The provider's current rate: how much `buy_currency` one unit of `sell_currency`
        buys."""
        query = urllib.parse.urlencode({"sell": sell_currency, "buy": buy_currency})
        status, payload = self._call("GET", f"/v1/rates?{query}")
        if status != 200 or "rate" not in payload:
            raise ProviderError(f"no rate for {sell_currency}->{buy_currency}: {payload}")
        return Decimal(payload["rate"])

    def place_order(self, key: str, *, sell_currency: str, buy_currency: str,
                    sell_amount: Decimal, rate: Decimal) -> OrderResult:
        """Ask the provider to convert; `key` is its Idempotency-Key (the exchange id), so a
        resend returns the first answer instead of converting twice."""
        body = {"sell_currency": sell_currency, "buy_currency": buy_currency,
                "sell_amount": format(sell_amount, "f"), "rate": format(rate, "f")}
        status, payload = self._call("POST", "/v1/orders", body=body,
                                     headers={"Idempotency-Key": key})
        return self._order(status, payload)

    def get_order(self, key: str) -> OrderResult:
        """What the provider did with the order `key`: FILLED, REJECTED or NOT_FOUND."""
        status, payload = self._call("GET", f"/v1/orders/{urllib.parse.quote(key)}")
        return self._order(status, payload)

    _ANSWERS = {(200, "FILLED"), (422, "REJECTED"), (404, "NOT_FOUND")}

    @classmethod
    def _order(cls, status: int, payload: dict[str, Any]) -> OrderResult:
        state = payload.get("status")
        if (status, state) not in cls._ANSWERS:
            # 409 CONFLICT, a 200 without FILLED, anything else: the outcome is unknown
            raise ProviderError(f"unexpected answer {status}: {payload}")
        if state == "FILLED":
            return OrderResult("FILLED", order_id=payload.get("order_id"),
                               bought_amount=Decimal(str(payload["bought_amount"])))
        return OrderResult(state, reason=payload.get("reason"))
