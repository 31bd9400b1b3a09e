"""The provider's HTTP client: urllib with an opener that hands every HTTP status back as a
response (no HTTPError for 4xx/5xx), so the only exceptions inside the breaker are real
failures: a network error, a timeout or a 5xx. A REJECTED order or an unknown key is an
answer, not a failure."""

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


class _KeepErrors(urllib.request.HTTPErrorProcessor):
    def http_response(self, request, response):  # type: ignore[no-untyped-def]
        return response

    https_response = http_response


class FxClient:
    """Calls the provider at `base_url` with `timeout` and, when given, through `breaker`
    (every request: rates, orders, status)."""

    def __init__(self, base_url: str, *, timeout: float = DEFAULT_TIMEOUT,
                 breaker: CircuitBreaker | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.breaker = breaker
        self._opener = urllib.request.build_opener(_KeepErrors)

    def _exchange(self, method: str, path: str, body: bytes | None,
                  headers: dict[str, str]) -> tuple[int, Any]:
        request = urllib.request.Request(self.base_url + path, data=body, method=method,
                                         headers={"Accept": "application/json", **headers})
        try:
            with self._opener.open(request, timeout=self.timeout) as response:
                status, raw = response.status, response.read()
        except (TimeoutError, http.client.HTTPException, OSError) as error:
            reason = error.reason if isinstance(error, urllib.error.URLError) else error
            if isinstance(reason, TimeoutError):
                raise ProviderTimeout(f"{method} {path}: timed out after {self.timeout} s") \
                    from error
            raise ProviderError(f"{method} {path}: {reason!r}") from error
        if status >= 500:
            raise ProviderError(f"{method} {path}: HTTP {status}")
        try:
            return status, json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as error:
            raise ProviderError(f"{method} {path}: HTTP {status} with a body that is not "
                                "JSON") from error

    def _send(self, method: str, path: str, body: bytes | None = None,
              headers: dict[str, str] | None = None) -> tuple[int, Any]:
        def attempt() -> tuple[int, Any]:
            return self._exchange(method, path, body, headers or {})
        return self.breaker.call(attempt) if self.breaker is not None else attempt()

    def get_rate(self, sell_currency: str, buy_currency: str) -> Decimal:
        """The provider's current rate: how much `buy_currency` one unit of `sell_currency`
        buys (GET /v1/rates?sell=USD&buy=EUR)."""
        status, answer = self._send(
            "GET", "/v1/rates?" + urllib.parse.urlencode({"sell": sell_currency,
                                                          "buy": buy_currency}))
        if status != 200 or not isinstance(answer, dict) or not isinstance(answer.get("rate"), str):
            raise ProviderError(f"no usable rate: HTTP {status} {answer!r}")
        return Decimal(answer["rate"])

    def place_order(self, key: str, *, sell_currency: str, buy_currency: str,
                    sell_amount: Decimal, rate: Decimal) -> OrderResult:
        """Ask the provider to convert; `key` is its Idempotency-Key (the exchange id)."""
        body = json.dumps({"sell_currency": sell_currency, "buy_currency": buy_currency,
                           "sell_amount": format(sell_amount, "f"),
                           "rate": format(rate, "f")}).encode()
        status, answer = self._send("POST", "/v1/orders", body,
                                    {"Content-Type": "application/json", "Idempotency-Key": key})
        return self._result(status, answer)

    def get_order(self, key: str) -> OrderResult:
        """What the provider did with the order `key`: FILLED, REJECTED or NOT_FOUND."""
        status, answer = self._send("GET", "/v1/orders/" + urllib.parse.quote(key, safe=""))
        return self._result(status, answer)

    @staticmethod
    def _result(status: int, answer: Any) -> OrderResult:
        kind = answer.get("status") if isinstance(answer, dict) else None
        if status == 200 and kind == "FILLED":
            return OrderResult("FILLED", answer.get("order_id"), Decimal(answer["bought_amount"]))
        if status == 422 and kind == "REJECTED":
            return OrderResult("REJECTED", reason=answer.get("reason"))
        if status == 404 and kind == "NOT_FOUND":
            return OrderResult("NOT_FOUND")
        raise ProviderError(f"an answer we cannot act on: HTTP {status} {answer!r}")
