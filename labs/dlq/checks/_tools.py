"""What the DLQ checks share with their crash child process (so: no pytest here): the test
events (healthy, undecodable, invalid, business-rule) and a scripted payment gateway that
records every call. The clock (InstantClock), the taps around the learner's Kafka clients,
topic readers and header display come from the kit, `dojo.checks`.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

# -- events ----------------------------------------------------------------------------------

TRACEPARENT = "traceparent"
EVENT_TYPE = "event-type"


def traceparent() -> bytes:
    return f"00-{uuid.uuid4().hex}-{uuid.uuid4().hex[:16]}-01".encode()


@dataclass(frozen=True)
class Item:
    """One record the check will produce, and what it is."""

    label: str  # healthy | undecodable | invalid | business-rule | declined | transient…
    key: bytes | None
    value: bytes
    headers: tuple[tuple[str, bytes], ...]
    event_id: str | None = None  # for events that parse
    account: str | None = None
    cents: int = 0  # signed effect on the balance when applied
    partition: int | None = None  # None: the key picks it (murmur2)


def event_bytes(event_id: str, account: str, cents: int, kind: str = "deposit",
                currency: str = "EUR") -> bytes:
    return json.dumps({"event_id": event_id, "account": account, "kind": kind,
                       "amount_cents": cents, "currency": currency}).encode()


TENANT = "x-tenant"  # a business header whose name starts with x-, like the lab's own
ROUTE = "x-route"  # repeated: Kafka headers are a list, not a map


def _headers() -> tuple[tuple[str, bytes], ...]:
    return ((TRACEPARENT, traceparent()), (EVENT_TYPE, b"payment.v1"),
            (TENANT, b"tenant-" + uuid.uuid4().hex[:6].encode()),
            (ROUTE, b"edge-fra-2"), (ROUTE, b"ingest-ams-7"))


def healthy(account: str, cents: int = 1000, *, kind: str = "deposit", label: str = "healthy",
            partition: int | None = None) -> Item:
    event_id = str(uuid.uuid4())
    signed = cents if kind == "deposit" else -cents
    return Item(label, account.encode(), event_bytes(event_id, account, cents, kind),
                _headers(), event_id, account, signed, partition)


def undecodable(key: str | bytes | None = None, partition: int | None = None,
                size: int = 0) -> Item:
    """Bytes that are not UTF-8 (and unique, so the check can recognise them anywhere),
    padded to `size` bytes; a key given as bytes is used as it is (it may not be text)."""
    value = b"\xff\xfe\x00\x9c not json \xc3\x28 " + uuid.uuid4().hex.encode()
    value += b"\x9c" * max(0, size - len(value))
    raw_key = key.encode() if isinstance(key, str) and key else key or None
    return Item("undecodable", raw_key, value, _headers(), partition=partition)


def invalid(key: str, partition: int | None = None) -> Item:
    """JSON whose amount is a string: InvalidEvent. The spacing, field order and the \\u00e9
    escape are unusual on purpose: parsing and re-serialising would change the bytes."""
    event_id = str(uuid.uuid4())
    value = ('{ "event_id" : "' + event_id + '",\n  "account":"' + key + '", "kind":"deposit",'
             '  "amount_cents":"12.50", "currency":"EUR", "note":"caf\\u00e9" }').encode()
    return Item("invalid", key.encode(), value, _headers(), event_id=None, account=key,
                partition=partition)


def business_rule(key: str, partition: int | None = None) -> Item:
    """A well-formed event in a currency the service does not support."""
    event_id = str(uuid.uuid4())
    return Item("business-rule", key.encode(),
                event_bytes(event_id, key, 500, currency="GBP"), _headers(),
                partition=partition)


def with_label(item: Item, label: str) -> Item:
    return Item(label, item.key, item.value, item.headers, item.event_id, item.account,
                item.cents, item.partition)


# -- the payment gateway ---------------------------------------------------------------------


# A reason longer than the header's 1000 characters, in a script whose letters take two
# bytes each in UTF-8: a cut made on the bytes keeps about half of it, or splits a letter.
# Its lines break and indent as the gateway wrote them: whitespace is part of the message.
# (Its lengths put byte 1000 of the header inside a letter.)
LONG_REASON = ("счёт закрыт по решению суда,\n возврат средств невозможен; "
               "обратитесь в  отделение банка.  ") * 18
# How many links the deep exception chain has: far deeper than real chains (two to six), so
# a cap picked from them (5, 10, 32) shows; a generous guard (a recursion stopped at 50 links,
# as in the alternative procedural-unique-violation) still reaches the end.
DEEP_CHAIN_LINKS = 41


@dataclass
class Call:
    what: str  # authorize | ping
    event_id: str | None
    at: float  # clock.monotonic()
    outcome: str  # ok | timeout | unavailable | declined | down


class ScriptedDownstream:
    """A gateway that answers from a script: `scripts[event_id]` lists the outcomes of that
    event's successive authorize() calls ("timeout", "unavailable", "declined", "ok"); past
    the list (or without one) it answers ok. `down_while(clock)` True makes every call fail
    with DownstreamUnavailable, ping() included: an outage for everyone; with
    `down_as="timeout"` authorize() times out instead (a load balancer that accepts and hangs)
    while ping() still fails.
    """

    def __init__(self, payments: Any, clock: Any,
                 scripts: Mapping[str | None, list[str]] | None = None,
                 *, down_while: Callable[[], bool] | None = None,
                 on_call: Callable[[Call], None] | None = None,
                 latency: float = 0.0,
                 latency_of: Callable[[str | None, int], float | None] | None = None,
                 override: Callable[[str | None], str | None] | None = None,
                 down_as: str = "unavailable") -> None:
        self.payments = payments
        self.down_as = down_as
        self.clock = clock
        self.scripts = {k: list(v) for k, v in (scripts or {}).items()}
        self.down_while = down_while or (lambda: False)
        self.on_call = on_call
        self.latency = latency  # clock seconds every authorize() takes (a slow gateway)
        # (event id, attempt index from 0) -> the seconds that call takes instead, or None
        self.latency_of = latency_of
        self.override = override  # (event id) -> an outcome instead of the script's, or None
        self.calls: list[Call] = []
        self._seen: dict[str | None, int] = {}
        self._lock = threading.Lock()

    def _record(self, call: Call) -> None:
        with self._lock:
            self.calls.append(call)
        if self.on_call is not None:
            self.on_call(call)

    @staticmethod
    def message(outcome: str, event_id: str | None) -> str:
        """str() of the exception authorize() raises for `outcome`."""
        return {
            "timeout": f"gateway timed out after 2.0 s authorising {event_id}",
            "unavailable": f"gateway answered 503 for {event_id}",
            "declined": f"gateway declined {event_id}:\n  account closed  (rule 7)",
            "declined-long": f"gateway declined {event_id}: {LONG_REASON}",
            "unavailable-deep": f"gateway answered 503 for {event_id}",
            "bug": "'risk_score'",
            "bug2": "'NoneType' object is not subscriptable",
            "garbled": "Expecting value: line 1 column 1 (char 0)",
            "bad-utf8": "'utf-8' codec can't decode byte 0xe9 in position 15: invalid "
                        "continuation byte",
            "bad-value": "invalid literal for int() with base 10: '12.5 '",
        }.get(outcome, "")

    def _error(self, outcome: str, event_id: str | None) -> BaseException | None:
        p = self.payments
        text = self.message(outcome, event_id)
        kinds: dict[str, Callable[[str], BaseException]] = {
            "timeout": p.DownstreamTimeout, "declined": p.PaymentDeclined,
            "declined-long": p.PaymentDeclined,
            "bug": lambda _: KeyError("risk_score"),  # a bug in the gateway client
            "bug2": TypeError,
            # a garbled gateway response (a proxy's HTML page during a deploy): ValueErrors
            # of the client's parsing, not a verdict on the payment
            "garbled": lambda _: json.JSONDecodeError("Expecting value",
                                                      "<html>502 Bad Gateway</html>", 0),
            "bad-utf8": lambda _: UnicodeDecodeError("utf-8", b'{"status": "caf\xe9"}', 15,
                                                     16, "invalid continuation byte"),
            "bad-value": ValueError}
        return kinds[outcome](text) if outcome in kinds else None

    def authorize(self, event: Any) -> None:
        event_id = getattr(event, "event_id", None)
        now = self.clock.monotonic()
        if self.down_while():
            self._record(Call("authorize", event_id, now, "down"))
            if self.down_as == "timeout":
                raise self.payments.DownstreamTimeout(self.message("timeout", event_id))
            raise self.payments.DownstreamUnavailable(
                "gateway answered 503: service unavailable") from ConnectionRefusedError(
                    111, "connection refused by gateway-7f9c:8443")
        with self._lock:
            n = self._seen.get(event_id, 0)
            self._seen[event_id] = n + 1
        script = self.scripts.get(event_id, [])
        outcome = script[n] if n < len(script) else "ok"
        if self.override is not None:
            outcome = self.override(event_id) or outcome
        self._record(Call("authorize", event_id, now, outcome))
        own = self.latency_of(event_id, n) if self.latency_of is not None else None
        delay = self.latency if own is None else own
        if delay:
            self.clock.advance(delay)
        if outcome == "unavailable":
            self._unavailable(event_id)
        if outcome == "unavailable-deep":
            raise self._deep_unavailable(event_id)
        error = self._error(outcome, event_id)
        if error is not None:
            raise error

    def _unavailable(self, event_id: str | None) -> None:
        """A 503 raised from a read timeout that happened while handling a connection reset:
        the root cause is two links down, the last one implicit (__context__). The client
        raises the 503 from the saved timeout while it handles another error (closing the
        broken connection), so the 503's __context__ is not its __cause__: only following
        __cause__ first reaches the reset."""
        try:
            try:
                raise ConnectionResetError(104, "connection reset by gateway-7f9c:8443")
            except ConnectionResetError:
                # no `from`: the reset is only the implicit __context__, on purpose
                raise TimeoutError("read from gateway-7f9c:8443 timed out")  # noqa: B904
        except TimeoutError as exc:
            read_failed = exc
        try:
            raise BrokenPipeError(32, "broken pipe closing gateway-7f9c:8443")
        except BrokenPipeError:
            raise self.payments.DownstreamUnavailable(self.message("unavailable", event_id)) \
                from read_failed

    def _deep_unavailable(self, event_id: str | None) -> BaseException:
        """A 503 at the top of a chain of DEEP_CHAIN_LINKS exceptions (a client wrapping a
        pool error wrapping an SSL error …, over and over), links alternately explicit
        (__cause__) and implicit (__context__ only); the root is a ConnectionAbortedError."""
        error: BaseException = ConnectionAbortedError(103, "connection aborted by gateway-7f9c")
        kinds = (OSError, TimeoutError, ConnectionError, RuntimeError)
        for n in range(DEEP_CHAIN_LINKS - 2):
            outer = kinds[n % len(kinds)](f"wrapped, level {n + 1}")
            if n % 2:
                outer.__cause__ = error
            outer.__context__ = error
            error = outer
        top = self.payments.DownstreamUnavailable(self.message("unavailable-deep", event_id))
        top.__cause__ = top.__context__ = error
        return top

    def ping(self) -> None:
        now = self.clock.monotonic()
        down = self.down_while()
        self._record(Call("ping", None, now, "down" if down else "ok"))
        if down:
            raise self.payments.DownstreamUnavailable("gateway health check: 503")

    # what the checks ask afterwards
    def authorizations(self, event_id: str | None) -> list[Call]:
        return [c for c in self.calls if c.what == "authorize" and c.event_id == event_id]
