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
            status, raw = _fetch(request, self.timeout)
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
        except http.client.HTTPException as error:  # a body cut short, a garbled status line
            raise ProviderError(f"{method} {path}: {type(error).__name__}: {error}") from error
        if status >= 500:
            raise ProviderError(f"{method} {path}: the provider answered {status}")
        try:
            payload = json.loads(raw or b"{}")
        except ValueError as error:
            raise ProviderError(f"{method} {path}: unreadable answer {raw[:80]!r}") from error
        if not isinstance(payload, dict):
            raise ProviderError(f"{method} {path}: unreadable answer {raw[:80]!r}")
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
        rate = _decimal(payload, "rate")
        if not rate.is_finite() or rate <= 0:  # "0" or "NaN" is no price to quote
            raise ProviderError(f"unusable rate for {sell_currency}->{buy_currency}: {payload}")
        return rate

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

    @staticmethod
    def _order(status: int, payload: dict[str, Any]) -> OrderResult:
        state = payload.get("status")
        if state == "FILLED":
            return OrderResult("FILLED", order_id=payload.get("order_id"),
                               bought_amount=_decimal(payload, "bought_amount"))
        if state in ("REJECTED", "NOT_FOUND"):
            return OrderResult(state, reason=payload.get("reason"))
        # 409 (the key is in use for another order), 400, anything unexpected: we do not
        # know what happened, so we do not act on it
        raise ProviderError(f"unexpected answer {status}: {payload}")


class _KeepErrorResponses(urllib.request.HTTPErrorProcessor):
    """Return every answer, whatever its status, as a response to read like a 200."""

    def http_response(self, request, response):  # type: ignore[no-untyped-def]
        return response

    https_response = http_response


_OPENER = urllib.request.build_opener(_KeepErrorResponses)


def _fetch(request: urllib.request.Request, timeout: float) -> tuple[int, bytes]:
    with _OPENER.open(request, timeout=timeout) as response:
        return response.status, response.read()


def _fetch_old(request: urllib.request.Request, timeout: float) -> tuple[int, bytes]:
    """The status and the body of an answer, a 4xx or 5xx as well as a 200. urlopen raises
    an error status as HTTPError before its body is read, and that read can time out or be
    cut short like any other: it happens here, inside the caller's try, not in its handler."""
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        with error:
            return error.code, error.read()


def _decimal(payload: dict[str, Any], field: str) -> Decimal:
    """A decimal-string field of an answer; a missing or malformed one is no usable answer."""
    try:
        return Decimal(str(payload[field]))
    except (KeyError, ArithmeticError) as error:  # InvalidOperation is an ArithmeticError
        raise ProviderError(f"unusable {field} in {payload}") from error
