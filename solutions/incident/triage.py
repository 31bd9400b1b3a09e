"""A triage toolkit: where to look first when a service starts failing.

Each function reads one kind of signal (metrics, the change log, the logs of one request,
the database's sessions) and returns a finding with the evidence that supports it, or None
when that signal shows nothing wrong.
"""

from __future__ import annotations

import json
import math
import re
import urllib.request
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, text

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


def fetch_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.load(response)


def parse_time(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)] if ordered else 0.0


def _rate(rows: list[dict[str, Any]]) -> float:
    requests = sum(r["requests"] for r in rows)
    return sum(r["errors"] for r in rows) / requests if requests else 0.0


def impact(sources: Any) -> Impact | None:
    """Stage 1: which endpoint is failing, since when, how badly, for how many."""
    minutes = fetch_json(sources.metrics_url)["minutes"]
    by_endpoint: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in minutes:
        by_endpoint[row["endpoint"]].append(row)
    first = min(parse_time(r["minute"]) for r in minutes)
    found: list[Impact] = []
    for endpoint, rows in by_endpoint.items():
        rows.sort(key=lambda r: r["minute"])
        base = [r for r in rows
                if parse_time(r["minute"]) < first + timedelta(minutes=BASELINE_MINUTES)]
        base_rate = _rate(base)
        base_p95 = p95([d for r in base for d in r["durations_ms"]])

        def bad(row: dict[str, Any], base_rate: float = base_rate,
                base_p95: float = base_p95) -> bool:
            if row["requests"] < MIN_REQUESTS:
                return False
            rate = row["errors"] / row["requests"]
            # no baseline latency (no requests then) is no evidence that the endpoint got slow
            return (rate >= max(ERROR_RATE_FLOOR, FACTOR * base_rate)
                    or (base_p95 > 0 and p95(row["durations_ms"]) >= FACTOR * base_p95))

        start = len(rows)
        while start > 0 and bad(rows[start - 1]):
            start -= 1
        if start == len(rows):
            continue
        after = rows[start:]
        onset = after[0]
        found.append(Impact(
            endpoint=endpoint,
            since=parse_time(onset["minute"]),
            error_rate=_rate(after),
            baseline_error_rate=base_rate,
            p95_ms=p95([d for r in after for d in r["durations_ms"]]),
            baseline_p95_ms=base_p95,
            requests=sum(r["requests"] for r in after),
            failed=sum(r["errors"] for r in after),
            users=len({u for r in after for u in r["failed_users"]}),
            evidence=[
                f"first bad minute {onset['minute']}: {onset['errors']} of "
                f"{onset['requests']} requests failed, p95 {p95(onset['durations_ms'])} ms",
                f"baseline (first {BASELINE_MINUTES} minutes): error rate {base_rate:.3f}, "
                f"p95 {base_p95} ms",
            ],
        ))
    if not found:
        return None
    return max(found, key=lambda i: i.failed)


def what_changed(sources: Any, since: datetime) -> ChangeFinding:
    """Stage 2: the change just before the onset, or none in the window."""
    changes = fetch_json(sources.changes_url)["changes"]
    start, end = since - CHANGE_WINDOW, since + timedelta(minutes=1)
    inside = [c for c in changes if start <= parse_time(c["at"]) < end]
    if not inside:
        return ChangeFinding(None, start, end, [
            f"no deploy, config or flag change between {start.isoformat()} and "
            f"{end.isoformat()} ({len(changes)} changes in the log)"])
    suspect = max(inside, key=lambda c: parse_time(c["at"]))
    return ChangeFinding(suspect, start, end, [
        f"{suspect['id']} at {suspect['at']}: {suspect['kind']} of {suspect['service']} "
        f"({suspect['description']}), {len(inside)} change(s) in the window"])


def _read_lines(paths: list[Path], trace_id: str) -> list[dict[str, Any]]:
    found = []
    for path in paths:
        with open(path, encoding="utf-8") as lines:
            for raw in lines:
                if trace_id in raw:
                    try:
                        line = json.loads(raw)
                    except ValueError:
                        continue    # a line a service is still writing: not a whole line yet
                    if isinstance(line, dict) and line.get("trace_id") == trace_id:
                        found.append(line)
    return found


