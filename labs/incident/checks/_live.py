"""The shop, running: orders-api and payments as HTTP servers on 127.0.0.1, the notifier as a
Kafka consumer, all on the check's PostgreSQL database, writing JSON lines to the log files.

The incident of the scenario is live too: a request the check makes now fails the way the
recorded ones did, through real code (a KeyError in the refund codec, a division by zero
behind a feature flag, a socket that never answers, a row lock held by another session), and
the services log the real exception chains.
"""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, text

SCHEMA = """
CREATE TABLE stock (sku text PRIMARY KEY, qty integer NOT NULL);
CREATE TABLE orders (id bigserial PRIMARY KEY, user_id text NOT NULL, sku text NOT NULL,
                     qty integer NOT NULL, created_at timestamptz NOT NULL DEFAULT now());
CREATE TABLE payments (id bigserial PRIMARY KEY, order_id bigint, amount_cents integer NOT NULL,
                       kind text NOT NULL);
INSERT INTO stock VALUES ('sku-1041', 500), ('sku-2203', 500), ('sku-3377', 500);
"""
SKU = "sku-2203"
# A customer the incident spares: in the flag's untouched cohort, on an updated client (its
# refunds carry a currency), ordering a product whose stock row nobody holds. An incident
# rarely fails every request: stage 9's first request() is this customer's and goes through.
SPARED_USER, SPARED_SKU = "u-250", "sku-3377"


def _named(module: str, name: str) -> type[Exception]:
    cls = type(name, (Exception,), {})
    cls.__module__ = module
    return cls


OrderError = _named("orders.api", "OrderError")
ListingError = _named("orders.api", "ListingError")
RefundError = _named("orders.api", "RefundError")
DownstreamError = _named("orders.clients", "DownstreamError")
PricingError = _named("orders.pricing", "PricingError")
ChargeFailed = _named("payments.charges", "ChargeFailed")
ProviderUnavailable = _named("payments.provider", "ProviderUnavailable")
RefundFailed = _named("payments.refunds", "RefundFailed")
MalformedRefund = _named("payments.codec", "MalformedRefund")


def chain_of(exc: BaseException | None) -> dict[str, Any] | None:
    """An exception and its causes as the logs carry them."""
    if exc is None:
        return None
    cls = type(exc)
    cause = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)
    return {"type": f"{cls.__module__}.{cls.__qualname__}",
            "message": str(exc).split("\n")[0], "cause": chain_of(cause)}


class Logs:
    """Appends JSON lines to the services' files, stamped on the shop's clock."""

    def __init__(self, paths: dict[str, Path], now: datetime,
                 skew_ms: dict[str, float] | None = None) -> None:
        self.paths = paths
        self.skew_ms = skew_ms or {}
        self.start = now
        self.t0 = time.monotonic()
        self.lock = threading.Lock()

    def stamp(self, service: str = "") -> str:
        at = self.start + timedelta(seconds=time.monotonic() - self.t0,
                                    milliseconds=self.skew_ms.get(service, 0.0))
        return at.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")

    def write(self, service: str, level: str, trace: str, span: str, parent: str | None,
              message: str, error: BaseException | None = None, **extra: Any) -> None:
        line = {"ts": self.stamp(service), "level": level, "service": service, "trace_id": trace,
                "span_id": span, "parent_span_id": parent, "message": message, **extra,
                "error": chain_of(error)}
        with self.lock, self.paths[service].open("a", encoding="utf-8") as out:
            out.write(json.dumps(line) + "\n")


