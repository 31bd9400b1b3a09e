"""The last 40 minutes of a small shop, as its metrics, logs and change log recorded them.

Four services (orders-api, payments, notifier; the provider is outside) served three
endpoints. A scenario is one of the incidents below, or none (a healthy window); every
number, minute, user, id and decoy is drawn from the run's seed, so a failing run can be
replayed with the same seed. The live services (_live.py) fail in the same way and write to
the same log files, so a request the check makes now ends in the chain the history shows.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ENDPOINTS = ("POST /orders", "GET /orders", "POST /refunds")
KINDS = ("refund-deploy", "pricing-flag", "provider-timeout", "stock-lock")
WINDOW_MINUTES = 40
BASELINE_MINUTES = 10
MIN_REQUESTS = 10           # a minute with fewer is never bad (README, stage 1)
QUIET_BASELINE_FAILED = 4   # stock-lock: failures of its quiet baseline minute
SERVICES = ("orders-api", "payments", "notifier")


def _err(kind: str, message: str, cause: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"type": kind, "message": message, "cause": cause}


# What each incident's failing request logs: (service, chain) from the caller to the callee.
def failure_chains(kind: str) -> list[tuple[str, dict[str, Any]]]:
    if kind == "refund-deploy":
        return [
            ("orders-api", _err("orders.api.RefundError", "refund could not be completed",
                                _err("orders.clients.DownstreamError",
                                     "payments answered 500 to POST /refunds"))),
            ("payments", _err("payments.refunds.RefundFailed", "refund was not booked",
                              _err("payments.codec.MalformedRefund",
                                   "refund request lacks a field",
                                   _err("builtins.KeyError", "'currency'")))),
        ]
    if kind == "provider-timeout":
        return [
            ("orders-api", _err("orders.api.OrderError", "order could not be placed",
                                _err("orders.clients.DownstreamError",
                                     "payments answered 502 to POST /charges"))),
            ("payments", _err("payments.charges.ChargeFailed", "charge was not authorised",
                              _err("payments.provider.ProviderUnavailable",
                                   "card provider did not answer",
                                   _err("builtins.TimeoutError", "timed out")))),
        ]
    if kind == "pricing-flag":
        return [
            ("orders-api", _err("orders.api.ListingError", "order list could not be priced",
                                _err("orders.pricing.PricingError",
                                     "tiered discount failed",
                                     _err("builtins.ZeroDivisionError",
                                          "integer division or modulo by zero")))),
        ]
    if kind == "stock-lock":
        return [
            ("orders-api", _err("orders.api.OrderError", "order could not be placed",
                                _err("sqlalchemy.exc.OperationalError",
                                     "(psycopg.errors.LockNotAvailable) canceling statement "
                                     "due to lock timeout",
                                     _err("psycopg.errors.LockNotAvailable",
                                          "canceling statement due to lock timeout")))),
        ]
    raise ValueError(kind)


# A background failure of the healthy days: one request now and then, another cause.
BACKGROUND_CHAIN = [
    ("orders-api", _err("orders.api.OrderError", "order could not be placed",
                        _err("orders.clients.DownstreamError",
                             "payments closed the connection",
                             _err("builtins.ConnectionResetError",
                                  "[Errno 104] Connection reset by peer")))),
]

# Each service stamps its lines with its own host's clock. In the refund incident the payments
# host runs 400 ms ahead, so its ERROR line comes after the caller's: the order of the lines
# in time says nothing about who called whom; only the spans do.
CLOCK_SKEW_MS = {"refund-deploy": {"payments": 400.0}}

ENDPOINT_OF = {"refund-deploy": "POST /refunds", "pricing-flag": "GET /orders",
               "provider-timeout": "POST /orders", "stock-lock": "POST /orders"}


def deepest(error: dict[str, Any]) -> dict[str, Any]:
    while error.get("cause"):
        error = error["cause"]
    return error


def root_of(kind: str) -> tuple[str, str, str]:
    """(service, exception type, message) of the deepest cause of `kind`'s failing request."""
    service, chain = failure_chains(kind)[-1]
    last = deepest(chain)
    return service, last["type"], last["message"]


