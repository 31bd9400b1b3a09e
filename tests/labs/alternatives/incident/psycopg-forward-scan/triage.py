"""A triage toolkit: where to look first when a service starts failing.

Alternative design: the database is read through psycopg directly (the SQLAlchemy URL is only
parsed), the lock graph is walked by a recursive CTE inside PostgreSQL, the index column comes
from the JSON plan, the group's committed offsets come from the AdminClient, and the runs of
bad minutes are found by a forward scan with exact fractions.
"""

from __future__ import annotations

import heapq
import json
import re
import urllib.request
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from fractions import Fraction
from pathlib import Path
from typing import Any, Iterable

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


@dataclass
class PoolLeak:
    application_name: str
    leaked: int
    by_path: dict[str, dict[str, int]]
    evidence: list[str] = field(default_factory=list)


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


# ---------------------------------------------------------------- helpers

def fetch_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read().decode("utf-8"))


def _when(value: str) -> datetime:
    moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.astimezone(timezone.utc)


def nearest_rank_p95(values: Iterable[float]) -> float:
    data = list(values)
    if not data:
        return 0.0
    rank = (95 * len(data) + 99) // 100          # ceil(0.95 n) in integers
    return float(heapq.nsmallest(rank, data)[-1])


def _connect(sources: Any) -> psycopg.Connection:
    url = make_url(str(sources.database_url) if not hasattr(sources.database_url, "drivername")
                   else sources.database_url)
    dsn = url.set(drivername="postgresql").render_as_string(hide_password=False)
    return psycopg.connect(dsn, autocommit=True)


# ---------------------------------------------------------------- stage 1

def _scan(rows: list[dict[str, Any]], baseline_minutes: set[str]) -> tuple[int | None, Fraction, float]:
    """Forward scan: the index where the run of bad minutes lasting to the end starts."""
    base = [r for r in rows if r["minute"] in baseline_minutes]
    base_req = sum(r["requests"] for r in base)
    base_rate = Fraction(sum(r["errors"] for r in base), base_req) if base_req else Fraction(0)
    base_p95 = nearest_rank_p95(d for r in base for d in r["durations_ms"])
    limit = max(Fraction(1, 20), 3 * base_rate)
    run_start: int | None = None
    for i, row in enumerate(rows):
        bad = row["requests"] >= 10 and (
            Fraction(row["errors"], row["requests"]) >= limit
            or (base_p95 > 0 and nearest_rank_p95(row["durations_ms"]) >= 3 * base_p95))
        if bad and run_start is None:
            run_start = i
        elif not bad:
            run_start = None
    return run_start, base_rate, base_p95


def impact(sources: Any) -> Impact | None:
    """Stage 1: which endpoint is failing, since when, how badly, for how many."""
    rows = fetch_json(sources.metrics_url)["minutes"]
    minutes = sorted({r["minute"] for r in rows}, key=_when)
    baseline = set(minutes[:10])
    series: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        series[r["endpoint"]].append(r)
    best: Impact | None = None
    for endpoint in sorted(series):
        ordered = sorted(series[endpoint], key=lambda r: _when(r["minute"]))
        start, base_rate, base_p95 = _scan(ordered, baseline)
        if start is None:
            continue
        tail = ordered[start:]
        requests = sum(r["requests"] for r in tail)
        failed = sum(r["errors"] for r in tail)
        onset = _when(tail[0]["minute"])
        found = Impact(
            endpoint=endpoint, since=onset,
            error_rate=failed / requests if requests else 0.0,
            baseline_error_rate=float(base_rate),
            p95_ms=nearest_rank_p95(d for r in tail for d in r["durations_ms"]),
            baseline_p95_ms=base_p95, requests=requests, failed=failed,
            users=len(set().union(*(r["failed_users"] for r in tail))),
        )
        found.evidence = [
            f"{endpoint} bad every minute since {onset:%H:%M} UTC ({len(tail)} minutes): "
            f"{failed} of {requests} requests failed, {found.users} users",
            f"baseline error rate {found.baseline_error_rate:.2%}, p95 {base_p95:.0f} ms; "
            f"now {found.error_rate:.2%}, p95 {found.p95_ms:.0f} ms",
        ]
        if best is None or found.failed > best.failed:
            best = found
    return best


