"""Correct design 1: psycopg directly (autocommit), graph work done in SQL (recursive CTE),
exact fractions for rates, one Kafka consumer per look, stage 3 via an explicit span tree."""

from __future__ import annotations

import json
import math
import urllib.request
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from fractions import Fraction
from typing import Any

import psycopg
from sqlalchemy.engine import make_url


@dataclass
class Impact:
    endpoint: str
    since: datetime
    error_rate: float
    baseline_error_rate: float
    p95_ms: float
    baseline_p95_ms: float
    requests: int
    failed: int
    users: int
    evidence: list[str] = field(default_factory=list)


@dataclass
class ChangeFinding:
    suspect: dict[str, Any] | None
    window_start: datetime
    window_end: datetime
    evidence: list[str] = field(default_factory=list)


@dataclass
class RootCause:
    trace_id: str
    service: str
    exception: str
    message: str
    evidence: list[str] = field(default_factory=list)


@dataclass
class Blocking:
    blocker_pid: int
    blocker_query: str
    blocker_state: str
    held_for_s: float
    waiting_pids: list[int]
    advice: str
    evidence: list[str] = field(default_factory=list)


@dataclass
class SlowQuery:
    queryid: int
    query: str
    calls_before: int
    calls_after: int
    mean_ms_before: float
    mean_ms_after: float
    plan: str
    index: str
    evidence: list[str] = field(default_factory=list)


def get(url: str) -> Any:
    req = urllib.request.Request(url, headers={"Accept": "application/json"})
    with urllib.request.urlopen(req, timeout=15) as r:
        return json.loads(r.read().decode("utf-8"))


def ts(value: str) -> datetime:
    # handles "...Z" and "+00:00"; always aware
    d = datetime.fromisoformat(value.replace("Z", "+00:00"))
    return d if d.tzinfo else d.replace(tzinfo=timezone.utc)


def nearest_rank(values: list[float], q: Fraction = Fraction(95, 100)) -> float:
    if not values:
        return 0.0
    s = sorted(values)
    k = math.ceil(q * len(s))           # exact: no float rounding at multiples of 20
    return float(s[max(k, 1) - 1])


def connect(sources: Any) -> psycopg.Connection:
    u = make_url(str(sources.database_url) if not hasattr(sources.database_url, "drivername")
                 else sources.database_url)
    return psycopg.connect(host=u.host, port=u.port, user=u.username, password=u.password,
                           dbname=u.database, autocommit=True, connect_timeout=10)


# ---------------------------------------------------------------- stage 1
def impact(sources: Any) -> Impact | None:
    rows = get(sources.metrics_url)["minutes"]
    series: dict[str, dict[datetime, dict]] = {}
    for r in rows:
        series.setdefault(r["endpoint"], {})[ts(r["minute"])] = r
    candidates = []
    for endpoint, by_minute in series.items():
        minutes = sorted(by_minute)
        ordered = [by_minute[m] for m in minutes]
        base = ordered[:10]             # one row per minute: the first ten rows are the baseline
        base_req = sum(r["requests"] for r in base)
        base_rate = Fraction(sum(r["errors"] for r in base), base_req) if base_req else Fraction(0)
        base_p95 = nearest_rank([d for r in base for d in r["durations_ms"]])
        err_threshold = max(Fraction(5, 100), 3 * base_rate)

        flags = []
        for r in ordered:
            if r["requests"] < 10:
                flags.append(False)
                continue
            rate = Fraction(r["errors"], r["requests"])
            slow = base_p95 > 0 and nearest_rank(r["durations_ms"]) >= 3 * base_p95
            flags.append(rate >= err_threshold or slow)
        if not flags or not flags[-1]:
            continue
        # index of the first minute of the final run of True flags
        onset = len(flags) - 1
        for i in range(len(flags) - 1, -1, -1):
            if not flags[i]:
                break
            onset = i
        tail = ordered[onset:]
        req = sum(r["requests"] for r in tail)
        failed = sum(r["errors"] for r in tail)
        users = set()
        for r in tail:
            users.update(r["failed_users"])
        since = minutes[onset]
        candidates.append(Impact(
            endpoint, since, float(Fraction(failed, req)) if req else 0.0, float(base_rate),
            nearest_rank([d for r in tail for d in r["durations_ms"]]), base_p95,
            req, failed, len(users),
            [f"{endpoint} bad since {since.astimezone(timezone.utc):%H:%M} UTC "
             f"({len(tail)} bad minutes in a row to now)",
             f"{failed}/{req} failed, {len(users)} users; baseline rate {float(base_rate):.3f}"]))
    if not candidates:
        return None
    candidates.sort(key=lambda i: i.failed, reverse=True)
    return candidates[0]