def root_cause(sources: Any, trace_id: str) -> RootCause | None:
    """Stage 3: follow one request by its trace id to the deepest cause."""
    lines = _read_lines(sources.log_paths, trace_id)
    errors = [line for line in lines if line.get("level") == "ERROR" and line.get("error")]
    if not errors:
        return None
    parents = {line.get("parent_span_id") for line in errors}
    deepest = [line for line in errors if line.get("span_id") not in parents] or errors
    line = max(deepest, key=lambda item: item["ts"])
    error = line["error"]
    chain = [error["type"]]
    while error.get("cause"):
        error = error["cause"]
        chain.append(error["type"])
    return RootCause(trace_id, line["service"], error["type"], error["message"], [
        f"{line['ts']} {line['service']} ERROR {line['message']}",
        "chain: " + " <- ".join(chain)])


BLOCKING_SQL = text("""
    SELECT pid, pg_blocking_pids(pid) AS blocked_by
      FROM pg_stat_activity
     WHERE datname = current_database() AND pid <> pg_backend_pid()
""")
SESSION_SQL = text("""
    SELECT pid, state, query, EXTRACT(EPOCH FROM now() - xact_start) AS held_for
      FROM pg_stat_activity WHERE pid = :pid
""")


def blocking_chain(sources: Any) -> Blocking | None:
    """Stage 4: who blocks whom in the database, and what to do about it."""
    engine = create_engine(sources.database_url, pool_size=1)
    try:
        with engine.connect() as conn:
            edges = {row.pid: list(row.blocked_by) for row in conn.execute(BLOCKING_SQL)}
            waiting = {pid for pid, by in edges.items() if by}
            if not waiting:
                return None
            blocks: dict[int, set[int]] = defaultdict(set)
            for pid, by in edges.items():
                for holder in by:
                    blocks[holder].add(pid)

            def downstream(pid: int) -> set[int]:
                seen: set[int] = set()
                todo = [pid]
                while todo:
                    for waiter in blocks.get(todo.pop(), ()):
                        if waiter not in seen:
                            seen.add(waiter)
                            todo.append(waiter)
                return seen

            roots = [pid for pid in blocks if not edges.get(pid)]
            if not roots:
                return None
            root = max(roots, key=lambda pid: len(downstream(pid)))
            # pid 0 is a prepared transaction (no session); a blocker may also end meanwhile
            row = conn.execute(SESSION_SQL, {"pid": root}).first()
    finally:
        engine.dispose()
    if row is None:
        state, query, held = ("prepared transaction" if root == 0 else "ended"), "", 0.0
    else:
        state, query, held = row.state or "", row.query or "", float(row.held_for or 0.0)
    advice = "terminate" if state.startswith("idle in transaction") else "wait"
    waiters = sorted(downstream(root))
    return Blocking(root, query, state, held, waiters, advice, [
        f"pid {root} ({state}, transaction open {held:.1f} s) blocks {waiters}",
        f"its last statement: {query}"])


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


STATEMENTS_SQL = text("""
    SELECT queryid, (array_agg(query ORDER BY toplevel DESC))[1] AS query, sum(calls) AS calls,
           sum(total_exec_time) AS total_ms
      FROM pg_stat_statements
     WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
       AND queryid IS NOT NULL
     GROUP BY queryid
""")
MIN_CALLS = 3
SLOWDOWN = 3
SLOWDOWN_MS = 1.0


def statement_stats(sources: Any) -> dict[int, tuple[str, int, float]]:
    """Stage 5: pg_stat_statements of the shop's database now, by queryid:
    (query, calls, total ms)."""
    engine = create_engine(sources.database_url, pool_size=1)
    try:
        with engine.connect() as conn:
            return {int(row.queryid): (row.query, int(row.calls), float(row.total_ms))
                    for row in conn.execute(STATEMENTS_SQL)}
    finally:
        engine.dispose()


def _index_for(plan: str) -> str:
    scan = re.search(r"Seq Scan on (\w+)", plan)
    column = re.search(r"Filter: \(\(?(\w+)\)?(?:::\w+)? = ", plan)
    if not scan or not column:
        return ""
    return f"CREATE INDEX ON {scan.group(1)} ({column.group(1)})"


