"""The exchange-rate provider the checks run: a real HTTP server on 127.0.0.1 that can be
slow, fail, stall until released, drop the connection, or fill an order and then answer too
late. It records every request, so a check reports what the provider actually did (which
orders it converted) next to what the learner's code believes.

API (the lab README documents it for the learner):
    GET  /v1/rates?sell=USD&buy=EUR  -> 200 {"sell", "buy", "rate": "0.92000000"}
    POST /v1/orders   Idempotency-Key: <key>
         {"sell_currency", "buy_currency", "sell_amount": "100.00", "rate": "0.92"}
         -> 200 {"status": "FILLED", "order_id", "bought_amount": "92.00"}
         -> 422 {"status": "REJECTED", "reason"}
         the same key again: the first answer again (nothing converts twice);
         the same key with another body: 409 {"status": "CONFLICT"}
    GET  /v1/orders/<key> -> 200 the order's answer, or 404 {"status": "NOT_FOUND"}, which
         also voids the key: an order with it arriving later is REJECTED ("voided").
"""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.parse
from collections.abc import Collection
from dataclasses import dataclass, field
from decimal import ROUND_HALF_EVEN, Decimal, InvalidOperation
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

RATES = {("USD", "EUR"): Decimal("0.92"), ("EUR", "USD"): Decimal("1.087"),
         ("USD", "TRY"): Decimal("32.5"), ("EUR", "TRY"): Decimal("35.25"),
         ("GBP", "USD"): Decimal("1.27")}

# How POST /v1/orders behaves (`place`), and GET /v1/orders/<key> (`status`).
PLACE_MODES = {
    "fill": "converts and answers 200 FILLED",
    "reject": "refuses: 422 REJECTED (nothing converted)",
    "fail": "answers 503 without converting",
    "fill-then-fail": "converts, then answers 500 (the caller cannot tell it converted)",
    "fill-then-late": "converts, then answers only after `delay` s (after the caller's "
                      "timeout)",
    "reject-then-fail": "refuses (nothing converted), then answers 500 (the caller cannot "
                        "tell it refused)",
    "slow": "waits `delay` s, then converts and answers",
    "stall": "waits until release(), then converts and answers",
    "drop": "closes the connection without converting or answering",
    "fill-then-cut": "converts, then answers 200 with half the body its Content-Length "
                     "announces and closes the connection (IncompleteRead)",
    "fill-then-garble": "converts, then answers 200 with an HTML page instead of JSON (a "
                        "proxy's error page)",
    "reject-then-cut": "refuses, then answers 422 with half the body its Content-Length "
                       "announces and closes the connection (IncompleteRead while reading an "
                       "error's body)",
    "reject-then-stall": "refuses, then sends the 422's headers and half its body, and "
                         "nothing more for `delay` s (a timeout while reading an error's body)",
}
STATUS_MODES = {"answer": "answers", "fail": "answers 503", "slow": "answers after `delay` s",
                "stall": "waits until release(), then answers",
                "cut": "answers (a 404 NOT_FOUND or 422 REJECTED too) with half the body its "
                       "Content-Length announces and closes the connection"}
RATE_MODES = {"answer": "answers", "fail": "answers 503", "slow": "answers after `delay` s",
              "stall": "waits until release(), then answers"}


@dataclass
class Call:
    """One request the provider received, and what it did about it."""

    at: float  # seconds since the provider started
    method: str
    path: str
    key: str | None
    body: dict[str, Any] | None
    code: int = 0  # the HTTP status it answered (0: none, the connection was dropped)
    outcome: str = ""  # FILLED, REJECTED, DUPLICATE, NOT_FOUND, CONFLICT, FAILED, DROPPED, ...
    converted: bool = False  # this request executed a conversion
    answered_at: float | None = None


@dataclass
class Order:
    key: str
    body: dict[str, Any]
    status: str  # FILLED | REJECTED
    order_id: str | None = None
    bought_amount: Decimal | None = None
    reason: str | None = None

    def answer(self) -> tuple[int, dict[str, Any]]:
        if self.status == "FILLED":
            return 200, {"status": "FILLED", "order_id": self.order_id,
                         "bought_amount": format(self.bought_amount, "f")}
        return 422, {"status": "REJECTED", "reason": self.reason}


