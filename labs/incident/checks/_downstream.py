"""Stage downstream: the live shop calling its dependencies, one of them timing out.

orders-api answers POST /orders by calling three dependencies over HTTP, each a real server on
127.0.0.1, through an outbound client with a timeout per dependency and a circuit breaker per
dependency; GET /orders calls none. Both endpoints have a bug of their own that fails a few
requests (the service's own errors). The shop counts every request it answers and every call
it makes, per minute of its own clock, and serves them at /metrics.

The check drives the traffic minute by minute: the shop's clock is set before each request, so
a window of minutes plays in seconds, while every call is a real one (a real socket timeout
when the dependency never answers, a real slow answer, a real refusal by an open breaker).
Which dependency fails, which one is slow (a tail of slow answers, always within its
timeout) and which is fast depends on the run, as do the minutes of a burst of timeouts that
recovered and of the onset: replay with DOJO_INCIDENT_RUN.
"""

from __future__ import annotations

import http.client
import json
import math
import random
import select
import socket
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, TypeVar

from _live import _Server, post
from _support import Sources

from dojo.checks import table

T = TypeVar("T")

DOWNSTREAM = "where-to-look-first#step-6-its-dependencies"

DEPENDENCIES = ("card-provider", "tax-rates", "shipping-quotes")   # the order POST calls them
FAILING_TIMEOUT_MS = 250   # the failing dependency's timeout: it never answers some calls
OTHER_TIMEOUT_MS = 2000    # the others': the slow one's tail stays well within it
SLOW_TAIL_S = 0.7          # one call in SLOW_EVERY of the slow dependency takes this long
SLOW_EVERY = 25            # (under 5 %: step_at_the_95th_rank() adds the rest of its tail)
RANK_MS = (300.0, 320.0)   # the broken run's slow dependency: its nearest-rank p95 (above the
TAIL_MS = (720.0, 880.0)   # failing one's timeouts), the calls above it, and every call below
LOW_MS = 150.0             # it at most this (a step on both sides of the 95th rank)
RANK_PAD_AT_S = 20         # the calls that set its number of calls go at this second of minute 0
WHOLE_RANK_MS = (45.0, 50.0)    # the broken run's fast dependency: its calls number 20 k (0.95 n
WHOLE_NEXT_MS = (110.0, 130.0)  # whole), its nearest-rank p95, the n / 20 calls above it (the
WHOLE_LOW_MS = 30.0             # next rank, a 0-based int(0.95 n), over twice the p95), and every
WHOLE_PAD_AT_S = 40             # call below it; its calls that set n go at this second of minute 0
FLAKY_EVERY = 4            # from the onset the fast dependency answers one call in 4 with 503
SPUTTER_EVERY = 3          # the healthy run's fast dependency, in its last minute: a 503 in 3
LAST_HEALTHY_PER_MINUTE = 12   # requests in that minute: the stray timeout stays under a fifth
PER_MINUTE = 8             # POST /orders requests per minute (every second one: a GET too)
ONSET_CALLS = 10           # the onset minute: the failing dependency gets exactly this many
ONSET_MAX_REQUESTS = 24    # calls, a fifth of them timing out (at most this many requests)
QUIET_MINUTES = 4          # the window of quiet_run(): its last minute sends some no call
QUIET_LAST_REQUESTS = 3    # POST /orders in that minute, each answered 503 by the first
OPEN_FOR_S = 150           # the breaker refuses calls this long (shop clock) before a probe
BREAKER_WINDOW = 8         # it opens when BREAKER_FAILURES of the last BREAKER_WINDOW calls
BREAKER_FAILURES = 5       # failed (timed out or answered 5xx)
BAD_TIMEOUT_RATE = 0.2     # README: a minute is bad from this share of timed-out calls on
MIN_MINUTES_AFTER = 4      # the incident lasts at least this many minutes
MAX_MINUTES = 24
HEALTHY_MINUTES = 10


@dataclass(frozen=True)
class Plan:
    """Which dependency plays which part, and when things happen, in this run."""
    seed: int
    failing: str
    slow: str
    fast: str
    burst: int          # the minute of a burst of timeouts that recovered
    onset: int          # the first minute of the incident
    start: datetime     # the window's first minute


def plan_of(seed: int) -> Plan:
    n = seed % len(DEPENDENCIES)
    rng = random.Random(seed * 7919 + 8)
    burst = rng.choice((2, 3))
    start = datetime(2026, 3, 14, 9, 0, tzinfo=UTC) + timedelta(minutes=rng.randrange(0, 600))
    return Plan(seed, DEPENDENCIES[n], DEPENDENCIES[(n + 1) % 3], DEPENDENCIES[(n + 2) % 3],
                burst, burst + rng.choice((3, 4)), start)


class ShopClock:
    """The shop's clock: the driver sets it before each request."""

    def __init__(self, now: datetime) -> None:
        self.now = now


class DependencyError(Exception):
    def __init__(self, dependency: str, reason: str) -> None:
        super().__init__(f"{dependency}: {reason}")
        self.dependency = dependency


class Breaker:
    """A count-based circuit breaker on the shop's clock: opens when BREAKER_FAILURES of the
    last BREAKER_WINDOW calls failed, refuses calls for OPEN_FOR_S, then lets one probe
    through (half-open): a success closes it, a failure opens it again."""

    def __init__(self, clock: ShopClock) -> None:
        self.clock = clock
        self.state = "closed"
        self.since = clock.now
        self.recent: deque[bool] = deque(maxlen=BREAKER_WINDOW)

    def _enter(self, state: str) -> None:
        self.state, self.since = state, self.clock.now
        if state == "closed":
            self.recent.clear()

    def allow(self) -> bool:
        if self.state == "open":
            if self.clock.now - self.since < timedelta(seconds=OPEN_FOR_S):
                return False
            self._enter("half-open")
        return True

    def record(self, ok: bool) -> None:
        if self.state == "half-open":
            self._enter("closed" if ok else "open")
            return
        self.recent.append(ok)
        if sum(not x for x in self.recent) >= BREAKER_FAILURES:
            self._enter("open")