@dataclass
class Scenario:
    kind: str | None
    seed: int
    start: datetime
    onset: int | None               # minute index of the first bad minute, None: healthy
    blip: int | None                # a one-minute burst that recovered by itself
    fail_share: float
    changes: list[dict[str, Any]] = field(default_factory=list)
    suspect_id: str | None = None
    background: list[tuple[int, str]] = field(default_factory=list)  # (minute, endpoint)

    @property
    def endpoint(self) -> str | None:
        return ENDPOINT_OF[self.kind] if self.kind else None

    @property
    def end(self) -> datetime:
        return self.start + timedelta(minutes=WINDOW_MINUTES)

    def minute(self, index: int) -> datetime:
        return self.start + timedelta(minutes=index)

    @property
    def since(self) -> datetime | None:
        return None if self.onset is None else self.minute(self.onset)

    def describe(self) -> str:
        what = self.kind or "healthy"
        return f"scenario {what}, run {self.seed} (replay: DOJO_INCIDENT_RUN={self.seed})"


def quiet_baseline_minute(scenario: Scenario) -> int | None:
    """stock-lock: the index of the baseline minute with fewer than 10 requests."""
    return 2 + scenario.seed % 7 if scenario.kind == "stock-lock" else None


def _change(rng: random.Random, at: datetime, kind: str, service: str,
            description: str) -> dict[str, Any]:
    return {"id": f"chg-{rng.randint(1000, 9999)}", "at": _iso(at), "kind": kind,
            "service": service, "description": description}


def build(kind: str | None, seed: int) -> Scenario:
    """The scenario `kind` (None: healthy) with every number drawn from `seed`."""
    rng = random.Random(f"{seed}/{kind}")
    start = datetime(2026, 3, rng.randint(2, 27), rng.randint(8, 16), rng.randint(0, 19),
                     tzinfo=UTC)
    onset = rng.randint(24, 31) if kind else None
    blip = rng.randint(13, 18)
    scenario = Scenario(kind, seed, start, onset, blip, fail_share=rng.uniform(0.28, 0.46))
    scenario.background = sorted({(rng.randint(1, 7), rng.choice(ENDPOINTS)) for _ in range(3)}
                                 | {(rng.randint(1, 4), ENDPOINT_OF.get(kind or "",
                                                                       "POST /orders"))})
    old = _change(rng, start - timedelta(minutes=rng.randint(5, 30)), "deploy", "orders-api",
                  f"orders-api v3.{rng.randint(10, 19)}.0")
    early = _change(rng, start + timedelta(minutes=rng.randint(3, 8), seconds=17), "config",
                    "notifier", "notifier: email batch size 50 -> 100")
    changes = [old, early]
    if onset is not None:
        before = start + timedelta(minutes=onset) - timedelta(minutes=rng.randint(1, 6),
                                                              seconds=rng.randint(3, 50))
        after = start + timedelta(minutes=onset + rng.randint(3, 6), seconds=rng.randint(1, 50))
        since = start + timedelta(minutes=onset)
        if kind == "refund-deploy":
            cause = _change(rng, before, "deploy", "payments",
                            f"payments v2.{rng.randint(4, 9)}.0 (refund codec rewritten)")
        elif kind == "pricing-flag":
            # the flag flipped a few seconds into the first bad minute (the window runs to
            # the end of that minute), after two older changes that are in the window too;
            # a change exactly one minute after the onset is already outside it
            cause = _change(rng, since + timedelta(seconds=rng.randint(4, 40),
                                                   milliseconds=rng.randint(0, 999)),
                            "flag", "orders-api",
                            "feature flag orders.tiered-discounts: off -> on (100 %)")
            changes.append(_change(rng, since - timedelta(minutes=rng.randint(9, 13),
                                                          seconds=rng.randint(1, 50)),
                                   "config", "payments", "payments: pool size 20 -> 30"))
            changes.append(_change(rng, since - timedelta(minutes=rng.randint(2, 7),
                                                          seconds=rng.randint(1, 50)),
                                   "config", "notifier", "notifier: retry delay 2 s -> 3 s"))
            changes.append(_change(rng, since + timedelta(minutes=1), "flag", "notifier",
                                   "feature flag notifier.sms: off -> on (10 %)"))
        elif kind == "stock-lock":
            cause = _change(rng, before, "config", "inventory-sync",
                            "inventory-sync: reconcile batch 500 -> 50000 rows per transaction")
            # an older change in the window, listed after the suspect (see _served_order)
            changes.append(_change(rng, since - timedelta(minutes=rng.randint(9, 13),
                                                          seconds=rng.randint(1, 50)),
                                   "config", "payments", "payments: pool size 20 -> 30"))
        else:
            cause = None
        # someone deployed during the incident: the newest deploy, and not the cause
        later = _change(rng, after, "deploy", "notifier",
                        f"notifier v1.{rng.randint(20, 29)}.{rng.randint(0, 9)}")
        if cause is not None:
            changes.append(cause)
            scenario.suspect_id = cause["id"]
        changes.append(later)
    if kind is None:
        # one stray failure in the last minute of the endpoint with the fewest background
        # failures: under the 5 % floor, though above 3 x its (tiny) baseline error rate
        quiet = min(ENDPOINTS, key=lambda e: sum(1 for _, b in scenario.background if b == e))
        scenario.background.append((WINDOW_MINUTES - 1, quiet))
    scenario.changes = _served_order(rng, changes, scenario)
    return scenario