@dataclass
class _Script:
    place: str = "fill"
    status: str = "answer"
    rates: str = "answer"  # RATE_MODES
    delay: float = 2.0
    # the price a fill gets: bought_amount = sell_amount x fill_rate (None: the order's rate)
    fill_rate: Decimal | None = None
    # idempotency keys whose orders the provider answers 503 for, GET and POST alike, whatever
    # the modes above say: it fails for some exchanges and answers for the others
    failing: frozenset[str] = frozenset()
    gate: threading.Event = field(default_factory=threading.Event)


class FxProvider:
    """Start with `start()` (the fixture does), point the client at `url`, script faults with
    `script(place=..., status=..., delay=...)`, read `calls` afterwards."""

    def __init__(self) -> None:
        self.calls: list[Call] = []
        self.orders: dict[str, Order] = {}
        self.voided: set[str] = set()
        self._lock = threading.Lock()
        self._script = _Script()
        self._script.gate.set()
        self._stalled = threading.Semaphore(0)
        self._gates = [self._script.gate]
        self._started = time.monotonic()
        self._next_order = 0
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- control ----------------------------------------------------------------------------

    def start(self) -> FxProvider:
        provider = self

        class Handler(_Handler):
            owner = provider

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._server.block_on_close = False
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True,
                                        name="dojo-fx-provider", kwargs={"poll_interval": 0.05})
        self._thread.start()
        return self

    def stop(self) -> None:
        self.release()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    @property
    def url(self) -> str:
        assert self._server is not None, "start() the provider first"
        host, port = self._server.server_address[:2]
        return f"http://{host if isinstance(host, str) else host.decode()}:{port}"

    def script(self, *, place: str | None = None, status: str | None = None,
               rates: str | None = None, delay: float | None = None,
               fill_rate: Decimal | None | bool = False,
               failing: Collection[str] | None = None) -> None:
        """Change how the provider behaves from the next request on. `fill_rate` (a Decimal)
        makes fills happen at that price instead of the order's rate; None restores it.
        `failing`: the keys whose orders answer 503 (GET and POST); empty restores them."""
        with self._lock:
            stalling = False
            if place is not None:
                assert place in PLACE_MODES, place
                self._script.place = place
                stalling |= place == "stall"
            if status is not None:
                assert status in STATUS_MODES, status
                self._script.status = status
                stalling |= status == "stall"
            if rates is not None:
                assert rates in RATE_MODES, rates
                self._script.rates = rates
                stalling |= rates == "stall"
            if stalling:
                self._script.gate = threading.Event()
                self._gates.append(self._script.gate)
            if delay is not None:
                self._script.delay = delay
            if fill_rate is not False:
                assert fill_rate is None or isinstance(fill_rate, Decimal), fill_rate
                self._script.fill_rate = fill_rate
            if failing is not None:
                self._script.failing = frozenset(failing)

    def release(self) -> None:
        """Let every stalled request go on (and later ones through at once)."""
        with self._lock:
            gates = list(self._gates)
        for gate in gates:
            gate.set()

    def wait_stalled(self, count: int = 1, timeout: float = 5.0) -> bool:
        """True once `count` requests are held by a `stall` mode."""
        deadline = time.monotonic() + timeout
        for _ in range(count):
            if not self._stalled.acquire(timeout=max(0.0, deadline - time.monotonic())):
                return False
        return True

    # -- what happened ----------------------------------------------------------------------

    def requests(self, method: str = "", path: str = "") -> list[Call]:
        with self._lock:
            return [c for c in self.calls if c.method.startswith(method)
                    and c.path.startswith(path)]

    def order_requests(self) -> list[Call]:
        return self.requests("POST", "/v1/orders")

    def converted(self) -> dict[str, Order]:
        """The orders the provider executed, by idempotency key."""
        with self._lock:
            return {k: o for k, o in self.orders.items() if o.status == "FILLED"}

    def history(self, limit: int = 12) -> str:
        """The requests as a readable list for failure messages."""
        with self._lock:
            calls = list(self.calls)
        if not calls:
            return "(the provider received no request)"
        lines = []
        for c in calls[:limit]:
            key = f" key={c.key}" if c.key else ""
            answered = (f"answered {c.code} at +{c.answered_at:.2f}s" if c.answered_at
                        is not None and c.code else "no answer (connection dropped)"
                        if c.outcome == "DROPPED" else "still open")
            lines.append(f"+{c.at:6.2f}s {c.method} {c.path}{key}: {c.outcome or '?'}"
                         f"{' (converted)' if c.converted else ''}, {answered}")
        if len(calls) > limit:
            lines.append(f"… and {len(calls) - limit} more requests")
        return "\n".join(lines)

    # -- behaviour --------------------------------------------------------------------------

    def _now(self) -> float:
        return time.monotonic() - self._started

    def _record(self, call: Call) -> Call:
        with self._lock:
            self.calls.append(call)
        return call

    def _convert(self, key: str, body: dict[str, Any]) -> tuple[Order | None, str]:
        """Execute the order once per key: (the order, what this request did)."""
        with self._lock:
            known = self.orders.get(key)
            if known is not None:
                return (known, "DUPLICATE") if known.body == body else (None, "CONFLICT")
            if key in self.voided:
                order = Order(key, body, "REJECTED", reason="voided: the key was reported "
                                                             "NOT_FOUND earlier")
                self.orders[key] = order
                return order, "REJECTED"
            try:
                amount = Decimal(body["sell_amount"])
                rate = Decimal(body["rate"])
            except (KeyError, TypeError, InvalidOperation):
                return None, "BAD_REQUEST"
            self._next_order += 1
            price = self._script.fill_rate if self._script.fill_rate is not None else rate
            order = Order(key, body, "FILLED", order_id=f"fx-{self._next_order}",
                          bought_amount=(amount * price).quantize(Decimal("0.01"),
                                                                  ROUND_HALF_EVEN))
            self.orders[key] = order
            return order, "FILLED"

    def _reject(self, key: str, body: dict[str, Any]) -> tuple[Order | None, str]:
        with self._lock:
            known = self.orders.get(key)
            if known is not None:
                return (known, "DUPLICATE") if known.body == body else (None, "CONFLICT")
            order = Order(key, body, "REJECTED", reason="the provider refused the order "
                                                         "(limit exceeded)")
            self.orders[key] = order
            return order, "REJECTED"

    def place(self, handler: _Handler, key: str | None, body: Any) -> None:
        call = self._record(Call(self._now(), "POST", "/v1/orders", key,
                                 body if isinstance(body, dict) else None))
        script = self._script
        mode, delay, gate = script.place, script.delay, script.gate
        if not key or not isinstance(body, dict):
            call.outcome = "BAD_REQUEST"
            handler.answer(call, 400, {"error": "an Idempotency-Key header and a JSON body "
                                                "are required"})
            return
        if not all(isinstance(body.get(f), str) for f in ("sell_amount", "rate")):
            call.outcome = "BAD_REQUEST"
            handler.answer(call, 400, {"error": "sell_amount and rate are decimal strings, "
                                                "like \"100.00\", never JSON numbers"})
            return
        if key in script.failing:
            call.outcome = "FAILED"
            handler.answer(call, 503, {"error": "temporarily unavailable"})
            return
        if mode == "drop":
            call.outcome = "DROPPED"
            handler.drop()
            return
        if mode == "fail":
            call.outcome = "FAILED"
            handler.answer(call, 503, {"error": "temporarily unavailable"})
            return
        if mode == "slow":
            time.sleep(delay)
        if mode == "stall":
            self._stalled.release()
            gate.wait(30)
        order, what = (self._reject if mode.startswith("reject")
                       else self._convert)(key, body)
        call.outcome = what
        call.converted = what == "FILLED"
        if order is None:
            code, payload = (409, {"status": "CONFLICT", "error": "this Idempotency-Key was "
                                   "used for a different order"}) if what == "CONFLICT" else \
                (400, {"error": "sell_amount and rate must be decimal strings"})
            handler.answer(call, code, payload)
            return
        if mode in ("fill-then-fail", "reject-then-fail"):
            handler.answer(call, 500, {"error": "internal error"})
            return
        if mode == "fill-then-late":
            time.sleep(delay)
        if mode in ("fill-then-cut", "reject-then-cut"):
            handler.cut(call, *order.answer())
            return
        if mode == "reject-then-stall":
            handler.cut(call, *order.answer(), stall=delay)
            return
        if mode == "fill-then-garble":
            handler.garble(call)
            return
        handler.answer(call, *order.answer())

    def status(self, handler: _Handler, key: str) -> None:
        call = self._record(Call(self._now(), "GET", f"/v1/orders/{key}", key, None))
        mode, delay, gate = self._script.status, self._script.delay, self._script.gate
        if key in self._script.failing:
            mode = "fail"
        if mode == "stall":
            self._stalled.release()
            gate.wait(30)
        if mode == "fail":
            call.outcome = "FAILED"
            handler.answer(call, 503, {"error": "temporarily unavailable"})
            return
        if mode == "slow":
            time.sleep(delay)
        with self._lock:
            order = self.orders.get(key)
            if order is None:
                self.voided.add(key)
        code, payload = order.answer() if order else (404, {"status": "NOT_FOUND"})
        call.outcome = order.status if order else "NOT_FOUND"
        if mode == "cut":
            handler.cut(call, code, payload)
            return
        handler.answer(call, code, payload)

    def rate(self, handler: _Handler, query: dict[str, list[str]]) -> None:
        call = self._record(Call(self._now(), "GET", "/v1/rates", None, None))
        mode, delay, gate = self._script.rates, self._script.delay, self._script.gate
        if mode == "stall":
            self._stalled.release()
            gate.wait(30)
        if mode == "fail":
            call.outcome = "FAILED"
            handler.answer(call, 503, {"error": "temporarily unavailable"})
            return
        if mode == "slow":
            time.sleep(delay)
        sell, buy = query.get("sell", [""])[0], query.get("buy", [""])[0]
        rate = RATES.get((sell, buy))
        if rate is None:
            call.outcome = "NO_RATE"
            handler.answer(call, 404, {"error": f"no rate for {sell}->{buy}"})
            return
        call.outcome = "RATE"
        handler.answer(call, 200, {"sell": sell, "buy": buy, "rate": format(rate, "f")})