class Dependency:
    """One dependency's server. `phase` (set by the driver) says how it answers: "ok";
    "slow-tail" (every SLOW_EVERY-th call slow); "burst" (every second call never
    answered); "failing" (of every four calls: one answered, one 503, two never answered);
    "stray" (the first call of the phase never answered, the rest answered); "dead" (no call
    answered); "fifth" (the fourth of every five calls never answered); "flaky" (of
    every FLAKY_EVERY calls the first answered 503, at once: errors, no timeout, too few to
    open its breaker); "sputter" (the same, one call in SPUTTER_EVERY); "down" (every call
    answered 503, at once); "three" (the second, fifth and eighth call never answered, the
    rest answered: with `restart` at each minute, 3 of 11 calls, 2 of 6); "errors" (the first
    call never answered, the second answered 503, the rest answered: with 7 or 8 calls, one
    timeout is under a fifth while the errors are above it)."""

    def __init__(self, name: str, phase: str) -> None:
        self.name = name
        self.phase = phase
        self.count = 0
        self.lock = threading.Lock()
        self.release = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                action = outer._next()
                if action == "hang":
                    outer.hang_up(self.connection)     # never answers while the caller waits
                    return
                if action == "error":
                    status = 503
                else:
                    if action == "slow":
                        time.sleep(SLOW_TAIL_S)
                    status = 200
                body = json.dumps({"ok": status == 200}).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except OSError:
                    pass                        # the caller gave up (its timeout)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05},
                         daemon=True).start()

    def hang_up(self, connection: socket.socket) -> None:
        """Hold a call unanswered until its caller gives up (its timeout closes the connection)
        or the shop closes. The handler's thread ends with the call: a window hangs dozens of
        calls, and a check's process has room for few idle threads under its address-space
        limit (each reserves its stack), so none may linger after its caller left."""
        while not self.release.is_set():
            readable, _, _ = select.select([connection], [], [], 0.05)
            if readable:
                try:
                    if not connection.recv(1, socket.MSG_PEEK):
                        return                  # the caller hung up
                except OSError:
                    return
                self.release.wait(0.05)         # bytes after the request: keep waiting

    def set_phase(self, phase: str) -> None:
        with self.lock:
            if phase != self.phase:
                self.phase, self.count = phase, 0

    def restart(self, phase: str) -> None:
        """Set the phase and count its calls from 0 again, even when it is the same phase
        (a phase restarted every minute shows the same pattern in every minute)."""
        with self.lock:
            self.phase, self.count = phase, 0

    def _next(self) -> str:
        with self.lock:
            k, self.count = self.count, self.count + 1
            phase = self.phase
        if phase == "slow-tail":
            return "slow" if k % SLOW_EVERY == SLOW_EVERY - 1 else "ok"
        if phase == "burst":
            return "hang" if k % 2 == 1 else "ok"
        if phase == "failing":
            return ("ok", "error", "hang", "hang")[k % 4]
        if phase == "stray":
            return "hang" if k == 0 else "ok"
        if phase == "errors":
            return ("hang", "error")[k] if k < 2 else "ok"
        if phase == "three":
            return "hang" if k in (1, 4, 7) else "ok"
        if phase == "fifth":
            return "hang" if k % 5 == 3 else "ok"
        if phase == "flaky":
            return "error" if k % FLAKY_EVERY == 0 else "ok"
        if phase == "mixed":
            return ("ok", "hang", "ok", "error")[k % 4]
        if phase == "down":
            return "error"
        if phase == "dead":
            return "hang"
        if phase == "sputter":
            return "error" if k % SPUTTER_EVERY == 0 else "ok"
        return "ok"

    def close(self) -> None:
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()


class Metrics:
    """The shop's counters per minute of its clock: inbound per endpoint, outbound per
    dependency."""

    def __init__(self, clock: ShopClock, start: datetime) -> None:
        self.clock = clock
        self.start = start
        self.lock = threading.Lock()
        self.inbound: dict[tuple[int, str], dict[str, Any]] = {}
        self.outbound: dict[tuple[int, str], dict[str, Any]] = {}

    def _minute(self) -> int:
        return int((self.clock.now - self.start) / timedelta(minutes=1))

    def request(self, endpoint: str, ms: float, cause: str | None, user: str) -> None:
        with self.lock:
            row = self.inbound.setdefault((self._minute(), endpoint), _inbound_row())
            row["requests"] += 1
            row["durations_ms"].append(round(ms, 3))
            if cause is not None:
                row["errors"] += 1
                row["failed_users"].append(user)
                row["errors_by_cause"][cause] = row["errors_by_cause"].get(cause, 0) + 1

    def call(self, dependency: str, outcome: str, ms: float = 0.0) -> None:
        with self.lock:
            row = self.outbound.setdefault((self._minute(), dependency), _outbound_row())
            if outcome == "short-circuited":
                row["short_circuited"] += 1
                return
            row["calls"] += 1
            row["durations_ms"].append(round(ms, 3))
            if outcome != "ok":
                row["errors"] += 1
            if outcome == "timeout":
                row["timeouts"] += 1

    def minutes(self) -> int:
        with self.lock:
            return max((m for m, _ in [*self.inbound, *self.outbound]), default=-1) + 1


def _inbound_row() -> dict[str, Any]:
    return {"requests": 0, "errors": 0, "durations_ms": [], "failed_users": [],
            "errors_by_cause": {}}


def _outbound_row() -> dict[str, Any]:
    return {"calls": 0, "errors": 0, "timeouts": 0, "short_circuited": 0, "durations_ms": []}