# ---------------------------------------------------------------- stage 2
def what_changed(sources: Any, since: datetime) -> ChangeFinding:
    since_utc = since.astimezone(timezone.utc)
    lo, hi = since_utc - timedelta(minutes=15), since_utc + timedelta(minutes=1)
    log = get(sources.changes_url)["changes"]
    ordered = sorted(log, key=lambda c: ts(c["at"]), reverse=True)
    for c in ordered:
        at = ts(c["at"])
        if lo <= at < hi:
            return ChangeFinding(c, lo, hi, [
                f"suspect {c['id']} ({c['kind']} {c['service']}) at {c['at']}: "
                f"{c['description']}"])
    return ChangeFinding(None, lo, hi, ["no change in the window"])


# ---------------------------------------------------------------- stage 3
def root_cause(sources: Any, trace_id: str) -> RootCause | None:
    mine: list[dict] = []
    for path in sources.log_paths:
        try:
            content = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            continue
        for raw in content.splitlines():
            raw = raw.strip()
            if not raw:
                continue
            try:
                obj = json.loads(raw)
            except json.JSONDecodeError:
                continue
            if isinstance(obj, dict) and obj.get("trace_id") == trace_id:
                mine.append(obj)
    errs = [o for o in mine if o.get("level") == "ERROR" and isinstance(o.get("error"), dict)]
    if not errs:
        return None
    # span tree of the ERROR lines only: the leaf is the deepest
    children: dict[str | None, list[dict]] = {}
    for o in errs:
        children.setdefault(o.get("parent_span_id"), []).append(o)
    leaves = [o for o in errs if not children.get(o.get("span_id"))]
    leaf = (leaves or errs)[0]
    exc = leaf["error"]
    depth = 0
    while isinstance(exc.get("cause"), dict):
        exc = exc["cause"]
        depth += 1
    return RootCause(trace_id, leaf["service"], exc["type"], exc["message"], [
        f"deepest ERROR in {leaf['service']} (span {leaf.get('span_id')})",
        f"root cause {exc['type']}: {exc['message']} ({depth} cause(s) deep)"])


# ---------------------------------------------------------------- stage 4
CHAIN_SQL = """
WITH RECURSIVE s AS (
    SELECT pid, state, query, xact_start, pg_blocking_pids(pid) AS by
      FROM pg_stat_activity
     WHERE datname = current_database() AND pid <> pg_backend_pid()
), edge AS (                        -- holder blocks waiter
    SELECT unnest(by) AS holder, pid AS waiter FROM s
), reach AS (
    SELECT holder AS head, waiter FROM edge
    UNION
    SELECT r.head, e.waiter FROM reach r JOIN edge e ON e.holder = r.waiter
), heads AS (
    SELECT r.head, array_agg(DISTINCT r.waiter) AS waiters, count(DISTINCT r.waiter) AS n
      FROM reach r
     WHERE NOT EXISTS (SELECT 1 FROM s WHERE s.pid = r.head AND cardinality(s.by) > 0)
     GROUP BY r.head
)
SELECT h.head, h.waiters, h.n, a.state, a.query,
       EXTRACT(EPOCH FROM (now() - a.xact_start))::float8 AS held
  FROM heads h LEFT JOIN pg_stat_activity a ON a.pid = h.head
 ORDER BY h.n DESC
 LIMIT 1
"""


def blocking_chain(sources: Any) -> Blocking | None:
    with connect(sources) as conn:
        row = conn.execute(CHAIN_SQL).fetchone()
    if row is None:
        return None
    head, waiters, _, state, query, held = row
    state = state or ""
    advice = "terminate" if state in ("idle in transaction",
                                      "idle in transaction (aborted)") else "wait"
    return Blocking(int(head), query or "", state, float(held or 0.0),
                    sorted(int(w) for w in waiters), advice,
                    [f"blocker pid {head} is {state!r} for {float(held or 0):.1f} s",
                     f"waiting behind it: {sorted(waiters)}"])


# ---------------------------------------------------------------- stage 5
SNAP_SQL = """
SELECT s.queryid,
       (SELECT q.query FROM pg_stat_statements q
         WHERE q.queryid = s.queryid AND q.dbid = s.dbid AND q.toplevel LIMIT 1) AS top_text,
       min(s.query) AS any_text,
       sum(s.calls)::bigint, sum(s.total_exec_time)::float8
  FROM pg_stat_statements s
 WHERE s.dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
   AND s.queryid IS NOT NULL
 GROUP BY s.queryid, s.dbid
"""


def statement_stats(sources: Any) -> dict[str, list]:
    with connect(sources) as conn:
        rows = conn.execute(SNAP_SQL).fetchall()
    # JSON-friendly shape: {"queryid": [text, calls, total_ms]}
    return {str(qid): [top or anyt, int(calls), float(total)]
            for qid, top, anyt, calls, total in rows}