class _Handler(BaseHTTPRequestHandler):
    owner: FxProvider
    protocol_version = "HTTP/1.0"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's name
        return

    def answer(self, call: Call, code: int, payload: dict[str, Any]) -> None:
        body = json.dumps(payload).encode()
        call.code = code
        call.answered_at = self.owner._now()
        try:
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except OSError:
            pass  # the caller gave up (timed out) before the answer came: that is the point

    def cut(self, call: Call, code: int, payload: dict[str, Any], stall: float = 0.0) -> None:
        """Announce the whole body, send half of it, close: http.client's IncompleteRead.
        With `stall`, wait that long before closing: the reader times out first."""
        body = json.dumps(payload).encode()
        call.code = code
        call.answered_at = self.owner._now()
        try:
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body[:len(body) // 2])
            self.wfile.flush()
        except OSError:
            pass
        time.sleep(stall)
        self.drop()

    def garble(self, call: Call) -> None:
        """200 with a body that is not JSON."""
        body = b"<html><body><h1>502 Bad Gateway</h1></body></html>"
        call.code = 200
        call.answered_at = self.owner._now()
        try:
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except OSError:
            pass

    def drop(self) -> None:
        self.close_connection = True
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def _body(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            return json.loads(raw) if raw else None
        except ValueError:
            return None

    def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
        parsed = urllib.parse.urlsplit(self.path)
        if parsed.path == "/v1/rates":
            self.owner.rate(self, urllib.parse.parse_qs(parsed.query))
        elif parsed.path.startswith("/v1/orders/"):
            self.owner.status(self, urllib.parse.unquote(parsed.path[len("/v1/orders/"):]))
        else:
            self.answer(Call(self.owner._now(), "GET", parsed.path, None, None), 404,
                        {"error": "no such endpoint"})

    def do_POST(self) -> None:  # noqa: N802
        parsed = urllib.parse.urlsplit(self.path)
        body = self._body()
        if parsed.path == "/v1/orders":
            self.owner.place(self, self.headers.get("Idempotency-Key"), body)
        else:
            self.answer(Call(self.owner._now(), "POST", parsed.path, None, None), 404,
                        {"error": "no such endpoint"})