def _served_order(rng: random.Random, changes: list[dict[str, Any]], scenario: Scenario
                  ) -> list[dict[str, Any]]:
    """The change log in no particular order (the README promises none): shuffled, with the
    changes of the window (since - 15 min to the end of the onset minute) listed so that
    neither the first nor the last of them in the list is the latest: stock-lock lists the
    suspect before the older change, pricing-flag lists it between its two older ones."""
    served = list(changes)
    rng.shuffle(served)
    since = scenario.since
    if since is None or scenario.suspect_id is None:
        return served
    low, high = _iso(since - timedelta(minutes=15)), _iso(since + timedelta(minutes=1))
    inside = sorted((c for c in changes if low <= c["at"] < high), key=lambda c: c["at"])
    suspect = inside.pop()
    assert suspect["id"] == scenario.suspect_id
    if len(inside) == 1:
        listed = [suspect, inside[0]]
    elif len(inside) == 2:
        listed = [inside[1], suspect, inside[0]]
    else:
        return served
    slots = sorted(served.index(c) for c in listed)
    for slot, change in zip(slots, listed, strict=True):
        served[slot] = change
    return served


def _iso(at: datetime) -> str:
    return at.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _hex(rng: random.Random, digits: int) -> str:
    return f"{rng.getrandbits(4 * digits):0{digits}x}"


@dataclass
class Recorded:
    minutes: list[dict[str, Any]]
    lines: dict[str, list[dict[str, Any]]]   # service -> log lines in time order