def iso(at: datetime) -> str:
    return at.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class DownstreamShop:
    """orders-api with its outbound client, its breakers and its metrics endpoint."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.clock = ShopClock(plan.start)
        self.metrics = Metrics(self.clock, plan.start)
        self.deps = {name: Dependency(name, "slow-tail" if name == plan.slow else "ok")
                     for name in DEPENDENCIES}
        self.timeout_ms = {name: FAILING_TIMEOUT_MS if name == plan.failing else OTHER_TIMEOUT_MS
                           for name in DEPENDENCIES}
        self.breakers = {name: Breaker(self.clock) for name in DEPENDENCIES}
        # the order /metrics lists them in (not the order the shop calls them in)
        self.listing: tuple[str, ...] = DEPENDENCIES
        self.posts = 0
        self.gets = 0
        self.end = plan.start
        self.api = _Server(self._handle)

    def close(self) -> None:
        self.api.close()
        for dep in self.deps.values():
            dep.close()

    # -- the outbound client --------------------------------------------------------------
    def _call(self, name: str) -> None:
        breaker = self.breakers[name]
        if not breaker.allow():
            self.metrics.call(name, "short-circuited")
            raise DependencyError(name, "circuit open, call not sent")
        started = time.monotonic()
        conn = http.client.HTTPConnection("127.0.0.1", self.deps[name].port,
                                          timeout=self.timeout_ms[name] / 1000)
        outcome = "ok"
        try:
            conn.request("GET", "/quote")
            status = conn.getresponse().status
            conn.close()
            if status >= 500:
                outcome = "error"
        except TimeoutError:
            outcome = "timeout"
        except OSError:
            outcome = "error"
        finally:
            conn.close()
        self.metrics.call(name, outcome, (time.monotonic() - started) * 1000)
        breaker.record(outcome == "ok")
        if outcome != "ok":
            raise DependencyError(name, "timed out" if outcome == "timeout" else "answered 503")

    # -- orders-api ---------------------------------------------------------------------
    def _handle(self, method: str, path: str, body: dict[str, Any], headers: dict[str, str]
                ) -> tuple[int, dict[str, Any], dict[str, str]]:
        if method == "GET" and path == "/metrics":
            return 200, self.served(), {}
        endpoint = f"{method} {path}"
        user = str(body.get("user", "u-100"))
        started = time.monotonic()
        cause: str | None = None
        try:
            if endpoint == "POST /orders":
                self.posts += 1
                if self.posts % 12 == 5:
                    raise ValueError("order without a delivery address")   # its own bug
                for name in DEPENDENCIES:
                    self._call(name)
            elif endpoint == "GET /orders":
                self.gets += 1
                if self.gets % 6 == 3:
                    raise KeyError("discount")                           # its own bug
            else:
                return 404, {}, {}
        except DependencyError as exc:
            cause = exc.dependency
        except Exception:  # noqa: BLE001 (the service's own failure: it answers 500)
            cause = "own"
        self.metrics.request(endpoint, (time.monotonic() - started) * 1000, cause, user)
        if cause is None:
            return 200, {"ok": True}, {}
        return (502 if cause != "own" else 500), {"error": cause}, {}

    # -- the metrics endpoint ---------------------------------------------------------------
    def served(self) -> dict[str, Any]:
        with self.metrics.lock:
            count = int((self.end - self.plan.start) / timedelta(minutes=1))
            minutes, outbound = [], []
            for m in range(count):
                at = iso(self.plan.start + timedelta(minutes=m))
                for endpoint in ("POST /orders", "GET /orders"):
                    row = self.metrics.inbound.get((m, endpoint)) or _inbound_row()
                    minutes.append({"minute": at, "endpoint": endpoint,
                                    **json.loads(json.dumps(row))})
                for name in self.listing:
                    row = self.metrics.outbound.get((m, name)) or _outbound_row()
                    outbound.append({"minute": at, "dependency": name,
                                     **json.loads(json.dumps(row))})
        return {"service": "shop", "minutes": minutes, "outbound": outbound,
                "dependencies": [{"dependency": name, "timeout_ms": self.timeout_ms[name],
                                  "breaker": self.breakers[name].state,
                                  "breaker_since": iso(self.breakers[name].since)}
                                 for name in self.listing]}

    # -- traffic, as the check drives it ------------------------------------------------------
    def _minute(self, m: int, requests: int) -> None:
        step = timedelta(minutes=1) / requests
        for i in range(requests):
            self._order(m, i, step)
        self._end_minute(m)

    def _order(self, m: int, i: int, step: timedelta) -> None:
        """The minute's i-th POST /orders (every second one with a GET /orders too)."""
        self.clock.now = self.plan.start + timedelta(minutes=m) + i * step
        user = f"u-{(m * PER_MINUTE + i) % 23 + 100}"
        post(self.api.url + "/orders", {"user": user})
        if i % 2 == 0:
            post(self.api.url + "/orders", {"user": user}, method="GET")

    def _end_minute(self, m: int) -> None:
        self.end = self.plan.start + timedelta(minutes=m + 1)
        self.clock.now = self.end

    def drive(self, broken: bool) -> None:
        """Play the window: a burst of timeouts that recovers, then (broken) a minute in which one
        of its calls times out (under a fifth) and one is answered 503 (errors above a fifth: not
        bad, the minute before the onset), then the dependency degrading (the onset: exactly a fifth
        of its calls time out, 2 of 10, on the README's threshold; its breaker still closed), then
        failing until its breaker is open and refuses every call of the last minute, while from the
        onset on the fast dependency answers a call in FLAKY_EVERY with 503 (the requests it fails
        are neither the failing dependency's nor the service's own); or (healthy) a quiet end with a
        single stray timeout in the last minute, in which the fast dependency answers a call in
        SPUTTER_EVERY with 503 (errors above a fifth of its calls, none timed out: not failing)."""
        failing = self.deps[self.plan.failing]
        last = HEALTHY_MINUTES - 1
        for m in range(MAX_MINUTES):
            if broken and m == self.plan.onset:
                self.deps[self.plan.fast].set_phase("flaky")
            if not broken and m == last:
                self.deps[self.plan.fast].set_phase("sputter")
            if m == self.plan.burst:
                failing.set_phase("burst")      # half its calls time out, its breaker holds
            elif broken and m == self.plan.onset - 1:
                failing.set_phase("errors")     # a timeout (under a fifth) and a 503: not bad
            elif broken and m == self.plan.onset:
                failing.set_phase("fifth")      # exactly a fifth time out: bad (>= 0.2)
            elif broken and m > self.plan.onset:
                failing.set_phase("failing")
            elif not broken and m == last:
                failing.set_phase("stray")
            else:
                failing.set_phase("ok")
            if broken and m == self.plan.onset:
                self._onset_minute(m)
            else:
                self._minute(m, LAST_HEALTHY_PER_MINUTE if not broken and m == last
                             else PER_MINUTE)
            if not broken and m == last:
                return
            if broken and m >= self.plan.onset + MIN_MINUTES_AFTER and self._refused_all(m):
                self._trip_fast_breaker()
                return
        raise RuntimeError(f"run {self.plan.seed}: the breaker of {self.plan.failing} never "
                           "refused a whole minute; the scenario cannot be set up")

    def _onset_minute(self, m: int) -> None:
        """The onset minute: requests until the failing dependency has been sent ONSET_CALLS
        calls (the requests that an earlier dependency or the shop's own bug fails never reach
        it), so that exactly a fifth of its calls time out: 2 of 10, on the threshold."""
        step = timedelta(minutes=1) / ONSET_MAX_REQUESTS
        for i in range(ONSET_MAX_REQUESTS):
            row = self.metrics.outbound.get((m, self.plan.failing)) or _outbound_row()
            if row["calls"] >= ONSET_CALLS:
                break
            self._order(m, i, step)
        self._end_minute(m)

    def drive_quiet(self) -> None:
        """A healthy window whose last minute sends two dependencies no call at all: the first
        one called (card-provider) answers each of the minute's few orders with 503 at once
        (too few failures to open its breaker), so the shop never calls the others, and no
        breaker refuses a call. Every other minute is plain traffic, every call answered."""
        for dep in self.deps.values():
            dep.set_phase("ok")
        for m in range(QUIET_MINUTES):
            if m == QUIET_MINUTES - 1:
                self.deps[DEPENDENCIES[0]].set_phase("down")
                self._minute(m, QUIET_LAST_REQUESTS)
            else:
                self._minute(m, PER_MINUTE)

    def _trip_fast_breaker(self) -> None:
        """At the end of the window (now), the fast dependency stops answering but with 503s
        and its breaker opens: open now, though its last minute shows no refused call (the
        calls that tripped it belong to the minute that has just begun)."""
        fast = self.deps[self.plan.fast]
        fast.set_phase("down")
        for _ in range(BREAKER_WINDOW):
            if self.breakers[self.plan.fast].state == "open":
                return
            try:
                self._call(self.plan.fast)
            except DependencyError:
                pass

    def _refused_all(self, m: int) -> bool:
        row = self.metrics.outbound.get((m, self.plan.failing)) or _outbound_row()
        return (self.breakers[self.plan.failing].state == "open" and row["calls"] == 0
                and row["short_circuited"] > 0)

    def step_at_the_95th_rank(self) -> None:
        """Make the slow dependency's durations over the window step on both sides of the
        nearest rank, as stage 1 does for an endpoint's baseline (_history), so that no other
        reading of "p95" comes within the check's 15 % + 1 ms of it. First its number of calls
        is made 20 k + 15 (calls answered at once, in minute 0, before any trouble): 0.95 n is
        then a quarter past a rank, and an interpolated percentile weighs a neighbour of the
        nearest rank by at least a fifth (statistics.quantiles: the next rank by 0.2;
        numpy.percentile: the rank before by 0.7). Then the ceil(0.95 n)-th smallest is set to
        RANK_MS, the n - ceil(0.95 n) above it to TAIL_MS (with its live slow answers, which
        take SLOW_TAIL_S), and every call below it took at most LOW_MS (play() checks it)."""
        name = self.plan.slow
        rng = random.Random(f"{self.plan.seed}/outbound-rank")
        with self.metrics.lock:
            n = sum(row["calls"] for row in self._window_rows(name))
            tail = sum(d > LOW_MS for row in self._window_rows(name)
                       for d in row["durations_ms"])
        total = n + (15 - n) % 20
        while total - math.ceil(0.95 * total) < tail:
            total += 20
        self.deps[name].set_phase("ok")
        self.clock.now = self.plan.start + timedelta(seconds=RANK_PAD_AT_S)
        for _ in range(total - n):
            try:
                self._call(name)
            except DependencyError:
                pass                            # play() finds the window not as planned
        self.clock.now = self.end
        with self.metrics.lock:
            fast = [(row, i) for row in self._window_rows(name)
                    for i, d in enumerate(row["durations_ms"]) if d <= LOW_MS]
            above = total - math.ceil(0.95 * total) - tail
            for number, (row, i) in enumerate(rng.sample(fast, above + 1)):
                row["durations_ms"][i] = round(rng.uniform(*(RANK_MS if number == 0
                                                             else TAIL_MS)), 1)

    def step_past_the_whole_rank(self) -> None:
        """Make the fast dependency's durations over the window step between the nearest rank
        and the next one with 0.95 n whole, as stage 1 does for a baseline
        (test_the_p95_when_0_95_n_is_a_whole_rank): a 0-based int(0.95 n) or round(0.95 n) is
        ceil(0.95 n) - 1 unless 0.95 n is whole, and the slow dependency's 20 k + 15 calls never
        make it whole. First its number of calls is made a multiple of 20 (calls answered at
        once, in minute 0, before any trouble: through a breaker of their own, as the window's,
        open now, was closed then). Then the ceil(0.95 n)-th smallest is set to WHOLE_RANK_MS,
        the n / 20 above it to WHOLE_NEXT_MS, and every call below it took at most WHOLE_LOW_MS
        (play() checks it)."""
        name = self.plan.fast
        rng = random.Random(f"{self.plan.seed}/outbound-whole-rank")
        with self.metrics.lock:
            n = sum(row["calls"] for row in self._window_rows(name))
        total = n + (-n) % 20
        dep, breaker = self.deps[name], self.breakers[name]
        phase = dep.phase
        dep.set_phase("ok")
        self.clock.now = self.plan.start + timedelta(seconds=WHOLE_PAD_AT_S)
        self.breakers[name] = Breaker(self.clock)
        try:
            for _ in range(total - n):
                try:
                    self._call(name)
                except DependencyError:
                    pass                        # play() finds the window not as planned
        finally:
            self.breakers[name] = breaker
            dep.set_phase(phase)
            self.clock.now = self.end
        with self.metrics.lock:
            fast = [(row, i) for row in self._window_rows(name)
                    for i, ms in enumerate(row["durations_ms"]) if ms <= WHOLE_LOW_MS]
            if len(fast) <= total // 20:
                return                          # play() finds the window not as planned
            for number, (row, i) in enumerate(rng.sample(fast, total // 20 + 1)):
                row["durations_ms"][i] = round(rng.uniform(*(WHOLE_RANK_MS if number == 0
                                                             else WHOLE_NEXT_MS)), 1)

    def _window_rows(self, name: str) -> list[dict[str, Any]]:
        """`name`'s outbound rows of the window's minutes, in minute order (metrics.lock held)."""
        minutes = int((self.end - self.plan.start) / timedelta(minutes=1))
        return [row for (m, dep), row in sorted(self.metrics.outbound.items())
                if dep == name and m < minutes]

    def sources(self) -> Sources:
        return Sources(self.api.url + "/metrics", "", [], self.end)


# -- the README's arithmetic, on what the shop served -------------------------------------------
def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)] if ordered else 0.0