def failure_status(exc: BaseException) -> int:
    """What orders-api answers for a failure: 502 when payments failed the call (a bad
    gateway), 503 when the database's lock wait ran out, else 500 (its own bug). Every failure
    is 500 or above, and not every one is 500."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, DownstreamError):
            return 502
        if type(seen).__name__ == "LockNotAvailable":
            return 503
        seen = seen.__cause__ or seen.__context__
    return 500


def _span() -> str:
    return uuid.uuid4().hex[:16]


class _Server:
    def __init__(self, handle: Callable[[str, str, dict[str, Any], dict[str, str]],
                                        tuple[int, dict[str, Any], dict[str, str]]]) -> None:
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def _serve(self, method: str) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                status, answer, headers = outer.handle(method, self.path, body,
                                                       dict(self.headers.items()))
                data = json.dumps(answer).encode()
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:  # noqa: N802
                self._serve("GET")

            def do_POST(self) -> None:  # noqa: N802
                self._serve("POST")

            def log_message(self, *args: Any) -> None:
                pass

        self.handle = handle
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        # a short poll: shutdown() waits for it, at every close of the shop
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05},
                         daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def post(url: str, body: dict[str, Any], headers: dict[str, str] | None = None,
         method: str = "POST") -> tuple[int, dict[str, Any], dict[str, str]]:
    data = None if method == "GET" else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method,
                                     headers={"Content-Type": "application/json",
                                              **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=20) as response:
            return response.status, json.load(response), dict(response.headers.items())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"{}"), dict(error.headers.items())


class Shop:
    """orders-api, payments and the notifier, broken the way `kind` says (None: healthy)."""

    def __init__(self, kind: str | None, engine: Engine, logs: Logs,
                 kafka: Any = None, topic: str = "", lock_timeout_ms: int = 300,
                 producer: Any = None) -> None:
        self.kind = kind
        self.engine = engine
        self.logs = logs
        self.lock_timeout_ms = lock_timeout_ms
        self.silent = socket.socket()
        self.silent.bind(("127.0.0.1", 0))
        self.silent.listen(8)          # accepts connections, never answers: the provider
        self.producer = None
        self.topic = topic
        self.stop = threading.Event()
        self.notifier: threading.Thread | None = None
        if kafka is not None:
            self.producer = producer or kafka.producer()
            self.consumer = kafka.consumer()
            from confluent_kafka import OFFSET_BEGINNING, TopicPartition
            self.consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
            self.notifier = threading.Thread(target=self._notify, daemon=True)
            self.notifier.start()
        self.payments = _Server(self._payments)
        self.api = _Server(self._orders_api)

    def close(self) -> None:
        self.api.close()
        self.payments.close()
        self.stop.set()
        if self.notifier is not None:
            self.notifier.join(5)
            self.consumer.close()
        self.silent.close()

    # -- orders-api -------------------------------------------------------------------
    def _orders_api(self, method: str, path: str, body: dict[str, Any],
                    headers: dict[str, str]) -> tuple[int, dict[str, Any], dict[str, str]]:
        trace, span = uuid.uuid4().hex, _span()
        endpoint = f"{method} {path.split('?')[0]}"
        out = {"X-Trace-Id": trace}
        call = {"X-Trace-Id": trace, "X-Parent-Span": span}
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(path).query)
        user = str(body.get("user") or query.get("user", ["u-100"])[0])  # a GET has no body
        try:
            if endpoint == "POST /orders":
                answer = self._place(body, call)
            elif endpoint == "GET /orders":
                answer = self._list(call, spared=user == SPARED_USER)
            elif endpoint == "POST /refunds":
                answer = self._refund(body, call, spared=user == SPARED_USER)
            else:
                return 404, {}, out
        except Exception as exc:  # noqa: BLE001 (the service logs and answers 5xx)
            status = failure_status(exc)
            self.logs.write("orders-api", "ERROR", trace, span, None, f"{endpoint} failed",
                            exc, endpoint=endpoint, status=status, user=user)
            return status, {"error": type(exc).__name__, "trace_id": trace}, out
        self.logs.write("orders-api", "INFO", trace, span, None, f"{endpoint} 200",
                        endpoint=endpoint, status=200, user=user)
        if endpoint == "POST /orders" and self.producer is not None:
            self.producer.produce(self.topic, key=user.encode(), value=json.dumps(answer).encode(),
                                  headers=[("trace_id", trace.encode()),
                                           ("parent_span_id", span.encode())])
            self.producer.flush(10)
        return 200, answer, out

    def _place(self, body: dict[str, Any], call: dict[str, str]) -> dict[str, Any]:
        try:
            with self.engine.begin() as conn:
                conn.execute(text(f"SET LOCAL lock_timeout = '{int(self.lock_timeout_ms)}ms'"))
                conn.execute(text("SET LOCAL application_name = 'orders-api'"))
                conn.execute(text("UPDATE stock SET qty = qty - :q WHERE sku = :s"),
                             {"q": int(body.get("qty", 1)), "s": body.get("sku", SKU)})
                order_id = conn.execute(text(
                    "INSERT INTO orders (user_id, sku, qty) VALUES (:u, :s, :q) RETURNING id"),
                    {"u": body.get("user", "u-100"), "s": body.get("sku", SKU),
                     "q": int(body.get("qty", 1))}).scalar_one()
        except Exception as exc:
            raise OrderError("order could not be placed") from exc
        status, _answer, _ = post(self.payments.url + "/charges",
                                  {"order_id": order_id, "amount_cents": 1999}, call)
        if status != 200:
            try:
                raise DownstreamError(f"payments answered {status} to POST /charges")
            except DownstreamError as exc:
                raise OrderError("order could not be placed") from exc
        return {"order_id": order_id}

    def _list(self, call: dict[str, str], spared: bool = False) -> dict[str, Any]:
        with self.engine.connect() as conn:
            rows = conn.execute(text("SELECT id, qty FROM orders ORDER BY id DESC LIMIT 5")).all()
        # payments answers first (an INFO line, a child of this span), then the pricing fails:
        # the request's deepest ERROR line is orders-api's own, below a call that went well
        post(self.payments.url + "/balances", {"orders": [r[0] for r in rows]}, call)
        # the flag's new tier table, for the cohort it is on for
        tiers = 0 if self.kind == "pricing-flag" and not spared else 4
        try:
            try:
                prices = [1999 * qty // tiers for _id, qty in rows] or [1999 // tiers]
            except ZeroDivisionError as exc:
                raise PricingError("tiered discount failed") from exc
        except PricingError as exc:
            raise ListingError("order list could not be priced") from exc
        return {"orders": [r[0] for r in rows], "prices": prices}

    def _refund(self, body: dict[str, Any], call: dict[str, str],
                spared: bool = False) -> dict[str, Any]:
        if spared:  # an updated client sends the field the new codec reads
            body = {**body, "currency": "EUR"}
        status, answer, _ = post(self.payments.url + "/refunds", body, call)
        if status != 200:
            try:
                raise DownstreamError(f"payments answered {status} to POST /refunds")
            except DownstreamError as exc:
                raise RefundError("refund could not be completed") from exc
        return answer

    # -- payments ----------------------------------------------------------------------
    def _payments(self, method: str, path: str, body: dict[str, Any],
                  headers: dict[str, str]) -> tuple[int, dict[str, Any], dict[str, str]]:
        trace = headers.get("X-Trace-Id", uuid.uuid4().hex)
        parent = headers.get("X-Parent-Span")
        span = _span()
        try:
            if path == "/charges":
                self._charge(body)
            elif path == "/refunds":
                self._refund_booking(body)
            elif path == "/balances":
                pass  # a read: nothing to book, nothing that fails
            else:
                return 404, {}, {}
        except Exception as exc:  # noqa: BLE001
            status = 502 if isinstance(exc, ChargeFailed) else 500
            self.logs.write("payments", "ERROR", trace, span, parent, "request failed", exc,
                            status=status)
            return status, {"error": type(exc).__name__}, {}
        self.logs.write("payments", "INFO", trace, span, parent, f"{path} booked")
        return 200, {"ok": True}, {}

    def _charge(self, body: dict[str, Any]) -> None:
        if self.kind == "provider-timeout":
            try:
                try:
                    with socket.create_connection(self.silent.getsockname(), timeout=0.15) as s:
                        s.sendall(b"AUTHORIZE 1999\n")
                        s.recv(64)          # the provider never answers: TimeoutError
                except TimeoutError as exc:
                    raise ProviderUnavailable("card provider did not answer") from exc
            except ProviderUnavailable as exc:
                raise ChargeFailed("charge was not authorised") from exc
        with self.engine.begin() as conn:
            conn.execute(text("INSERT INTO payments (order_id, amount_cents, kind) "
                              "VALUES (:o, :a, 'charge')"),
                         {"o": body.get("order_id"), "a": body.get("amount_cents", 0)})

    def _refund_booking(self, body: dict[str, Any]) -> None:
        try:
            try:
                # the new codec reads a field older clients never send
                currency = body["currency"] if self.kind == "refund-deploy" else "EUR"
            except KeyError as exc:
                raise MalformedRefund("refund request lacks a field") from exc
        except MalformedRefund as exc:
            raise RefundFailed("refund was not booked") from exc
        with self.engine.begin() as conn:
            conn.execute(text("INSERT INTO payments (order_id, amount_cents, kind) "
                              "VALUES (:o, :a, :k)"),
                         {"o": body.get("order_id"), "a": -int(body.get("amount_cents", 0)),
                          "k": f"refund {currency}"})

    # -- notifier ----------------------------------------------------------------------
    def _notify(self) -> None:
        while not self.stop.is_set():
            message = self.consumer.poll(0.1)
            if message is None or message.error():
                continue
            headers = dict(message.headers() or [])
            trace = headers.get("trace_id", b"").decode()
            parent = headers.get("parent_span_id", b"").decode() or None
            self.logs.write("notifier", "INFO", trace, _span(), parent,
                            "order confirmation queued", offset=message.offset())

    def wait_notified(self, trace: str, path: Path, timeout: float = 20.0) -> bool:
        """True once the notifier logged `trace` (the event went through Kafka)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if trace in path.read_text(encoding="utf-8"):
                return True
            time.sleep(0.05)
        return False

    # -- requests, as a client makes them ------------------------------------------------
    def request(self, endpoint: str, user: str = "u-417") -> tuple[int, str]:
        """Make one request; (status, the X-Trace-Id it answered with)."""
        method, path = endpoint.split(" ")
        body = {"user": user, "sku": SPARED_SKU if user == SPARED_USER else SKU, "qty": 1,
                "order_id": 1, "amount_cents": 1999}
        if method == "GET":
            path += "?" + urllib.parse.urlencode({"user": user})
        status, _answer, headers = post(self.api.url + path, body, method=method)
        return status, headers.get("X-Trace-Id", "")