def record(scenario: Scenario) -> Recorded:
    """The metrics and logs of the scenario's 40 minutes."""
    rng = random.Random(f"{scenario.seed}/{scenario.kind}/traffic")
    minutes: list[dict[str, Any]] = []
    lines: dict[str, list[dict[str, Any]]] = {service: [] for service in SERVICES}
    background = set(scenario.background)
    baseline_requests = 0       # provider-timeout: of the incident endpoint, so far
    for index in range(WINDOW_MINUTES):
        at = scenario.minute(index)
        for endpoint in ENDPOINTS:
            n = rng.randint(31, 47)
            if (scenario.kind == "provider-timeout" and endpoint == scenario.endpoint
                    and index < BASELINE_MINUTES):
                if index == BASELINE_MINUTES - 1:
                    # 20 k + 15 baseline requests in all: 0.95 n is a quarter past a rank
                    # (_step_at_the_95th_rank)
                    n -= (baseline_requests + n - 15) % 20
                baseline_requests += n
            incident = (scenario.onset is not None and index >= scenario.onset
                        and endpoint == scenario.endpoint)
            blip = index == scenario.blip and endpoint == (scenario.endpoint or "POST /orders")
            # pricing-flag: POST /orders, on a thin trickle of traffic, fails too, at a higher
            # rate and from earlier on, but with fewer failed requests than GET /orders
            second = (scenario.kind == "pricing-flag" and endpoint == "POST /orders"
                      and scenario.onset is not None and index >= scenario.onset - 2)
            failing: set[int] = set()
            chains = BACKGROUND_CHAIN
            fail_ms = (9, 30)
            share = scenario.fail_share
            if (incident and scenario.kind == "stock-lock"
                    and (index - (scenario.onset or 0)) % 2):
                # requests pile up behind the lock: every other minute few get through,
                # and most of those fail (the minutes' rates differ: a mean of the
                # per-minute rates is not the rate since the onset)
                n, share = rng.randint(12, 16), 0.8
            elif incident and scenario.kind == "stock-lock" and index == scenario.onset:
                # the first bad minute has exactly 10 requests: at least 10, so it can be bad
                n = MIN_REQUESTS
            quiet_base = (scenario.kind == "stock-lock" and endpoint == scenario.endpoint
                          and index == quiet_baseline_minute(scenario))
            if quiet_base:
                # a baseline minute with a handful of requests, half of them failing (the
                # pods restarted): the baseline is every row of the first 10 minutes, a
                # quiet one too, so the baseline error rate moves by more than its tolerance
                n = rng.randint(7, 9)
            # provider-timeout: the provider wobbled two minutes before it failed for good (a
            # bad minute), then clients backed off and the endpoint saw a handful of requests,
            # most of them failing: a minute under 10 requests is not bad, however
            # many of them failed, so it ends that run and the incident begins after it
            wobble = (scenario.kind == "provider-timeout" and endpoint == scenario.endpoint
                      and scenario.onset is not None and index in (scenario.onset - 2,
                                                                   scenario.onset - 1))
            if wobble and index == (scenario.onset or 0) - 1:
                n, share = rng.randint(5, 8), 0.6
            if second:
                n = rng.randint(10, 12)
                failing = set(rng.sample(range(n), 6))
            elif incident or wobble:
                assert scenario.kind is not None
                failing = set(rng.sample(range(n), round(n * share)))
                chains = failure_chains(scenario.kind)
                fail_ms = {"provider-timeout": (2004, 2093), "stock-lock": (1001, 1062)}.get(
                    scenario.kind, (8, 31))
            elif blip:
                failing = set(rng.sample(range(n), round(n * 0.26)))
            elif quiet_base:
                failing = set(rng.sample(range(n), QUIET_BASELINE_FAILED))
            elif (index, endpoint) in background:
                failing = {rng.randrange(n)}
            slow = set(rng.sample(range(n), round(n * 0.15)))
            durations: list[float] = []
            failed_users: list[str] = []
            offsets = sorted(rng.uniform(0, 59.9) for _ in range(n))
            for i in range(n):
                when = at + timedelta(seconds=offsets[i])
                user = f"u-{rng.randint(100, 999)}"
                trace, span = _hex(rng, 32), _hex(rng, 16)
                if i in failing:
                    ms = round(rng.uniform(*fail_ms), 1)
                    failed_users.append(user)
                    _log_failure(lines, rng, when, endpoint, user, trace, span, chains, ms,
                                 CLOCK_SKEW_MS.get(scenario.kind or "", {}) if incident else {})
                else:
                    ms = round(rng.uniform(301, 342) if i in slow else rng.uniform(18, 79), 1)
                    lines["orders-api"].append(_line(
                        when, "INFO", "orders-api", trace, span, None,
                        f"{endpoint} 200 in {ms} ms", endpoint=endpoint, status=200,
                        user=user))
                    if endpoint == "POST /orders":
                        lines["notifier"].append(_line(
                            when + timedelta(milliseconds=ms + 4), "INFO", "notifier", trace,
                            _hex(rng, 16), span, "order confirmation queued"))
                durations.append(ms)
            minutes.append({"minute": _iso(at), "endpoint": endpoint, "requests": n,
                            "errors": len(failing), "durations_ms": durations,
                            "failed_users": failed_users})
    if scenario.kind == "provider-timeout":
        _step_at_the_95th_rank(rng, minutes, lines, scenario)
    for service in lines:
        lines[service].sort(key=lambda line: line["ts"])
    return Recorded(minutes, lines)