def slow_query(sources: Any, before: dict[int, tuple[str, int, float]]) -> SlowQuery | None:
    """Stage 5: the statement whose mean time grew the most since `before` (a snapshot of
    statement_stats taken at the change), its plan, and the index it lacks."""
    now = statement_stats(sources)
    found: list[tuple[float, SlowQuery]] = []
    for queryid, (query, calls, total) in now.items():
        _, calls_then, total_then = before.get(queryid, (query, 0, 0.0))
        calls_after = calls - calls_then
        if calls_then < MIN_CALLS or calls_after < MIN_CALLS:
            continue
        mean_before = total_then / calls_then
        mean_after = (total - total_then) / calls_after
        if mean_after < SLOWDOWN * mean_before or mean_after - mean_before < SLOWDOWN_MS:
            continue
        found.append((mean_after / mean_before if mean_before else math.inf, SlowQuery(
            queryid, query, calls_then, calls_after, mean_before, mean_after, "", "")))
    if not found:
        return None
    factor, slow = max(found, key=lambda item: item[0])
    engine = create_engine(sources.database_url, pool_size=1)
    try:
        with engine.connect() as conn:
            # no_parameters: the statement is sent as it is, a '%' operator in it included
            slow.plan = "\n".join(conn.execution_options(no_parameters=True).exec_driver_sql(
                "EXPLAIN (GENERIC_PLAN) " + slow.query).scalars())
            conn.rollback()
    finally:
        engine.dispose()
    slow.index = _index_for(slow.plan)
    slow.evidence = [
        f"queryid {slow.queryid}: {slow.query}",
        f"mean {slow.mean_ms_before:.2f} ms over {slow.calls_before} calls before the change, "
        f"{slow.mean_ms_after:.2f} ms over {slow.calls_after} calls after ({factor:.0f} x)",
        "plan: " + " / ".join(line.strip() for line in slow.plan.splitlines()[:3]),
        f"proposed: {slow.index}",
    ]
    return slow


@dataclass
class PoolLeak:
    application_name: str
    leaked: int
    by_path: dict[str, dict[str, int]]
    evidence: list[str] = field(default_factory=list)


SESSIONS_SQL = text("""
    SELECT coalesce(application_name, '') AS path, coalesce(state, '') AS state,
           count(*) AS sessions
      FROM pg_stat_activity
     WHERE datname = current_database() AND pid <> pg_backend_pid()
     GROUP BY 1, 2
""")
LEAKED_STATES = ("idle in transaction", "idle in transaction (aborted)")
MIN_LEAKED = 3


def connection_leak(sources: Any) -> PoolLeak | None:
    """Stage 6: the code path whose connections pile up idle in transaction (checked out and
    never given back), with every path's sessions counted by state; None when none leaks."""
    engine = create_engine(sources.database_url, pool_size=1)
    try:
        with engine.connect() as conn:
            rows = conn.execute(SESSIONS_SQL).all()
    finally:
        engine.dispose()
    by_path: dict[str, dict[str, int]] = defaultdict(dict)
    for row in rows:
        by_path[row.path][row.state] = int(row.sessions)
    leaked = {path: sum(states.get(s, 0) for s in LEAKED_STATES)
              for path, states in by_path.items()}
    suspects = [path for path, count in leaked.items() if count >= MIN_LEAKED]
    if not suspects:
        return None
    path = max(suspects, key=lambda name: leaked[name])
    return PoolLeak(path, leaked[path], dict(by_path), [
        f"{path}: {leaked[path]} sessions idle in transaction "
        f"(checked out, never returned); its sessions by state: {by_path[path]}",
        "every path: " + "; ".join(f"{name or '(no name)'} {states}"
                                   for name, states in sorted(by_path.items()))])


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


def _group_consumer(sources: Any) -> Any:
    from confluent_kafka import Consumer

    # the group's id, to read its committed offsets; never commit for it
    return Consumer({**sources.kafka, "group.id": sources.group, "enable.auto.commit": False})


def lag_snapshot(sources: Any) -> dict[int, tuple[int, int]]:
    """Stage 7: the group's committed offset and the end offset of every partition of the
    topic now: {partition: (committed, end)}."""
    from confluent_kafka import TopicPartition

    consumer = _group_consumer(sources)
    try:
        topic = consumer.list_topics(sources.topic, timeout=10).topics[sources.topic]
        partitions = [TopicPartition(sources.topic, p) for p in sorted(topic.partitions)]
        found: dict[int, tuple[int, int]] = {}
        for tp in consumer.committed(partitions, timeout=10):
            low, high = consumer.get_watermark_offsets(tp, timeout=10, cached=False)
            found[tp.partition] = (tp.offset if tp.offset >= 0 else low, high)
        return found
    finally:
        consumer.close()