def slow_query(sources: Any, before: dict[str, list]) -> SlowQuery | None:
    now = statement_stats(sources)
    best = None
    for qid, (text_, calls, total) in now.items():
        if qid not in before:
            continue
        _, c0, t0 = before[qid]
        c1, t1 = calls - c0, total - t0
        if c0 < 3 or c1 < 3:
            continue
        m0, m1 = t0 / c0, t1 / c1
        if not (m1 >= 3 * m0 and m1 >= m0 + 1.0):
            continue
        factor = m1 / m0 if m0 > 0 else float("inf")
        if best is None or factor > best[0]:
            best = (factor, int(qid), text_, c0, c1, m0, m1)
    if best is None:
        return None
    factor, qid, query, c0, c1, m0, m1 = best
    with connect(sources) as conn:
        with conn.cursor() as cur:
            # psycopg sends a query without params as is ($1 stays a placeholder for EXPLAIN)
            cur.execute("EXPLAIN (GENERIC_PLAN) " + query)
            plan_lines = [r[0] for r in cur.fetchall()]
    plan = "\n".join(plan_lines)
    index = ""
    import re
    table = re.search(r"Seq Scan on (\w+)", plan)
    col = re.search(r"Filter: \(+(\w+)\)?(?:::[\w ]+)? = ", plan)
    if table and col:
        index = f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {table.group(1)}_{col.group(1)}_idx " \
                f"ON {table.group(1)} ({col.group(1)})"
    return SlowQuery(qid, query, c0, c1, m0, m1, plan, index, [
        f"queryid {qid} mean {m0:.3f} -> {m1:.3f} ms ({factor:.1f}x)", plan_lines[0]])


# ---------------------------------------------------------------- stage 6
@dataclass
class PoolLeak:
    application_name: str
    leaked: int
    by_path: dict[str, dict[str, int]]
    evidence: list[str] = field(default_factory=list)


LEAK_SQL = """
SELECT coalesce(application_name, ''), coalesce(state, ''), count(*)::int
  FROM pg_stat_activity
 WHERE datname = current_database() AND pid <> pg_backend_pid()
 GROUP BY 1, 2
"""


def connection_leak(sources: Any) -> PoolLeak | None:
    with connect(sources) as conn:
        rows = conn.execute(LEAK_SQL).fetchall()
    by_path: dict[str, dict[str, int]] = {}
    for app, state, n in rows:
        by_path.setdefault(app, {})[state] = n
    forgotten = {app: sum(n for st, n in states.items() if st.startswith("idle in transaction"))
                 for app, states in by_path.items()}
    leaking = sorted((n, app) for app, n in forgotten.items() if n >= 3)
    if not leaking:
        return None
    n, app = leaking[-1]
    return PoolLeak(app, n, by_path, [f"path {app} has {n} sessions idle in transaction",
                                      f"sessions by path and state: {by_path}"])


# ---------------------------------------------------------------- stage 7
@dataclass
class ConsumerLag:
    topic: str
    group: str
    lag: dict[int, int]
    moving: list[int]
    partition: int
    offset: int
    key: str | None
    headers: dict[str, str]
    evidence: list[str] = field(default_factory=list)


def _look(sources: Any, read_at: tuple[int, int] | None = None):
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({**sources.kafka, "group.id": sources.group, "enable.auto.commit": False,
                  "enable.auto.offset.store": False, "auto.offset.reset": "earliest"})
    try:
        meta = c.list_topics(sources.topic, timeout=10).topics[sources.topic]
        tps = [TopicPartition(sources.topic, p) for p in sorted(meta.partitions)]
        out = {}
        for tp in c.committed(tps, timeout=10):
            _, high = c.get_watermark_offsets(tp, timeout=10, cached=False)
            out[tp.partition] = {"committed": tp.offset, "end": high}
        record = None
        if read_at is not None:
            p, off = read_at
            c.assign([TopicPartition(sources.topic, p, off)])
            for _ in range(150):
                m = c.poll(0.2)
                if m is None or m.error():
                    continue
                if m.partition() == p and m.offset() == off:
                    record = m
                    break
        return out, record
    finally:
        c.close()


def lag_snapshot(sources: Any) -> dict:
    offsets, _ = _look(sources)
    return offsets