def interpolated_p95s(values: list[float]) -> dict[str, float]:
    """The readings of "p95" between two ranks a learner may take for the nearest rank."""
    ordered = sorted(values)
    if len(ordered) < 2:
        return {}
    rank = math.ceil(0.95 * len(ordered))
    return {"statistics.quantiles": statistics.quantiles(ordered, n=20)[18],
            "statistics.quantiles (inclusive)": statistics.quantiles(ordered, n=20,
                                                                     method="inclusive")[18],
            "the rank before": ordered[rank - 2],
            "the next rank": ordered[min(rank, len(ordered) - 1)]}


def bad(row: dict[str, Any]) -> bool:
    return row["short_circuited"] > 0 or (
        row["calls"] > 0 and row["timeouts"] / row["calls"] >= BAD_TIMEOUT_RATE)


@dataclass
class Expected:
    dependency: str
    since: datetime
    timeout_rate: float
    breaker: str
    caused_errors: int
    own_errors: int
    by_dependency: dict[str, dict[str, Any]]
    mean_ms: dict[str, float] = field(default_factory=dict)
    inbound_rate: dict[str, float] = field(default_factory=dict)
    all_errors: int = 0
    other_errors: int = 0           # inbound errors since the onset another dependency caused
    first_timeout: datetime | None = None
    first_refused: datetime | None = None
    refused_since: int = 0