def _record_at(sources: Any, partition: int, offset: int) -> Any:
    from confluent_kafka import TopicPartition

    consumer = _group_consumer(sources)
    try:
        consumer.assign([TopicPartition(sources.topic, partition, offset)])
        for _ in range(100):
            message = consumer.poll(0.2)
            if message is not None and not message.error() and message.offset() == offset:
                return message
        return None
    finally:
        consumer.close()


def consumer_lag(sources: Any, before: dict[int, tuple[int, int]]) -> ConsumerLag | None:
    """Stage 7: lag per partition from the group's committed offsets; the partition whose
    committed offset did not move since `before` (a lag_snapshot) while records wait, and
    the record it is stuck on; None when no partition is stuck."""
    now = lag_snapshot(sources)
    lag = {p: end - committed for p, (committed, end) in now.items()}
    moving = sorted(p for p in now if lag[p] > 0 and p in before and now[p][0] > before[p][0])
    stuck = [p for p in now if lag[p] > 0 and p in before and now[p][0] == before[p][0]]
    if not stuck:
        return None
    partition = max(stuck, key=lambda p: lag[p])
    offset = now[partition][0]
    record = _record_at(sources, partition, offset)
    raw_key = record.key() if record is not None else None
    key = raw_key.decode("utf-8", "replace") if raw_key is not None else None  # b"" is a key
    headers = {name: (value or b"").decode("utf-8", "replace")
               for name, value in (record.headers() or [])} if record else {}
    return ConsumerLag(sources.topic, sources.group, lag, moving, partition, offset, key,
                       headers, [
        f"partition {partition}: committed offset {offset} at both looks, end "
        f"{before[partition][1]} then {now[partition][1]}: {lag[partition]} records wait",
        f"the record at offset {offset}: key {key!r}, headers {headers}",
        "lag per partition (end - committed): "
        + ", ".join(f"p{p} {n}" for p, n in sorted(lag.items()))
        + (f"; slow but moving: {moving}" if moving else "")])


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


TIMEOUT_SHARE = 0.2


def _refusing_or_timing_out(row: dict[str, Any]) -> bool:
    """A bad minute of a dependency: its breaker refused calls, or a fifth of the calls sent
    timed out. An open breaker sends nothing, so it shows no errors: it is bad all the same."""
    if row["short_circuited"] > 0:
        return True
    return row["calls"] > 0 and row["timeouts"] / row["calls"] >= TIMEOUT_SHARE