# ---------------------------------------------------------------- stage 2

def what_changed(sources: Any, since: datetime) -> ChangeFinding:
    """Stage 2: the latest change in [since - 15 min, since + 1 min)."""
    changes = fetch_json(sources.changes_url)["changes"]
    lo, hi = since - timedelta(minutes=15), since + timedelta(minutes=1)
    newest_first = sorted(changes, key=lambda c: _when(c["at"]), reverse=True)
    suspect = next((c for c in newest_first if lo <= _when(c["at"]) < hi), None)
    if suspect is None:
        return ChangeFinding(None, lo, hi, [f"no change in the window {lo:%H:%M:%S} to {hi:%H:%M:%S} UTC"])
    return ChangeFinding(suspect, lo, hi, [
        f"suspect {suspect['id']}: {suspect['kind']} of {suspect['service']} at {suspect['at']} "
        f"({suspect.get('description', '')})"])


# ---------------------------------------------------------------- stage 3

def _lines_of(paths: Iterable[Path], trace_id: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for path in paths:
        with open(path, "rb") as handle:
            for raw in handle:
                try:
                    line = json.loads(raw)
                except ValueError:
                    continue
                if isinstance(line, dict) and line.get("trace_id") == trace_id:
                    out.append(line)
    return out


def _last_cause(error: dict[str, Any]) -> dict[str, Any]:
    return _last_cause(error["cause"]) if error.get("cause") else error


def root_cause(sources: Any, trace_id: str) -> RootCause | None:
    """Stage 3: walk the request's ERROR spans down from the top to the leaf."""
    errors = [l for l in _lines_of(sources.log_paths, trace_id)
              if l.get("level") == "ERROR" and l.get("error")]
    if not errors:
        return None
    by_span = {l.get("span_id"): l for l in errors}
    children: dict[Any, list[dict[str, Any]]] = defaultdict(list)
    for l in errors:
        children[l.get("parent_span_id")].append(l)
    tops = [l for l in errors if l.get("parent_span_id") not in by_span]
    node = tops[0] if tops else errors[0]
    seen = set()
    while children.get(node.get("span_id")) and id(node) not in seen:
        seen.add(id(node))
        node = children[node.get("span_id")][0]
    last = _last_cause(node["error"])
    return RootCause(trace_id, node["service"], last["type"], last["message"], [
        f"deepest ERROR in {node['service']} (span {node.get('span_id')}): {node.get('message')}",
        f"root cause {last['type']}: {last['message']}"])


# ---------------------------------------------------------------- stage 4

CHAIN_SQL = """
WITH RECURSIVE s AS MATERIALIZED (
    SELECT pid, state, query, xact_start, pg_blocking_pids(pid) AS blocked_by
      FROM pg_stat_activity
     WHERE datname = current_database() AND pid <> pg_backend_pid()
), edge AS (
    SELECT DISTINCT unnest(blocked_by) AS holder, pid AS waiter FROM s
), behind(head, waiter) AS (
    SELECT holder, waiter FROM edge
    UNION
    SELECT b.head, e.waiter FROM behind b JOIN edge e ON e.holder = b.waiter
), heads AS (
    SELECT head, array_agg(DISTINCT waiter ORDER BY waiter) AS waiters,
           count(DISTINCT waiter) AS n
      FROM behind
     WHERE NOT EXISTS (SELECT 1 FROM s WHERE s.pid = behind.head AND cardinality(s.blocked_by) > 0)
     GROUP BY head
)
SELECT h.head, h.waiters, s.state, s.query,
       EXTRACT(EPOCH FROM now() - s.xact_start)::float8 AS held
  FROM heads h LEFT JOIN s ON s.pid = h.head
 ORDER BY h.n DESC, h.head
 LIMIT 1
"""


def blocking_chain(sources: Any) -> Blocking | None:
    """Stage 4: the head of the longest lock queue, found inside PostgreSQL."""
    with _connect(sources) as conn:
        row = conn.execute(CHAIN_SQL).fetchone()
    if row is None:
        return None
    head, waiters, state, query, held = row
    state = state or ""
    advice = "terminate" if state in ("idle in transaction", "idle in transaction (aborted)") else "wait"
    waiters = [int(p) for p in waiters]
    return Blocking(int(head), query or "", state, float(held or 0.0), waiters, advice, [
        f"blocker pid {head} ({state}) has held its transaction for {float(held or 0):.1f} s",
        f"{len(waiters)} sessions wait behind it: {waiters}"])


# ---------------------------------------------------------------- stage 5

STATS_SQL = """
SELECT queryid, calls, total_exec_time, query
  FROM pg_stat_statements
 WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
   AND queryid IS NOT NULL
"""


def statement_stats(sources: Any) -> list[list[Any]]:
    """Stage 5: the raw rows [queryid, calls, total ms, toplevel?-less query] of the shop's db."""
    with _connect(sources) as conn:
        return [[int(q), int(c), float(t), text] for q, c, t, text in conn.execute(STATS_SQL)]


def _fold(rows: list[list[Any]]) -> dict[int, list[Any]]:
    out: dict[int, list[Any]] = {}
    for queryid, calls, total, text in rows:
        acc = out.setdefault(queryid, [0, 0.0, []])
        acc[0] += calls
        acc[1] += total
        acc[2].append(text)
    return out


def _plan_nodes(node: dict[str, Any]) -> Iterable[dict[str, Any]]:
    yield node
    for child in node.get("Plans", []):
        yield from _plan_nodes(child)


def slow_query(sources: Any, before: list[list[Any]]) -> SlowQuery | None:
    then, now = _fold(before), _fold(statement_stats(sources))
    best: tuple[float, int, int, int, float, float] | None = None
    for queryid, (calls, total, _) in now.items():
        c0, t0, _ = then.get(queryid, (0, 0.0, []))
        c1, t1 = calls - c0, total - t0
        if c0 < 3 or c1 < 3:
            continue
        m0, m1 = t0 / c0, t1 / c1
        if m1 >= 3 * m0 and m1 - m0 >= 1.0:
            factor = m1 / m0 if m0 > 0 else float("inf")
            if best is None or factor > best[0]:
                best = (factor, queryid, c0, c1, m0, m1)
    if best is None:
        return None
    factor, queryid, c0, c1, m0, m1 = best
    texts = sorted(set(now[queryid][2]))
    with _connect(sources) as conn:
        query, plan, tree = texts[0], "", None
        for text in texts:                      # the text that EXPLAIN accepts
            try:
                plan = "\n".join(r[0] for r in conn.execute("EXPLAIN (GENERIC_PLAN) " + text))
                tree = conn.execute("EXPLAIN (GENERIC_PLAN, FORMAT JSON) " + text).fetchone()[0]
                query = text
                break
            except psycopg.Error:
                continue
    index = ""
    if tree:
        top = tree[0]["Plan"] if isinstance(tree, list) else json.loads(tree)[0]["Plan"]
        for node in _plan_nodes(top):
            if node.get("Node Type") == "Seq Scan" and node.get("Filter"):
                column = re.search(r"(\w+)\)?(?:::[\w ]+)? = \$\d", node["Filter"])
                if column:
                    index = (f'CREATE INDEX CONCURRENTLY ON "{node["Relation Name"]}" '
                             f'("{column.group(1)}")')
                    break
    return SlowQuery(queryid, query, c0, c1, m0, m1, plan, index, [
        f"queryid {queryid} regressed {factor:.1f}x: {m0:.3f} ms -> {m1:.3f} ms per call "
        f"({c0} calls before, {c1} after)",
        f"fix: {index}"])


# ---------------------------------------------------------------- stage 6

def connection_leak(sources: Any) -> PoolLeak | None:
    with _connect(sources) as conn:
        rows = conn.execute(
            "SELECT application_name, state FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()").fetchall()
    counts = Counter((name or "", state or "") for name, state in rows)
    by_path: dict[str, dict[str, int]] = {}
    for (name, state), n in counts.items():
        by_path.setdefault(name, {})[state] = n
    leaked = Counter()
    for (name, state), n in counts.items():
        if state.startswith("idle in transaction"):
            leaked[name] += n
    candidates = [(n, name) for name, n in leaked.items() if n >= 3]
    if not candidates:
        return None
    n, name = max(candidates)
    return PoolLeak(name, n, by_path, [
        f"path {name} has {n} connections checked out and never returned "
        f"(idle in transaction, aborted included)"])


# ---------------------------------------------------------------- stage 7

def _offsets(sources: Any) -> dict[int, tuple[int, int]]:
    from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, TopicPartition
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(dict(sources.kafka))
    meta = admin.list_topics(sources.topic, timeout=10).topics[sources.topic]
    parts = sorted(meta.partitions)
    request = ConsumerGroupTopicPartitions(sources.group,
                                           [TopicPartition(sources.topic, p) for p in parts])
    future = admin.list_consumer_group_offsets([request])[sources.group]
    committed = {tp.partition: tp.offset for tp in future.result(timeout=10).topic_partitions}
    # a throwaway consumer of its own group only reads watermarks: it never joins or commits
    peek = Consumer({**sources.kafka, "group.id": f"triage-peek-{uuid.uuid4().hex}",
                     "enable.auto.commit": False})
    try:
        out = {}
        for p in parts:
            low, high = peek.get_watermark_offsets(TopicPartition(sources.topic, p),
                                                   timeout=10, cached=False)
            c = committed.get(p, -1)
            out[p] = (c if c >= 0 else low, high)
        return out
    finally:
        peek.close()


def lag_snapshot(sources: Any) -> dict[str, list[int]]:
    return {str(p): [c, e] for p, (c, e) in _offsets(sources).items()}


def consumer_lag(sources: Any, before: dict[str, list[int]]) -> ConsumerLag | None:
    from confluent_kafka import Consumer, TopicPartition

    now = _offsets(sources)
    lag = {p: e - c for p, (c, e) in now.items()}
    then = {int(p): v[0] for p, v in before.items()}
    stuck = sorted((p for p in now if lag[p] > 0 and then.get(p) == now[p][0]),
                   key=lambda p: -lag[p])
    moving = [p for p in now if lag[p] > 0 and p in then and now[p][0] != then[p]]
    if not stuck:
        return None
    partition = stuck[0]
    offset = now[partition][0]
    reader = Consumer({**sources.kafka, "group.id": f"triage-peek-{uuid.uuid4().hex}",
                       "enable.auto.commit": False})
    record = None
    try:
        reader.assign([TopicPartition(sources.topic, partition, offset)])
        for _ in range(60):
            msg = reader.poll(0.25)
            if msg is not None and msg.error() is None and msg.offset() == offset:
                record = msg
                break
    finally:
        reader.close()
    key = None
    headers: dict[str, str] = {}
    if record is not None:
        raw = record.key()
        key = None if raw is None else bytes(raw).decode("utf-8")
        for name, value in record.headers() or []:
            headers[name] = (value or b"").decode("utf-8")
    return ConsumerLag(sources.topic, sources.group, lag, moving, partition, offset, key, headers, [
        f"partition {partition} stuck at offset {offset} with {lag[partition]} records waiting",
        f"record key {key!r}, headers {headers}"])


# ---------------------------------------------------------------- stage 8

def downstream(sources: Any) -> Downstream | None:
    metrics = fetch_json(sources.metrics_url)
    deps = {d["dependency"]: d for d in metrics["dependencies"]}
    series: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in metrics["outbound"]:
        series[r["dependency"]].append(r)
    onsets: dict[str, int] = {}
    for name, rows in series.items():
        rows.sort(key=lambda r: _when(r["minute"]))
        run: int | None = None
        for i, r in enumerate(rows):
            bad = r["short_circuited"] > 0 or (
                r["calls"] > 0 and Fraction(r["timeouts"], r["calls"]) >= Fraction(1, 5))
            run = (i if run is None else run) if bad else None
        if run is not None:
            onsets[name] = run
    if not onsets:
        return None
    name = max(onsets, key=lambda n: sum(r["timeouts"] for r in series[n][onsets[n]:]))
    tail = series[name][onsets[name]:]
    since = _when(tail[0]["minute"])
    sent = sum(r["calls"] for r in tail)
    timeouts = sum(r["timeouts"] for r in tail)
    caused = own = 0
    for r in metrics["minutes"]:
        if _when(r["minute"]) >= since:
            causes = r.get("errors_by_cause") or {}
            caused += causes.get(name, 0)
            own += causes.get("own", 0)
    by_dependency = {}
    for dep, rows in series.items():
        calls = sum(r["calls"] for r in rows)
        by_dependency[dep] = {
            "error_rate": sum(r["errors"] for r in rows) / calls if calls else 0.0,
            "p95_ms": nearest_rank_p95(d for r in rows for d in r["durations_ms"]),
            "breaker": deps.get(dep, {}).get("breaker", "closed"),
        }
    return Downstream(name, since, timeouts / sent if sent else 0.0,
                      deps[name]["breaker"], caused, own, by_dependency, [
        f"dependency {name} failing since {since:%H:%M} UTC: {timeouts} timeouts of {sent} calls",
        f"inbound errors since then: {caused} caused by {name}, {own} own"])


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
            return "healthy: no endpoint has a run of bad minutes lasting to now."
        i = self.impact
        assert i is not None
        note = [f"{i.endpoint} has been failing since {i.since.astimezone(timezone.utc):%H:%M} UTC "
                f"({i.failed}/{i.requests} requests, {i.users} users).",
                f"Do first: {self.mitigation} {self.target}.",
                f"Suspect change: {self.suspect or 'none'}; root cause: "
                f"{self.root_cause.exception if self.root_cause else 'unknown'}.",
                f"Missing alarm: {self.missing_alarm}"]
        return "\n".join(note + ["evidence:"] + [f"* {e}" for e in self.evidence])


def triage(sources: Any) -> Report:
    scope = impact(sources)
    if scope is None:
        return Report(True, evidence=["healthy: no endpoint in an incident"])
    onset = scope.since.astimezone(timezone.utc)
    evidence = [f"onset {onset:%H:%M} UTC on {scope.endpoint}"] + scope.evidence
    change = what_changed(sources, scope.since)
    evidence += change.evidence
    cause = None
    for _ in range(4):
        status, trace = sources.request(scope.endpoint)
        if status >= 500:
            cause = root_cause(sources, str(trace))
            break
    if cause is not None:
        evidence.append(f"root cause {cause.exception} in {cause.service}")
    connection_leak(sources)
    chain = blocking_chain(sources)
    suspect = change.suspect["id"] if change.suspect else None
    if chain is not None and chain.advice == "terminate":
        mitigation, target = "terminate", chain.blocker_pid
        evidence.append(f"blocker pid {chain.blocker_pid} idle in transaction")
    elif suspect is not None:
        mitigation, target = "rollback", suspect
    else:
        mitigation, target = None, None
    alarm = (f"page on {scope.endpoint}: error rate or p95 over its threshold for one minute "
             f"(would have fired at {onset:%H:%M} UTC)")
    return Report(False, scope, suspect, cause, mitigation, target, alarm, evidence)
