"""A correct triage toolkit that differs from the reference: NamedTuple findings, a linearly
interpolated p95 (within the README's tolerance), a change window kept as a pair of
datetimes, a root cause found by walking span depths, and plain psycopg (no SQLAlchemy) with
one recursive query for the lock chain."""

from __future__ import annotations

import json
import urllib.request
from datetime import datetime, timedelta
from itertools import groupby
from typing import Any, NamedTuple

import psycopg
from sqlalchemy.engine import make_url


class Impact(NamedTuple):
    endpoint: str
    since: datetime
    error_rate: float
    baseline_error_rate: float
    p95_ms: float
    baseline_p95_ms: float
    requests: int
    failed: int
    users: int
    evidence: list[str]


class ChangeFinding(NamedTuple):
    suspect: dict[str, Any] | None
    window_start: datetime
    window_end: datetime
    evidence: list[str]


class RootCause(NamedTuple):
    trace_id: str
    service: str
    exception: str
    message: str
    evidence: list[str]


class Blocking(NamedTuple):
    blocker_pid: int
    blocker_query: str
    blocker_state: str
    held_for_s: float
    waiting_pids: list[int]
    advice: str
    evidence: list[str]


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read().decode("utf-8"))


def _at(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def _p95(values: list[float]) -> float:
    """Linear interpolation between the closest ranks (numpy's default)."""
    ordered = sorted(values)
    if not ordered:
        return 0.0
    position = 0.95 * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def impact(sources: Any) -> Impact | None:
    rows = sorted(_get(sources.metrics_url)["minutes"],
                  key=lambda r: (r["endpoint"], r["minute"]))
    start = min(_at(r["minute"]) for r in rows)
    best: Impact | None = None
    for endpoint, group in groupby(rows, key=lambda r: r["endpoint"]):
        series = list(group)
        base = [r for r in series if _at(r["minute"]) - start < timedelta(minutes=10)]
        base_requests = sum(r["requests"] for r in base)
        base_rate = sum(r["errors"] for r in base) / base_requests
        base_p95 = _p95([d for r in base for d in r["durations_ms"]])
        flags = [r["requests"] >= 10 and (
            r["errors"] / r["requests"] >= max(0.05, 3 * base_rate)
            or _p95(r["durations_ms"]) >= 3 * base_p95) for r in series]
        if not flags[-1]:
            continue
        first = len(flags) - 1
        while first > 0 and flags[first - 1]:
            first -= 1
        tail = series[first:]
        requests = sum(r["requests"] for r in tail)
        failed = sum(r["errors"] for r in tail)
        found = Impact(
            endpoint, _at(tail[0]["minute"]), failed / requests, base_rate,
            _p95([d for r in tail for d in r["durations_ms"]]), base_p95, requests, failed,
            len({u for r in tail for u in r["failed_users"]}),
            [f"{endpoint} bad from {_at(tail[0]['minute']).strftime('%H:%M')} UTC "
             f"({len(tail)} minutes)"])
        if best is None or found.failed > best.failed:
            best = found
    return best


def what_changed(sources: Any, since: datetime) -> ChangeFinding:
    window = (since - timedelta(minutes=15), since + timedelta(minutes=1))
    candidates = sorted((c for c in _get(sources.changes_url)["changes"]
                         if window[0] <= _at(c["at"]) < window[1]),
                        key=lambda c: c["at"])
    if candidates:
        last = candidates[-1]
        return ChangeFinding(last, *window, [f"change {last['id']} ({last['kind']}) "
                                             f"at {last['at']}"])
    return ChangeFinding(None, *window, ["nothing in the change log in the window"])


def root_cause(sources: Any, trace_id: str) -> RootCause | None:
    lines = []
    for path in sources.log_paths:
        for raw in path.read_text(encoding="utf-8").splitlines():
            line = json.loads(raw)
            if line.get("trace_id") == trace_id:
                lines.append(line)
    parent_of = {line["span_id"]: line.get("parent_span_id") for line in lines}

    def depth(span: str | None) -> int:
        hops = 0
        while span is not None and span in parent_of:
            span = parent_of[span]
            hops += 1
        return hops

    errors = [line for line in lines if line["level"] == "ERROR" and line.get("error")]
    if not errors:
        return None
    line = max(errors, key=lambda item: depth(item["span_id"]))

    def last(error: dict[str, Any]) -> dict[str, Any]:
        return last(error["cause"]) if error.get("cause") else error

    root = last(line["error"])
    return RootCause(trace_id, line["service"], root["type"], root["message"],
                     [f"{line['service']} logged {root['type']}: {root['message']}"])


CHAIN_SQL = """
WITH RECURSIVE edge AS (
    SELECT pid AS waiter, unnest(pg_blocking_pids(pid)) AS holder
      FROM pg_stat_activity
     WHERE datname = current_database() AND pid <> pg_backend_pid()
), behind(head, waiter) AS (
    SELECT holder, waiter FROM edge
     WHERE holder NOT IN (SELECT waiter FROM edge)
    UNION
    SELECT behind.head, edge.waiter FROM behind JOIN edge ON edge.holder = behind.waiter
)
SELECT head, array_agg(DISTINCT waiter ORDER BY waiter) AS waiters
  FROM behind GROUP BY head ORDER BY count(DISTINCT waiter) DESC LIMIT 1
"""


def blocking_chain(sources: Any) -> Blocking | None:
    url = make_url(sources.database_url)
    with psycopg.connect(host=url.host, port=url.port, user=url.username,
                         password=url.password, dbname=url.database, autocommit=True) as conn:
        head = conn.execute(CHAIN_SQL).fetchone()
        if head is None:
            return None
        pid, waiters = head
        row = conn.execute(
            "SELECT state, query, extract(epoch FROM clock_timestamp() - xact_start) "
            "FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()
    assert row is not None
    state, query, held = row
    advice = "wait" if state == "active" else "terminate"
    return Blocking(pid, query, state, float(held), list(waiters), advice,
                    [f"head of the chain: pid {pid}, {state}, {len(waiters)} behind it"])