def _when(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def expected(served: dict[str, Any]) -> Expected | None:
    """The README's answer for the metrics the shop served (None: no dependency fails)."""
    by_dep: dict[str, list[dict[str, Any]]] = {}
    for row in served["outbound"]:
        by_dep.setdefault(row["dependency"], []).append(row)
    breakers = {d["dependency"]: d["breaker"] for d in served["dependencies"]}
    found = []
    for name, rows in by_dep.items():
        rows.sort(key=lambda r: r["minute"])
        start = len(rows)
        while start > 0 and bad(rows[start - 1]):
            start -= 1
        if start < len(rows):
            found.append((sum(r["timeouts"] for r in rows[start:]), name, rows[start]["minute"]))
    if not found:
        return None
    _, name, onset = max(found)
    since = _when(onset)

    def after(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [r for r in rows if r["minute"] >= onset]

    stats, means, inbound_rates = {}, {}, {}
    inbound = after(served["minutes"])
    window = served["minutes"]
    posts = sum(r["requests"] for r in window if r["endpoint"] == "POST /orders")
    for dep, rows in by_dep.items():
        sent = rows                     # the whole window, as a dashboard shows it
        calls = sum(r["calls"] for r in sent)
        durations = [d for r in sent for d in r["durations_ms"]]
        stats[dep] = {"error_rate": sum(r["errors"] for r in sent) / calls if calls else 0.0,
                      "p95_ms": p95(durations), "breaker": breakers[dep]}
        means[dep] = sum(durations) / len(durations) if durations else 0.0
        inbound_rates[dep] = (sum(r["errors_by_cause"].get(dep, 0) for r in window) / posts
                              if posts else 0.0)
    rows = after(by_dep[name])
    calls = sum(r["calls"] for r in rows)
    first = next((r["minute"] for r in by_dep[name] if r["timeouts"]), None)
    refused = next((r["minute"] for r in rows if r["short_circuited"]), None)
    return Expected(
        dependency=name, since=since,
        timeout_rate=sum(r["timeouts"] for r in rows) / calls if calls else 0.0,
        breaker=breakers[name],
        caused_errors=sum(r["errors_by_cause"].get(name, 0) for r in inbound),
        own_errors=sum(r["errors_by_cause"].get("own", 0) for r in inbound),
        by_dependency=stats, mean_ms=means, inbound_rate=inbound_rates,
        all_errors=sum(r["errors"] for r in inbound),
        other_errors=sum(n for r in inbound for cause, n in r["errors_by_cause"].items()
                         if cause not in (name, "own")),
        first_timeout=_when(first) if first else None,
        first_refused=_when(refused) if refused else None,
        refused_since=sum(r["short_circuited"] for r in rows),
    )


def outbound_table(served: dict[str, Any], names: tuple[str, ...] = DEPENDENCIES,
                   after: str = "") -> str:
    """The outbound calls per minute of the dependencies `names`, from the minute before the
    first that went wrong after `after` (a long window's table must fit in a failure
    message)."""
    troubled = [r["minute"] for r in served["outbound"]
                if (r["errors"] or r["timeouts"] or r["short_circuited"]) and r["minute"] > after]
    minutes = sorted({r["minute"] for r in served["outbound"]})
    start = max(0, minutes.index(min(troubled)) - 1) if troubled else 0
    rows = [(r["minute"][11:16], r["dependency"], r["calls"], r["errors"], r["timeouts"],
             r["short_circuited"], f"{p95(r['durations_ms']):.1f}")
            for r in served["outbound"]
            if r["dependency"] in names and r["minute"] >= minutes[start]]
    before = "the minute" if start == 1 else f"the {start} minutes"
    left_out = "not shown" if after else "no errors"
    quiet = f"({before} before {minutes[start][11:16]}: {left_out})\n" if start else ""
    return (quiet + "refused: short_circuited, the calls its breaker refused\n"
            + table(rows, ("minute", "dependency", "calls", "errors", "timeouts", "refused",
                           "p95 ms"), limit=80))


def breakers_table(served: dict[str, Any]) -> str:
    return table([(d["dependency"], d["timeout_ms"], d["breaker"], d["breaker_since"][11:19])
                  for d in served["dependencies"]],
                 ("dependency", "timeout ms", "breaker", "since"))


@dataclass
class DownstreamRun:
    plan: Plan
    broken: bool
    shop: DownstreamShop
    served: dict[str, Any]
    want: Expected | None
    sources: Sources

    def describe(self) -> str:
        if self.broken:
            return (f"{self.plan.failing} times out (run {self.plan.seed}, replay: "
                    f"DOJO_INCIDENT_RUN={self.plan.seed})")
        return f"no dependency fails (run {self.plan.seed})"

    def evidence(self, names: tuple[str, ...] = DEPENDENCIES) -> str:
        return "\n".join([self.describe(), "the shop's dependencies now:",
                          breakers_table(self.served),
                          "its outbound calls per minute (from /metrics):",
                          outbound_table(self.served, names)])


PLAY_ATTEMPTS = 3


class NotAsPlanned(RuntimeError):
    """A played window whose metrics do not show what its check needs: the machine was too
    loaded for the real timeouts to land as planned (never the learner's fault)."""


def replayed(play_once: Callable[..., T], *args: Any) -> T:
    """play_once(*args), played again (fresh shop, same run) when its window did not come out
    as planned, up to PLAY_ATTEMPTS times: a loaded machine (CI running two brokers on two
    cores) makes a healthy call miss a short timeout now and then."""
    for _ in range(PLAY_ATTEMPTS - 1):
        try:
            return play_once(*args)
        except NotAsPlanned:
            continue
    try:
        return play_once(*args)
    except NotAsPlanned as exc:
        raise NotAsPlanned(f"{exc}\n(played {PLAY_ATTEMPTS} times, never as planned)") from None


def play(seed: int, broken: bool) -> DownstreamRun:
    """Start the shop, drive its traffic, and check that the run shows what it must (else the
    scenario could not be set up: an error of the checker, never the learner's)."""
    plan = plan_of(seed)
    shop = DownstreamShop(plan)
    try:
        shop.drive(broken)
        if broken:
            shop.step_at_the_95th_rank()
            shop.step_past_the_whole_rank()
        served = shop.served()
        want = expected(served)
    except BaseException:
        shop.close()
        raise
    run = DownstreamRun(plan, broken, shop, served, want, shop.sources())
    onset = iso(plan.start + timedelta(minutes=plan.onset))
    onset_row = next((r for r in served["outbound"]
                      if r["dependency"] == plan.failing and r["minute"] == onset), None)
    before = pre_onset_row(served, plan)
    if broken and (onset_row is None or onset_row["calls"] != ONSET_CALLS
                   or onset_row["timeouts"] * 5 != onset_row["calls"]
                   or before is None or not 0 < before["timeouts"] * 5 < before["calls"]
                   or before["errors"] * 5 < before["calls"]
                   or not _stepped(served, plan.slow)
                   or not _stepped_past_whole_rank(served, plan.fast)
                   or want is None or want.dependency != plan.failing
                   or want.since != plan.start + timedelta(minutes=plan.onset)
                   or want.other_errors == 0
                   or want.first_refused in (None, want.since)
                   or want.by_dependency[plan.fast]["breaker"] != "open"
                   or want.by_dependency[plan.slow]["p95_ms"]
                   <= want.by_dependency[plan.failing]["p95_ms"]):
        shop.close()
        raise NotAsPlanned(f"run {seed}: the shop's metrics do not show the scenario "
                           f"(the machine may be too loaded):\n{run.evidence()}")
    if not broken and want is not None:
        shop.close()
        raise NotAsPlanned(f"run {seed}: the healthy shop's metrics show a failing "
                           f"dependency (the machine may be too loaded):\n{run.evidence()}")
    return run


def pre_onset_row(served: dict[str, Any], plan: Plan) -> dict[str, Any] | None:
    """The failing dependency's outbound row of the minute before the onset."""
    at = iso(plan.start + timedelta(minutes=plan.onset - 1))
    return next((r for r in served["outbound"]
                 if r["dependency"] == plan.failing and r["minute"] == at), None)


def _stepped(served: dict[str, Any], name: str) -> bool:
    """Whether every interpolated reading of the dependency's p95 misses the nearest rank by
    more than the check's tolerance (15 % + 1 ms), on both sides."""
    durations = [d for r in served["outbound"] if r["dependency"] == name
                 for d in r["durations_ms"]]
    want = p95(durations)
    return all(abs(v - want) > 0.15 * want + 1.0 + 5.0
               for v in interpolated_p95s(durations).values())


def floor_rank(values: list[float]) -> float | None:
    """sorted(d)[int(0.95 n)]: the nearest rank when 0.95 n is not whole, the next one when it
    is (None: no durations)."""
    ordered = sorted(values)
    return ordered[min(int(0.95 * len(ordered)), len(ordered) - 1)] if ordered else None


def _stepped_past_whole_rank(served: dict[str, Any], name: str) -> bool:
    """Whether the dependency's calls number a multiple of 20 and the rank after the nearest
    (a 0-based int(0.95 n)) misses it by more than the check's tolerance (15 % + 1 ms)."""
    durations = [d for r in served["outbound"] if r["dependency"] == name
                 for d in r["durations_ms"]]
    if not durations or len(durations) % 20:
        return False
    want, after = p95(durations), floor_rank(durations)
    return after is not None and after - want > 0.15 * want + 1.0 + 5.0


def play_quiet(seed: int) -> DownstreamRun:
    """Play the quiet window (DownstreamShop.drive_quiet) and check that it shows what the
    check needs: no dependency failing, and in the last minute at least one dependency sent
    no call with none refused."""
    plan = plan_of(seed)
    shop = DownstreamShop(plan)
    try:
        shop.drive_quiet()
        served = shop.served()
        want = expected(served)
    except BaseException:
        shop.close()
        raise
    run = DownstreamRun(plan, False, shop, served, want, shop.sources())
    if want is not None or not silent_in_last_minute(served):
        shop.close()
        raise NotAsPlanned(f"run {seed}: the quiet shop's metrics do not show a last minute "
                           f"without calls (the machine may be too loaded):\n{run.evidence()}")
    return run


def silent_in_last_minute(served: dict[str, Any]) -> list[str]:
    """The dependencies sent no call, and refused none, in the window's last minute."""
    last = max(r["minute"] for r in served["outbound"])
    return [r["dependency"] for r in served["outbound"] if r["minute"] == last
            and r["calls"] == 0 and r["short_circuited"] == 0]


# -- several dependencies failing at once: which one to name ------------------------------------
SEVERAL_MINUTES = 14
SEVERAL_PER_MINUTE = 12     # POST /orders a minute: exactly one of every 12 fails on the shop's
                            # own bug, so the first dependency called is sent 11 calls a minute
SHORT_TIMEOUT_MS = 150      # the timeout of `named` and `earliest`; `latest` has the longer
                            # FAILING_TIMEOUT_MS, so its timed-out calls make the longest p95
RIVAL_MINUTES = 3           # "the most timeouts in the last N minutes" names another for N <= 3


@dataclass(frozen=True)
class SeveralPlan:
    """Three dependencies failing at the end of one window. `named` has the most timeouts since
    its onset (the README's one to name): a long run of minutes in which few of its calls time
    out (3 of 11, 2 of 6), with a short timeout. `earliest` began first, after a burst that
    recovered, and has the most timeouts over the whole window and the most errors since its
    onset (half its calls fail, but one of each two failures is a quick 503, not a timeout),
    and then its breaker opens and refuses nearly every call. `latest` began last and fails
    harder in each of its few minutes, with a longer timeout: it leads the last minutes'
    timeouts and the p95, but not the timeouts since its onset. The shop stops a request at the
    first call that fails, so `earliest` (its breaker open) is the last it calls; `named` and
    `latest` swap places with the run, and /metrics lists the three in a run's own order."""
    seed: int
    named: str
    latest: str
    earliest: str
    start: datetime
    listing: tuple[str, ...]


def several_plan(seed: int) -> SeveralPlan:
    rng = random.Random(seed * 104729 + 3)
    first, second, earliest = DEPENDENCIES
    named, latest = (first, second) if rng.random() < 0.5 else (second, first)
    listing = list(DEPENDENCIES)
    rng.shuffle(listing)
    if listing[0] == named:
        listing.append(listing.pop(0))
    return SeveralPlan(seed, named, latest, earliest, plan_of(seed).start, tuple(listing))


@dataclass(frozen=True)
class Failing:
    onset: datetime
    since_onset: int        # its timeouts from its onset on
    in_window: int          # its timeouts over the whole window
    last: tuple[int, ...]   # its timeouts in the last 1, 2, ... RIVAL_MINUTES minutes


def failing_of(served: dict[str, Any]) -> dict[str, Failing]:
    """Every dependency whose last minute is bad, with the README's onset and its timeouts."""
    by_dep = _rows_by_dependency(served)
    found = {}
    for name, rows in by_dep.items():
        start = len(rows)
        while start > 0 and bad(rows[start - 1]):
            start -= 1
        if start < len(rows):
            found[name] = Failing(_when(rows[start]["minute"]),
                                  sum(r["timeouts"] for r in rows[start:]),
                                  sum(r["timeouts"] for r in rows),
                                  tuple(sum(r["timeouts"] for r in rows[-n:])
                                        for n in range(1, RIVAL_MINUTES + 1)))
    return found


def _rows_by_dependency(served: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    by_dep: dict[str, list[dict[str, Any]]] = {}
    for row in served["outbound"]:
        by_dep.setdefault(row["dependency"], []).append(row)
    for rows in by_dep.values():
        rows.sort(key=lambda r: r["minute"])
    return by_dep


def rival_scores(served: dict[str, Any], failing: dict[str, Failing]
                 ) -> dict[str, dict[str, float]]:
    """{rule: {dependency: score}} for the rules a learner may take for the README's (the
    highest score named): over the failing dependencies, from their own onset or over the
    whole window. The three-failing window makes each of them name another than the README."""
    by_dep = _rows_by_dependency(served)
    breakers = {d["dependency"]: d["breaker"] for d in served["dependencies"]}
    rules: dict[str, dict[str, float]] = {
        "the most timeouts over the whole window": {},
        "the earliest onset": {}, "the latest onset": {},
        "the most calls refused by its breaker since its onset": {},
        "the highest timeout share since its onset": {},
        "the highest timeout share over the whole window": {},
        "the most errors since its onset": {}, "the most errors over the whole window": {},
        "the highest error rate since its onset": {},
        "the highest error rate over the whole window": {},
        "the longest p95 since its onset": {}, "the longest p95 over the whole window": {},
        "the longest mean duration over the whole window": {},
        "the most inbound errors caused since its onset": {},
        "its breaker open": {},
    }
    for n in range(1, RIVAL_MINUTES + 1):
        rules["the most timeouts in the last minute" if n == 1
              else f"the most timeouts in the last {n} minutes"] = {}
    for name, f in failing.items():
        rows = by_dep[name]
        recent = [r for r in rows if _when(r["minute"]) >= f.onset]
        score = {
            "the most timeouts over the whole window": f.in_window,
            "the earliest onset": -f.onset.timestamp(), "the latest onset": f.onset.timestamp(),
            "the most calls refused by its breaker since its onset":
                sum(r["short_circuited"] for r in recent),
            "the highest timeout share since its onset": _share(recent, "timeouts"),
            "the highest timeout share over the whole window": _share(rows, "timeouts"),
            "the most errors since its onset": sum(r["errors"] for r in recent),
            "the most errors over the whole window": sum(r["errors"] for r in rows),
            "the highest error rate since its onset": _share(recent, "errors"),
            "the highest error rate over the whole window": _share(rows, "errors"),
            "the longest p95 since its onset": p95([d for r in recent for d in r["durations_ms"]]),
            "the longest p95 over the whole window": p95([d for r in rows
                                                          for d in r["durations_ms"]]),
            "the longest mean duration over the whole window": _mean(rows),
            "the most inbound errors caused since its onset": sum(
                r["errors_by_cause"].get(name, 0) for r in served["minutes"]
                if _when(r["minute"]) >= f.onset),
            "its breaker open": float(breakers[name] == "open"),
        }
        for n, timeouts in enumerate(f.last, start=1):
            score["the most timeouts in the last minute" if n == 1
                  else f"the most timeouts in the last {n} minutes"] = timeouts
        for rule, value in score.items():
            rules[rule][name] = value
    return rules


def _share(rows: list[dict[str, Any]], key: str) -> float:
    calls = sum(r["calls"] for r in rows)
    return sum(r[key] for r in rows) / calls if calls else 0.0


def _mean(rows: list[dict[str, Any]]) -> float:
    durations = [d for r in rows for d in r["durations_ms"]]
    return sum(durations) / len(durations) if durations else 0.0


def rules_naming(scores: dict[str, dict[str, float]], name: str) -> list[str]:
    """The rival rules whose highest score is `name`'s alone."""
    return [rule for rule, by_name in scores.items()
            if by_name.get(name) is not None
            and all(v < by_name[name] for other, v in by_name.items() if other != name)]


@dataclass
class SeveralRun:
    plan: SeveralPlan
    shop: DownstreamShop
    served: dict[str, Any]
    want: Expected
    failing: dict[str, Failing]
    sources: Sources
    rivals: dict[str, dict[str, float]] = field(default_factory=dict)

    def evidence(self) -> str:
        rows = [(name, f.onset.strftime("%H:%M"), f.since_onset, f.last[0], f.in_window)
                for name, f in sorted(self.failing.items(), key=lambda kv: kv[1].onset)]
        return "\n".join([
            f"three dependencies fail (run {self.plan.seed}, replay: "
            f"DOJO_INCIDENT_RUN={self.plan.seed})",
            table(rows, ("dependency", "onset", "timeouts since onset",
                         "timeouts in last minute", "timeouts in window")),
            "the shop's dependencies now:", breakers_table(self.served),
            "its outbound calls per minute (from /metrics), from the earliest onset on:",
            outbound_table(self.served, after=iso(min(f.onset for f in self.failing.values())
                                                  - timedelta(minutes=1)))])


def _drive_several(shop: DownstreamShop, plan: SeveralPlan) -> None:
    """`earliest`: a burst (minutes 1-4: every second call of a minute never answered) that
    recovers, then from minute 6 "mixed" (a call in four never answered, one answered 503 at
    once: more errors since its onset than `named`'s timeouts, fewer timeouts, its breaker
    holding), then from minute 11 no answer at all, so its breaker opens and refuses calls from
    then on, letting a probe through now and then; `named`: from minute 7, 3 of the 11 calls of
    a minute time out (2 of 6 once `latest` fails before it: bad, and its breaker holds);
    `latest`: from minute 11, every second call of a minute times out (its breaker holds: never
    five failures in eight calls), more timeouts a minute than `named` in either order of the
    calls. Every phase restarts each minute, so each minute shows the same pattern."""
    for m in range(SEVERAL_MINUTES):
        shop.deps[plan.earliest].restart("burst" if 1 <= m <= 4 else "ok" if m < 6
                                         else "mixed" if m < SEVERAL_MINUTES - RIVAL_MINUTES
                                         else "dead")
        shop.deps[plan.named].restart("three" if m >= 7 else "ok")
        shop.deps[plan.latest].restart("burst" if m >= SEVERAL_MINUTES - RIVAL_MINUTES
                                       else "ok")
        shop._minute(m, SEVERAL_PER_MINUTE)


def play_several(seed: int) -> SeveralRun:
    """Play the three-failing window, and check that its metrics show what the check needs:
    three failing, the README's choice `named`, and every rival rule (rival_scores: the whole
    window's timeouts, the last minutes' timeouts, the earliest or latest onset, the timeout
    share, the errors, the error rate, the p95, the open breaker, ...) naming another."""
    plan = several_plan(seed)
    shop = DownstreamShop(plan_of(seed))
    shop.listing = plan.listing
    shop.timeout_ms = dict.fromkeys(DEPENDENCIES, SHORT_TIMEOUT_MS)
    shop.timeout_ms[plan.latest] = FAILING_TIMEOUT_MS
    for dep in shop.deps.values():
        dep.set_phase("ok")
    try:
        _drive_several(shop, plan)
        served = shop.served()
        want = expected(served)
        failing = failing_of(served)
        rivals = rival_scores(served, failing) if set(failing) == set(DEPENDENCIES) else {}
    except BaseException:
        shop.close()
        raise
    run = SeveralRun(plan, shop, served, want, failing, shop.sources(),  # type: ignore[arg-type]
                     rivals)
    f = failing
    same = [rule for rule, by_name in rivals.items()
            if not any(v > by_name[plan.named] for other, v in by_name.items()
                       if other != plan.named)]
    if (want is None or set(f) != set(DEPENDENCIES) or want.dependency != plan.named
            or len({x.since_onset for x in f.values()}) < 3
            or not f[plan.earliest].onset < f[plan.named].onset < f[plan.latest].onset
            or same):
        shop.close()
        raise NotAsPlanned(f"run {seed}: the shop's metrics do not show three failing "
                           f"dependencies as planned (the machine may be too loaded"
                           + (f"; {plan.named} also has {', '.join(same)}" if same else "")
                           + f"):\n{run.evidence()}")
    return run