def consumer_lag(sources: Any, before: dict) -> ConsumerLag | None:
    now, _ = _look(sources)
    lag = {p: v["end"] - v["committed"] for p, v in now.items()}
    moving, stuck = [], []
    for p, v in now.items():
        if lag[p] <= 0 or p not in before:
            continue
        (moving if v["committed"] != before[p]["committed"] else stuck).append(p)
    if not stuck:
        return None
    p = max(stuck, key=lambda q: lag[q])
    off = now[p]["committed"]
    _, rec = _look(sources, (p, off))
    key = None
    headers: dict[str, str] = {}
    if rec is not None:
        k = rec.key()
        key = None if k is None else bytes(k).decode("utf-8")
        for name, value in rec.headers() or []:
            headers[name] = "" if value is None else bytes(value).decode("utf-8")
    return ConsumerLag(sources.topic, sources.group, lag, sorted(moving), p, off, key, headers,
                       [f"stuck at offset {off} of partition {p}, lag {lag[p]}",
                        f"record key {key!r} headers {headers}"])


# ---------------------------------------------------------------- stage 8
@dataclass
class Downstream:
    dependency: str
    since: datetime
    timeout_rate: float
    breaker: str
    caused_errors: int
    own_errors: int
    by_dependency: dict[str, dict[str, Any]]
    evidence: list[str] = field(default_factory=list)


def downstream(sources: Any) -> Downstream | None:
    m = get(sources.metrics_url)
    deps = {d["dependency"]: d for d in m["dependencies"]}
    series: dict[str, list[dict]] = {}
    for r in m["outbound"]:
        series.setdefault(r["dependency"], []).append(r)
    by_dep = {}
    failing = []
    for name, rows in series.items():
        rows = sorted(rows, key=lambda r: ts(r["minute"]))
        sent = sum(r["calls"] for r in rows)
        by_dep[name] = {"error_rate": sum(r["errors"] for r in rows) / sent if sent else 0.0,
                        "p95_ms": nearest_rank([d for r in rows for d in r["durations_ms"]]),
                        "breaker": deps[name]["breaker"]}
        bad = [r["short_circuited"] > 0 or (r["calls"] > 0 and 5 * r["timeouts"] >= r["calls"])
               for r in rows]
        if not bad or not bad[-1]:
            continue
        i = len(bad)
        while i and bad[i - 1]:
            i -= 1
        run = rows[i:]
        failing.append((sum(r["timeouts"] for r in run), name, ts(run[0]["minute"]),
                        sum(r["calls"] for r in run)))
    if not failing:
        return None
    failing.sort(key=lambda f: f[0], reverse=True)
    timeouts, name, since, sent = failing[0]
    caused = own = 0
    for r in m["minutes"]:
        if ts(r["minute"]) >= since:
            caused += r.get("errors_by_cause", {}).get(name, 0)
            own += r.get("errors_by_cause", {}).get("own", 0)
    return Downstream(name, since, timeouts / sent if sent else 0.0, deps[name]["breaker"],
                      caused, own, by_dep,
                      [f"dependency {name} failing since {since:%H:%M}: {timeouts}/{sent} "
                       f"timed out, breaker {deps[name]['breaker']}",
                       f"inbound: {caused} caused by {name}, {own} own"])


# ---------------------------------------------------------------- stage 9
@dataclass
class Report:
    healthy: bool
    impact: Impact | None = None
    suspect: str | None = None
    root_cause: RootCause | None = None
    mitigation: str | None = None
    target: str | int | None = None
    missing_alarm: str | None = None
    evidence: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        if self.healthy:
            return "healthy: no endpoint is in an incident; nothing to do."
        i = self.impact
        return "\n".join([
            f"{i.endpoint} is failing since {i.since.astimezone(timezone.utc):%H:%M} UTC",
            f"first: {self.mitigation} {self.target}",
            f"suspect: {self.suspect}; root cause: "
            f"{self.root_cause.exception if self.root_cause else 'unknown'}",
            f"alarm: {self.missing_alarm}",
            *("* " + e for e in self.evidence)])


def triage(sources: Any) -> Report:
    found = impact(sources)
    if found is None:
        return Report(True, evidence=["metrics: no endpoint bad in its last minute"])
    ev = [f"onset {found.since.astimezone(timezone.utc):%H:%M} on {found.endpoint}"]
    ev += found.evidence
    change = what_changed(sources, found.since)
    ev += change.evidence
    cause = None
    for _ in range(5):
        status, trace = sources.request(found.endpoint)
        if status >= 500:
            cause = root_cause(sources, trace)
            break
    if cause:
        ev.append(f"root cause {cause.exception} in {cause.service}")
    chain = blocking_chain(sources)
    suspect = change.suspect["id"] if change.suspect else None
    if chain and chain.advice == "terminate":
        mitigation, target = "terminate", chain.blocker_pid
        ev.append(f"blocker pid {chain.blocker_pid} idle in transaction")
    elif suspect:
        mitigation, target = "rollback", suspect
    else:
        mitigation, target = None, None
    return Report(False, found, suspect, cause, mitigation, target,
                  f"page when {found.endpoint} error rate or p95 crosses its threshold", ev)
