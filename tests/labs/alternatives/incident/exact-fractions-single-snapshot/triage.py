"""A triage toolkit: where to look first when a service starts failing.

Each function reads one kind of signal (metrics, the change log, the logs of one request,
the database's sessions) and returns a finding with the evidence that supports it, or None
when that signal shows nothing wrong.
"""

from __future__ import annotations

import json
import math
from fractions import Fraction
import urllib.request
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool

BASELINE_MINUTES = 10
MIN_REQUESTS = 10
ERROR_RATE_FLOOR = 0.05
FACTOR = 3
CHANGE_WINDOW = timedelta(minutes=15)


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


def _get(url: str) -> Any:
    request = urllib.request.Request(url, headers={"Accept": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read().decode("utf-8"))


def _when(value: str) -> datetime:
    # Python 3.11+ reads the trailing "Z"; replace it anyway for older interpreters.
    if value.endswith("Z"):
        value = value[:-1] + "+00:00"
    return datetime.fromisoformat(value)


def _nearest_rank_p95(durations: list[float]) -> float:
    if not durations:
        return 0.0
    ranked = sorted(durations)
    rank = math.ceil(Fraction(95, 100) * len(ranked))  # exact: no 0.95 * n rounding surprise
    return float(ranked[max(rank, 1) - 1])


class _Series:
    """One endpoint's minutes, oldest first, with exact error arithmetic."""

    def __init__(self, endpoint: str, rows: list[dict[str, Any]], baseline_end: datetime):
        self.endpoint = endpoint
        self.rows = sorted(rows, key=lambda r: _when(r["minute"]))
        self.base = [r for r in self.rows if _when(r["minute"]) < baseline_end]
        self.base_rate = self.rate(self.base)
        self.base_p95 = _nearest_rank_p95([d for r in self.base for d in r["durations_ms"]])

    @staticmethod
    def rate(rows: list[dict[str, Any]]) -> Fraction:
        total = sum(r["requests"] for r in rows)
        return Fraction(sum(r["errors"] for r in rows), total) if total else Fraction(0)

    def is_bad(self, row: dict[str, Any]) -> bool:
        if row["requests"] < MIN_REQUESTS:
            return False
        error_limit = max(Fraction(ERROR_RATE_FLOOR).limit_denominator(1000),
                          FACTOR * self.base_rate)
        if Fraction(row["errors"], row["requests"]) >= error_limit:
            return True
        return _nearest_rank_p95(row["durations_ms"]) >= FACTOR * self.base_p95

    def incident_rows(self) -> list[dict[str, Any]]:
        """The run of consecutive bad minutes that ends with the last minute, or []."""
        flags = [self.is_bad(r) for r in self.rows]
        if not flags or not flags[-1]:
            return []
        # index of the last good minute (or -1): the run starts right after it
        last_good = max((i for i, ok in enumerate(flags) if not ok), default=-1)
        return self.rows[last_good + 1:]


def impact(sources: Any) -> Impact | None:
    """Stage 1: which endpoint is failing, since when, how badly, for how many."""
    rows = _get(sources.metrics_url)["minutes"]
    if not rows:
        return None
    window_start = min(_when(r["minute"]) for r in rows)
    baseline_end = window_start + timedelta(minutes=BASELINE_MINUTES)
    grouped: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        grouped.setdefault(row["endpoint"], []).append(row)

    candidates = []
    for endpoint, endpoint_rows in grouped.items():
        series = _Series(endpoint, endpoint_rows, baseline_end)
        run = series.incident_rows()
        if run:
            candidates.append((sum(r["errors"] for r in run), endpoint, series, run))
    if not candidates:
        return None
    _, endpoint, series, run = max(candidates, key=lambda c: c[0])

    onset = _when(run[0]["minute"]).astimezone(timezone.utc)
    failed_users = {user for r in run for user in r["failed_users"]}
    return Impact(
        endpoint=endpoint,
        since=onset,
        error_rate=float(series.rate(run)),
        baseline_error_rate=float(series.base_rate),
        p95_ms=_nearest_rank_p95([d for r in run for d in r["durations_ms"]]),
        baseline_p95_ms=series.base_p95,
        requests=sum(r["requests"] for r in run),
        failed=sum(r["errors"] for r in run),
        users=len(failed_users),
        evidence=[
            f"{endpoint} bad since {onset:%H:%M} UTC for {len(run)} minute(s)",
            f"error rate {float(series.rate(run)):.1%} vs baseline "
            f"{float(series.base_rate):.1%}; p95 "
            f"{_nearest_rank_p95([d for r in run for d in r['durations_ms']]):.0f} ms vs "
            f"baseline {series.base_p95:.0f} ms",
            f"{len(failed_users)} distinct user(s) hit by "
            f"{sum(r['errors'] for r in run)} failed request(s)",
        ],
    )


def what_changed(sources: Any, since: datetime) -> ChangeFinding:
    """Stage 2: the latest change of any kind in [since - 15 min, since + 1 min)."""
    window_start = since - CHANGE_WINDOW
    window_end = since + timedelta(minutes=1)
    newest_first = sorted(_get(sources.changes_url)["changes"],
                          key=lambda c: _when(c["at"]), reverse=True)
    for change in newest_first:
        at = _when(change["at"])
        if at >= window_end:
            continue  # made during the incident: a reaction, not a cause
        if at < window_start:
            break  # everything from here on is older still
        return ChangeFinding(change, window_start, window_end, [
            f"suspect {change['id']}: {change['kind']} of {change['service']} at "
            f"{change['at']} - {change['description']}",
        ])
    return ChangeFinding(None, window_start, window_end, [
        f"no change in the window {window_start:%H:%M:%S}-{window_end:%H:%M:%S} UTC",
    ])


def _trace_lines(paths: list[Path], trace_id: str):
    for path in paths:
        for raw in Path(path).read_text(encoding="utf-8").splitlines():
            raw = raw.strip()
            if not raw:
                continue
            record = json.loads(raw)
            if record.get("trace_id") == trace_id:
                yield record


def _innermost(error: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    chain = [error["type"]]
    if error.get("cause") is None:
        return error, chain
    inner, rest = _innermost(error["cause"])
    return inner, chain + rest


def root_cause(sources: Any, trace_id: str) -> RootCause | None:
    """Stage 3: the deepest ERROR line of one request, followed to its last cause."""
    failures = [r for r in _trace_lines(sources.log_paths, trace_id)
                if r.get("level") == "ERROR" and r.get("error")]
    if not failures:
        return None
    has_failing_child = {r.get("parent_span_id") for r in failures} - {None}
    leaves = [r for r in failures if r.get("span_id") not in has_failing_child]
    deepest = sorted(leaves or failures, key=lambda r: _when(r["ts"]))[-1]
    cause, chain = _innermost(deepest["error"])
    return RootCause(
        trace_id=trace_id,
        service=deepest["service"],
        exception=cause["type"],
        message=cause["message"],
        evidence=[
            f"root cause {cause['type']}: {cause['message']}",
            f"raised in {deepest['service']} (span {deepest.get('span_id')}), "
            f"chain {' -> '.join(chain)}",
        ],
    )


# One statement, one snapshot: the waits-for graph is walked inside PostgreSQL, and the head's
# state, query and transaction age are read in the same statement as the graph itself.
CHAIN_SQL = text("""
    WITH RECURSIVE sessions AS MATERIALIZED (
        SELECT pid, state, query, xact_start, pg_blocking_pids(pid) AS blocked_by
          FROM pg_stat_activity
         WHERE datname = current_database() AND pid <> pg_backend_pid()
    ), waits AS (
        SELECT holder, s.pid AS waiter
          FROM sessions s, unnest(s.blocked_by) AS holder
    ), behind(head, waiter) AS (
        SELECT holder, waiter FROM waits
        UNION
        SELECT b.head, w.waiter FROM behind b JOIN waits w ON w.holder = b.waiter
    )
    SELECT s.pid, s.state, s.query,
           EXTRACT(EPOCH FROM now() - s.xact_start)::float8 AS held_for_s,
           array_agg(DISTINCT b.waiter ORDER BY b.waiter) AS waiting
      FROM sessions s
      JOIN behind b ON b.head = s.pid
     WHERE cardinality(s.blocked_by) = 0
     GROUP BY s.pid, s.state, s.query, s.xact_start
     ORDER BY count(DISTINCT b.waiter) DESC, s.pid
     LIMIT 1
""")


def blocking_chain(sources: Any) -> Blocking | None:
    """Stage 4: the session at the head of the lock queue, and what to do about it."""
    engine = create_engine(sources.database_url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            head = conn.execute(CHAIN_SQL).first()
            conn.rollback()
    finally:
        engine.dispose()
    if head is None:
        return None
    state = head.state or ""
    advice = "terminate" if state.startswith("idle in transaction") else "wait"
    held = float(head.held_for_s or 0.0)
    waiting = [int(pid) for pid in head.waiting]
    return Blocking(
        blocker_pid=int(head.pid),
        blocker_query=head.query or "",
        blocker_state=state,
        held_for_s=held,
        waiting_pids=waiting,
        advice=advice,
        evidence=[
            f"blocker pid {head.pid} is {state!r}, transaction open {held:.1f} s",
            f"{len(waiting)} session(s) wait behind it: {waiting}",
            f"last statement: {head.query}",
        ],
    )


# -- stage 5: slow queries (the snapshot is a dict of totals; the plan read as text) --------

class SlowQuery:
    def __init__(self, **values: Any) -> None:
        self.__dict__.update(values)


def statement_stats(sources: Any) -> dict[int, dict[str, Any]]:
    engine = create_engine(sources.database_url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            rows = conn.execute(text(
                "SELECT queryid, query, calls, total_exec_time, toplevel FROM pg_stat_statements "
                "WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())"
            )).all()
    finally:
        engine.dispose()
    snapshot: dict[int, dict[str, Any]] = {}
    for queryid, query, calls, total, toplevel in rows:
        if queryid is None:
            continue
        entry = snapshot.setdefault(int(queryid), {"query": query, "calls": 0, "ms": 0.0})
        if toplevel:
            entry["query"] = query      # the toplevel row's text: EXPLAIN can run it
        entry["calls"] += int(calls)
        entry["ms"] += float(total)
    return snapshot


def slow_query(sources: Any, before: dict[int, dict[str, Any]]) -> Any:
    now = statement_stats(sources)
    ranked = []
    for queryid, entry in now.items():
        old = before.get(queryid, {"calls": 0, "ms": 0.0})
        calls_after = entry["calls"] - old["calls"]
        if old["calls"] < 3 or calls_after < 3:
            continue
        mean_before = old["ms"] / old["calls"]
        mean_after = (entry["ms"] - old["ms"]) / calls_after
        if mean_after - mean_before >= 1.0 and mean_after >= 3 * mean_before:
            ranked.append((mean_after / mean_before, queryid, entry["query"], old["calls"],
                           calls_after, mean_before, mean_after))
    if not ranked:
        return None
    ranked.sort(reverse=True)
    factor, queryid, query, calls_before, calls_after, mean_before, mean_after = ranked[0]
    engine = create_engine(sources.database_url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            lines = [row[0] for row in conn.exec_driver_sql("EXPLAIN (GENERIC_PLAN) " + query)]
    finally:
        engine.dispose()
    table = column = ""
    for number, line in enumerate(lines):
        if "Seq Scan on " in line:
            table = line.split("Seq Scan on ", 1)[1].split()[0]
            for after in lines[number + 1:]:
                if "Filter:" in after:
                    column = after.split("Filter:", 1)[1].strip().lstrip("(").split()[0]
                    column = column.strip("()")
                    break
            break
    index = f"CREATE INDEX ON {table} USING btree ({column})" if table and column else ""
    return SlowQuery(
        queryid=queryid, query=query, calls_before=calls_before, calls_after=calls_after,
        mean_ms_before=mean_before, mean_ms_after=mean_after, plan="\n".join(lines),
        index=index, evidence=[f"queryid {queryid}: x{factor:.0f} per call after the change",
                               *lines[:2]])


# -- stage 6: pools (aggregated in SQL: one row per path, its states as JSON) ---------------

class PoolLeak:
    def __init__(self, **values: Any) -> None:
        self.__dict__.update(values)


PATHS_SQL = """
SELECT path, jsonb_object_agg(state, n) AS states,
       coalesce(sum(n) FILTER (WHERE state LIKE 'idle in transaction%%'), 0) AS leaked
  FROM (SELECT coalesce(a.application_name, '') AS path, coalesce(a.state, '') AS state,
               count(*) AS n
          FROM pg_stat_activity AS a JOIN pg_database AS d ON d.oid = a.datid
         WHERE d.datname = current_database() AND a.pid <> pg_backend_pid()
         GROUP BY 1, 2) AS per_state
 GROUP BY path
 ORDER BY leaked DESC, path
"""


def connection_leak(sources: Any) -> Any:
    engine = create_engine(sources.database_url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            rows = conn.exec_driver_sql(PATHS_SQL).all()
    finally:
        engine.dispose()
    by_path = {row.path: {state: int(n) for state, n in row.states.items()} for row in rows}
    if not rows or int(rows[0].leaked) < 3:
        return None
    top = rows[0]
    return PoolLeak(application_name=top.path, leaked=int(top.leaked), by_path=by_path,
                    evidence=[f"{top.path}: {int(top.leaked)} sessions idle in transaction "
                              f"of {sum(by_path[top.path].values())}"])


# -- stage 7: consumer lag (the group's offsets through the admin API) -----------------------

class ConsumerLag:
    """topic, group, lag, moving, partition, offset, key, headers, evidence (README)."""

    def __init__(self, **values: Any) -> None:
        self.__dict__.update(values)


def _group_offsets(sources: Any) -> dict[int, int]:
    """The group's committed offsets through the admin API (ListConsumerGroupOffsets)."""
    from confluent_kafka import ConsumerGroupTopicPartitions
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(dict(sources.kafka))
    request = ConsumerGroupTopicPartitions(sources.group)
    answer = admin.list_consumer_group_offsets([request], request_timeout=15)
    groups = answer[sources.group].result(timeout=15)
    return {tp.partition: tp.offset for tp in groups.topic_partitions
            if tp.topic == sources.topic}


def lag_snapshot(sources: Any) -> list[tuple[int, int, int]]:
    """Stage 7: [(partition, committed, end)], sorted by partition."""
    import uuid

    from confluent_kafka import Consumer, TopicPartition

    committed = _group_offsets(sources)
    reader = Consumer({**sources.kafka, "group.id": f"triage-{uuid.uuid4().hex[:8]}",
                       "enable.auto.commit": False})
    try:
        meta = reader.list_topics(sources.topic, timeout=10).topics[sources.topic]
        rows = []
        for partition in sorted(meta.partitions):
            low, high = reader.get_watermark_offsets(
                TopicPartition(sources.topic, partition), timeout=10, cached=False)
            at = committed.get(partition, -1)
            rows.append((partition, at if at >= 0 else low, high))
        return rows
    finally:
        reader.close()


def consumer_lag(sources: Any, before: list[tuple[int, int, int]]) -> ConsumerLag | None:
    """Stage 7: the partition stuck since `before`, from two looks at the group's offsets."""
    import uuid

    from confluent_kafka import Consumer, TopicPartition

    then = {partition: committed for partition, committed, _end in before}
    rows = lag_snapshot(sources)
    lag = {partition: end - committed for partition, committed, end in rows}
    moving: list[int] = []
    stuck: list[int] = []
    for partition, committed, _end in rows:
        if lag[partition] <= 0 or partition not in then:
            continue
        (stuck if committed == then[partition] else moving).append(partition)
    if not stuck:
        return None
    stuck.sort(key=lambda p: (-lag[p], p))
    partition = stuck[0]
    offset = next(committed for p, committed, _end in rows if p == partition)
    reader = Consumer({**sources.kafka, "group.id": f"triage-{uuid.uuid4().hex[:8]}",
                       "enable.auto.commit": False})
    key: str | None = None
    headers: dict[str, str] = {}
    try:
        reader.assign([TopicPartition(sources.topic, partition, offset)])
        for message in reader.consume(num_messages=1, timeout=15):
            if message.error() is None and message.offset() == offset:
                key = None if message.key() is None else message.key().decode()
                headers = {name: (value or b"").decode()
                           for name, value in message.headers() or []}
    finally:
        reader.close()
    return ConsumerLag(topic=sources.topic, group=sources.group, lag=lag, moving=sorted(moving),
                       partition=partition, offset=offset, key=key, headers=headers, evidence=[
                           f"{sources.group} has not moved on partition {partition} since the "
                           f"first look: offset {offset}, {lag[partition]} waiting",
                           f"record key={key} headers={headers}"])


# -- stage 8 (downstream), added with the stage: a forward scan in exact fractions ---------
class DownstreamFinding:
    """Any object with the README's attribute names is accepted; this one has an extra one."""

    def __init__(self, **values: Any) -> None:
        self.__dict__.update(values)


def _downstream_fetch(url: str) -> Any:
    import json as _json
    import urllib.request as _request

    with _request.urlopen(url, timeout=10) as answer:
        return _json.loads(answer.read().decode("utf-8"))


def _downstream_p95(durations: list[float]) -> float:
    from fractions import Fraction as _F

    if not durations:
        return 0.0
    rank = -(-_F(95, 100) * len(durations) // 1)          # ceil, exactly
    return sorted(durations)[int(rank) - 1]


def downstream(sources: Any) -> Any:
    from datetime import datetime as _dt
    from fractions import Fraction as _F

    served = _downstream_fetch(sources.metrics_url)
    state = {d["dependency"]: d["breaker"] for d in served["dependencies"]}
    per_dep: dict[str, dict[str, dict[str, Any]]] = {}
    for row in served["outbound"]:
        per_dep.setdefault(row["dependency"], {})[row["minute"]] = row

    def is_bad(row: dict[str, Any]) -> bool:
        if row["short_circuited"]:
            return True
        return bool(row["calls"]) and _F(row["timeouts"], row["calls"]) >= _F(1, 5)

    candidates = []
    for dep, minutes in per_dep.items():
        onset = None
        for minute in sorted(minutes):          # forward: the last good minute resets it
            if is_bad(minutes[minute]):
                onset = onset or minute
            else:
                onset = None
        if onset is not None:
            tail = [minutes[m] for m in minutes if m >= onset]
            candidates.append((sum(r["timeouts"] for r in tail), dep, onset, tail))
    if not candidates:
        return None
    candidates.sort(key=lambda c: (c[0], c[1]))
    timeouts, dep, onset, tail = candidates[-1]
    sent = sum(r["calls"] for r in tail)
    caused = own = 0
    for row in served["minutes"]:
        if row["minute"] >= onset:
            caused += row["errors_by_cause"].get(dep, 0)
            own += row["errors_by_cause"].get("own", 0)
    table = {}
    for name, minutes in per_dep.items():
        rows = list(minutes.values())
        calls = sum(r["calls"] for r in rows)
        table[name] = {"error_rate": float(_F(sum(r["errors"] for r in rows), calls))
                       if calls else 0.0,
                       "p95_ms": _downstream_p95([d for r in rows for d in r["durations_ms"]]),
                       "breaker": state[name]}
    return DownstreamFinding(
        dependency=dep,
        since=_dt.fromisoformat(onset.replace("Z", "+00:00")),
        timeout_rate=float(_F(timeouts, sent)) if sent else 0.0,
        breaker=state[dep],
        caused_errors=caused,
        own_errors=own,
        by_dependency=table,
        bad_minutes=len(tail),
        evidence=[f"dependency {dep} failing since {onset}: {timeouts}/{sent} calls timed out, "
                  f"breaker {state[dep]}", f"inbound errors: {caused} caused, {own} own"],
    )


# -- stage 9: one object that answers every field and prints itself, not a dataclass --------

class IncidentNote:
    """The report as a plain object: the fields README stage 9 names, and the note."""

    def __init__(self, impact: Any = None, suspect: str | None = None, root_cause: Any = None,
                 mitigation: str | None = None, target: str | None = None,
                 missing_alarm: str | None = None, evidence: list[str] | None = None) -> None:
        self.healthy = impact is None
        self.impact = impact
        self.suspect = suspect
        self.root_cause = root_cause
        self.mitigation = mitigation
        self.target = target
        self.missing_alarm = missing_alarm
        self.evidence = evidence or ["metrics: no endpoint in an incident"]

    def __str__(self) -> str:
        if self.healthy:
            return "Status: healthy. Nothing to mitigate."
        hit = self.impact
        return "\n".join([
            f"{hit.endpoint} broken from {_utc_minute(hit.since)} UTC on "
            f"({hit.failed}/{hit.requests} failed, {hit.users} users)",
            f"do now: {self.mitigation} {self.target}",
            f"suspect: {self.suspect}; root cause: "
            f"{getattr(self.root_cause, 'exception', 'unknown')}",
            f"alarm to add: {self.missing_alarm}",
            *self.evidence,
        ])


def _utc_minute(at: Any) -> str:
    from datetime import timezone as _tz

    return str(at.astimezone(_tz.utc).strftime("%H:%M"))


def triage(sources: Any) -> IncidentNote:
    """Impact; if any, the change log, a failing request, then the lock chain only."""
    hit = impact(sources)
    if hit is None:
        return IncidentNote()
    onset = _utc_minute(hit.since)
    facts = [f"{hit.endpoint}: bad minutes from {onset} to now"]
    change = what_changed(sources, hit.since)
    suspect = change.suspect["id"] if change.suspect else None
    if suspect:
        facts.append(f"latest change before {onset}: {suspect}")
    cause = None
    for _ in range(5):
        status, trace = sources.request(hit.endpoint)
        if status >= 500:
            cause = root_cause(sources, trace)
            break
    if cause is not None:
        facts.append(f"trace {trace} ends in {cause.exception} ({cause.service})")
    chain = blocking_chain(sources)
    if chain is not None and chain.advice == "terminate":
        action, target = "terminate", str(chain.blocker_pid)
        facts.append(f"pid {chain.blocker_pid} idle in transaction blocks "
                     f"{len(chain.waiting_pids)} session(s)")
    else:
        action, target = ("rollback", suspect) if suspect else (None, None)
    return IncidentNote(hit, suspect, cause, action, target,
                        f"page when {hit.endpoint} errors exceed 5 % of its requests", facts)