def downstream(sources: Any) -> Downstream | None:
    """Stage 8: the dependency whose outbound calls time out (or whose breaker refuses them),
    since when, with every dependency's outbound error rate, p95 and breaker; and the inbound
    errors it caused, told from the service's own. None when no dependency fails."""
    metrics = fetch_json(sources.metrics_url)
    calls: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in metrics["outbound"]:
        calls[row["dependency"]].append(row)
    breakers = {d["dependency"]: d for d in metrics["dependencies"]}
    failing: list[tuple[int, str, str]] = []
    for name, rows in calls.items():
        rows.sort(key=lambda r: r["minute"])
        start = len(rows)
        while start > 0 and _refusing_or_timing_out(rows[start - 1]):
            start -= 1
        if start < len(rows):
            failing.append((sum(r["timeouts"] for r in rows[start:]), name,
                            rows[start]["minute"]))
    if not failing:
        return None
    timeouts, name, onset = max(failing)
    since = parse_time(onset)
    by_dependency: dict[str, dict[str, Any]] = {}
    for dep, rows in calls.items():
        sent = sum(r["calls"] for r in rows)
        by_dependency[dep] = {
            "error_rate": sum(r["errors"] for r in rows) / sent if sent else 0.0,
            "p95_ms": p95([d for r in rows for d in r["durations_ms"]]),
            "breaker": breakers[dep]["breaker"],
        }
    recent = [r for r in calls[name] if parse_time(r["minute"]) >= since]
    sent = sum(r["calls"] for r in recent)
    refused = sum(r["short_circuited"] for r in recent)
    inbound = [r for r in metrics["minutes"] if parse_time(r["minute"]) >= since]
    caused = sum(r["errors_by_cause"].get(name, 0) for r in inbound)
    own = sum(r["errors_by_cause"].get("own", 0) for r in inbound)
    breaker = breakers[name]
    return Downstream(
        dependency=name, since=since, timeout_rate=timeouts / sent if sent else 0.0,
        breaker=breaker["breaker"], caused_errors=caused, own_errors=own,
        by_dependency=by_dependency,
        evidence=[
            f"{name}: {timeouts} of {sent} calls sent since {onset[11:16]} timed out (timeout "
            f"{breaker['timeout_ms']} ms), {refused} refused by its breaker, "
            f"now {breaker['breaker']} since {breaker['breaker_since'][11:19]}",
            f"inbound errors since then: {caused} caused by {name}, {own} of the service's own",
            "outbound per dependency: " + "; ".join(
                f"{dep} error rate {s['error_rate']:.2f}, p95 {s['p95_ms']:.0f} ms, "
                f"breaker {s['breaker']}" for dep, s in sorted(by_dependency.items())),
        ])


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
        if self.healthy or self.impact is None:
            return "No incident: the system is healthy.\n" + "\n".join(
                f"  - {line}" for line in self.evidence)
        impact = self.impact
        cause = self.root_cause
        lines = [
            f"INCIDENT {impact.endpoint} failing since {impact.since:%H:%M} UTC: error rate "
            f"{impact.error_rate:.1%} (baseline {impact.baseline_error_rate:.1%}), p95 "
            f"{impact.p95_ms:.0f} ms (baseline {impact.baseline_p95_ms:.0f} ms); "
            f"{impact.failed} of {impact.requests} requests failed, {impact.users} users",
            "Suspect: " + (f"change {self.suspect}" if self.suspect else "no change in the window")
            + (f"; a failing request ends in {cause.exception}: {cause.message} "
               f"({cause.service})" if cause else ""),
            f"Mitigate first: {self.mitigation} {self.target}",
            f"Missing alarm: {self.missing_alarm}",
            "Evidence:",
        ]
        return "\n".join(lines + [f"  - {line}" for line in self.evidence])


REQUEST_TRIES = 3


def _one_failing_request(sources: Any, endpoint: str) -> str | None:
    """Step 4: ask the live shop for one failure of the endpoint; its trace id."""
    for _ in range(REQUEST_TRIES):
        status, trace = sources.request(endpoint)
        if status >= 500:
            return str(trace)
    return None


def triage(sources: Any) -> Report:
    """Stage 9: impact, what changed, one failing request, the service's health, its
    dependencies, in that order; the first mitigation and the alarm that was missing."""
    found = impact(sources)                                   # 1. impact and scope
    if found is None:
        return Report(True, evidence=[
            "no endpoint has a run of bad minutes lasting to now: nothing to mitigate"])
    evidence = list(found.evidence)
    change = what_changed(sources, found.since)               # 2. what changed
    evidence += change.evidence
    suspect = change.suspect["id"] if change.suspect else None
    trace = _one_failing_request(sources, found.endpoint)     # 4. one failing request
    cause = root_cause(sources, trace) if trace else None
    if cause is not None:
        evidence += [f"request {cause.trace_id}: {cause.exception} in {cause.service}"]
        evidence += cause.evidence
    leak = connection_leak(sources)                           # 5. the service's own health
    if leak is not None:
        evidence += leak.evidence
    chain = blocking_chain(sources)                           # 6. its dependencies
    if chain is not None:
        evidence += chain.evidence
    # 3. stop the bleeding: what ends the harm now, not the root-cause fix
    mitigation: str | None
    target: str | int | None
    if chain is not None and chain.advice == "terminate":
        mitigation, target = "terminate", chain.blocker_pid
    elif suspect is not None:
        mitigation, target = "rollback", suspect
    elif leak is not None:
        mitigation, target = "restart", leak.application_name
    else:
        mitigation, target = None, None
    alarm = (f"{found.endpoint}: error rate >= max(5 %, 3 x baseline) or p95 >= 3 x baseline "
             f"for a minute with 10+ requests; it would have paged at {found.since:%H:%M}")
    return Report(False, found, suspect, cause, mitigation, target, alarm, evidence)
