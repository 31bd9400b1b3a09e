"""A correct triage toolkit that differs from the reference: NamedTuple findings, a change
window kept as a pair of datetimes, a root cause found by walking span depths, and plain
psycopg (no SQLAlchemy) with one recursive query for the lock chain. (Its p95 used to be
interpolated linearly between ranks, numpy's default; the README's p95 is the nearest rank,
and the checker's durations now jump on both sides of it, so that was a mistake.)"""

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
    """The nearest rank: the ceil(0.95 n)-th smallest, counted as -(-19 n // 20)."""
    ordered = sorted(values)
    if not ordered:
        return 0.0
    return ordered[-(-19 * len(ordered) // 20) - 1]


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


# -- stage 5: slow queries (psycopg; the snapshot is a list of rows, the plan read as JSON) --

class SlowQuery(NamedTuple):
    queryid: int
    query: str
    calls_before: int
    calls_after: int
    mean_ms_before: float
    mean_ms_after: float
    plan: str
    index: str
    evidence: list[str]


SNAPSHOT_SQL = """
SELECT s.queryid, s.query, s.calls, s.total_exec_time
  FROM pg_stat_statements AS s
  JOIN pg_database AS d ON d.oid = s.dbid
 WHERE d.datname = current_database() AND s.queryid IS NOT NULL
"""


def _slow_conn(sources: Any) -> Any:
    url = make_url(str(sources.database_url)).set(drivername="postgresql")
    return psycopg.connect(url.render_as_string(hide_password=False), autocommit=True,
                           connect_timeout=10)


def statement_stats(sources: Any) -> list[tuple[int, str, int, float]]:
    with _slow_conn(sources) as conn:
        return [(int(q), str(text_), int(c), float(t))
                for q, text_, c, t in conn.execute(SNAPSHOT_SQL).fetchall()]


def _totals(rows: list[tuple[int, str, int, float]]) -> dict[int, tuple[str, int, float]]:
    out: dict[int, tuple[str, int, float]] = {}
    for queryid, query, calls, total in rows:
        _, c, t = out.get(queryid, (query, 0, 0.0))
        out[queryid] = (query, c + calls, t + total)
    return out


def _seq_scan(node: dict[str, Any]) -> tuple[str, str] | None:
    """(table, filtered column) of the first sequential scan with a filter, depth first."""
    if node.get("Node Type") == "Seq Scan" and "Filter" in node:
        column = node["Filter"].strip("()").split(" ")[0].strip("()")
        return node["Relation Name"], column
    for child in node.get("Plans", []):
        found = _seq_scan(child)
        if found:
            return found
    return None


def slow_query(sources: Any, before: list[tuple[int, str, int, float]]) -> SlowQuery | None:
    then = _totals(before)
    best: tuple[float, int, str, int, int, float, float] | None = None
    with _slow_conn(sources) as conn:
        now = _totals(statement_stats(sources))
        for queryid, (query, calls, total) in now.items():
            _, calls0, total0 = then.get(queryid, (query, 0, 0.0))
            calls1, total1 = calls - calls0, total - total0
            if min(calls0, calls1) < 3:
                continue
            mean0, mean1 = total0 / calls0, total1 / calls1
            if mean1 >= 3 * mean0 and mean1 - mean0 >= 1.0 and mean0 > 0:
                factor = mean1 / mean0
                if best is None or factor > best[0]:
                    best = (factor, queryid, query, calls0, calls1, mean0, mean1)
        if best is None:
            return None
        factor, queryid, query, calls0, calls1, mean0, mean1 = best
        plan = "\n".join(r[0] for r in conn.execute("EXPLAIN (GENERIC_PLAN) " + query))
        tree = conn.execute("EXPLAIN (GENERIC_PLAN, FORMAT JSON) " + query).fetchone()[0]
    scan = _seq_scan(tree[0]["Plan"])
    index = ""
    if scan:
        index = f"CREATE INDEX IF NOT EXISTS {scan[0]}_{scan[1]}_fix ON {scan[0]} ({scan[1]})"
    return SlowQuery(queryid, query, calls0, calls1, mean0, mean1, plan, index, [
        f"statement {queryid} is {factor:.1f} times slower per call since the change",
        f"{mean0:.3f} ms x {calls0} before, {mean1:.3f} ms x {calls1} after",
        plan.splitlines()[0] if plan else "no plan"])


# -- stage 6: pools (psycopg; every session read raw, counted in Python) ---------------------

class PoolLeak(NamedTuple):
    application_name: str
    leaked: int
    by_path: dict[str, dict[str, int]]
    evidence: list[str]


def connection_leak(sources: Any) -> PoolLeak | None:
    with _slow_conn(sources) as conn:
        me = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
        rows = conn.execute(
            "SELECT pid, application_name, state FROM pg_stat_activity "
            "WHERE datid = (SELECT oid FROM pg_database WHERE datname = current_database())"
        ).fetchall()
    by_path: dict[str, dict[str, int]] = {}
    for pid, name, state in rows:
        if pid == me:
            continue
        states = by_path.setdefault(name or "", {})
        states[state or ""] = states.get(state or "", 0) + 1
    leaks = sorted(((sum(n for s, n in states.items() if s.startswith("idle in transaction")),
                     name) for name, states in by_path.items()), reverse=True)
    if not leaks or leaks[0][0] < 3:
        return None
    leaked, name = leaks[0]
    return PoolLeak(name, leaked, by_path, [
        f"path {name!r} holds {leaked} connections idle in transaction: {by_path[name]}",
        f"{len(rows) - 1} other sessions in this database"])


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