def _step_at_the_95th_rank(rng: random.Random, minutes: list[dict[str, Any]],
                           lines: dict[str, list[dict[str, Any]]], scenario: Scenario) -> None:
    """Make the incident endpoint's baseline durations step on both sides of the nearest
    rank, so that no other reading of "p95" comes within the checks' 15 % of it. The
    ceil(0.95 n)-th smallest (a successful request) takes 610-640 ms, each of the
    n - ceil(0.95 n) above it 1300-1500 ms, and every one below it is at most 342 ms. The
    baseline has 20 k + 15 requests (record() sees to it), so 0.95 n is a quarter past a rank:
    round(0.95 n) is the rank before, and an interpolated percentile weighs a neighbour of the
    nearest rank by at least a fifth (statistics.quantiles: 0.95 (n + 1), the next rank by
    0.2; numpy.percentile: 0.95 (n - 1) + 1, the rank before by 0.7). The rank before, the
    rank after, the mean and every such interpolation are each more than 15 % off. The
    successful requests' log lines say the new durations."""
    rows = [r for r in minutes[:BASELINE_MINUTES * len(ENDPOINTS)]
            if r["endpoint"] == scenario.endpoint]
    total = sum(r["requests"] for r in rows)
    outliers = total - math.ceil(0.95 * total)
    # fast successful requests only (a baseline failure takes 9-30 ms)
    fast = [(r, i) for r in rows for i, d in enumerate(r["durations_ms"]) if 31 <= d < 100]
    info: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for line in lines["orders-api"]:
        if line["level"] == "INFO":
            info.setdefault((line["ts"][:16], line["message"]), []).append(line)
    for number, (row, i) in enumerate(rng.sample(fast, outliers + 1)):
        old = row["durations_ms"][i]
        new = round(rng.uniform(610, 640) if number == 0 else rng.uniform(1300, 1500), 1)
        row["durations_ms"][i] = new
        same = info.get((row["minute"][:16], f"{row['endpoint']} 200 in {old} ms"), [])
        if same:
            same.pop()["message"] = f"{row['endpoint']} 200 in {new} ms"


def _log_failure(lines: dict[str, list[dict[str, Any]]], rng: random.Random, when: datetime,
                 endpoint: str, user: str, trace: str, span: str,
                 chains: list[tuple[str, dict[str, Any]]], ms: float,
                 skew: dict[str, float]) -> None:
    parent: str | None = None
    own = span
    for depth, (service, chain) in enumerate(chains):
        stamp = when + timedelta(milliseconds=ms - 2 * depth + skew.get(service, 0.0))
        lines[service].append(_line(
            stamp, "ERROR", service, trace, own, parent,
            f"{endpoint} failed" if service == "orders-api" else "request failed",
            endpoint=endpoint, status=_status(chain) if depth == 0 else 502, user=user,
            error=chain))
        parent, own = own, _hex(rng, 16)


def _status(chain: dict[str, Any]) -> int:
    """orders-api's answer to a failure, as the live shop gives it (_live.failure_status)."""
    types = []
    error: dict[str, Any] | None = chain
    while error is not None:
        types.append(error["type"])
        error = error.get("cause")
    if "orders.clients.DownstreamError" in types:
        return 502
    return 503 if "psycopg.errors.LockNotAvailable" in types else 500


def _line(when: datetime, level: str, service: str, trace: str, span: str,
          parent: str | None, message: str, **extra: Any) -> dict[str, Any]:
    line: dict[str, Any] = {"ts": _iso(when), "level": level, "service": service,
                            "trace_id": trace, "span_id": span, "parent_span_id": parent,
                            "message": message}
    line.update(extra)
    line.setdefault("error", None)
    return line


def write_logs(recorded: Recorded, folder: Path) -> dict[str, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = {}
    for service, service_lines in recorded.lines.items():
        path = folder / f"{service}.jsonl"
        with path.open("w", encoding="utf-8") as out:
            for line in service_lines:
                out.write(json.dumps(line) + "\n")
        paths[service] = path
    return paths


# -- the reference arithmetic the checks compare with (the README's definitions) ----------

def p95(values: list[float]) -> float:
    """Nearest rank: the ceil(0.95 n)-th smallest value."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]
