"""A triage toolkit, third design.

Differences from the reference: rates are exact fractions until they are reported, the
findings are plain classes with extra attributes (the checker reads only the named ones),
stage 1 flags every minute first and then measures the trailing run, stage 2 sorts the
change log, stage 3 indexes the request's spans, and stage 4 reads pg_stat_activity ONCE
(one snapshot with every column it needs) and finds heads by walking UP from each waiter
instead of down from each holder.
"""

from __future__ import annotations

import json
import math
import urllib.request
from bisect import bisect_left
from collections import Counter, defaultdict
from datetime import datetime, timedelta, timezone
from fractions import Fraction
from typing import Any

from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool


class Finding:
    def __init__(self, **values: Any) -> None:
        self.__dict__.update(values)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.__dict__!r})"


class Impact(Finding):
    pass


class ChangeFinding(Finding):
    pass


class RootCause(Finding):
    pass


class Blocking(Finding):
    pass


def _load(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.load(response)


def _when(stamp: str) -> datetime:
    return datetime.strptime(stamp.replace("Z", "+0000").replace("+00:00", "+0000"),
                             "%Y-%m-%dT%H:%M:%S.%f%z") if "." in stamp else \
        datetime.strptime(stamp.replace("Z", "+0000").replace("+00:00", "+0000"),
                          "%Y-%m-%dT%H:%M:%S%z")


def _p95(durations: list[float]) -> float:
    n = len(durations)
    if n == 0:
        return 0.0
    return float(sorted(durations)[math.ceil(Fraction(95, 100) * n) - 1])


def _fraction(part: int, whole: int) -> Fraction:
    return Fraction(part, whole) if whole else Fraction(0)


def impact(sources: Any) -> Impact | None:
    minutes = _load(sources.metrics_url)["minutes"]
    if not minutes:
        return None
    starts = sorted({_when(m["minute"]) for m in minutes})
    baseline_end = starts[0] + timedelta(minutes=10)
    per_endpoint: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for m in minutes:
        per_endpoint[m["endpoint"]].append(m)

    best: Impact | None = None
    for endpoint, rows in sorted(per_endpoint.items()):
        rows = sorted(rows, key=lambda m: _when(m["minute"]))
        baseline = [m for m in rows if _when(m["minute"]) < baseline_end]
        base_rate = _fraction(sum(m["errors"] for m in baseline),
                              sum(m["requests"] for m in baseline))
        base_p95 = _p95([d for m in baseline for d in m["durations_ms"]])
        limit = max(Fraction(5, 100), 3 * base_rate)
        flags = [m["requests"] >= 10 and (
                     _fraction(m["errors"], m["requests"]) >= limit
                     or _p95(m["durations_ms"]) >= 3 * base_p95)
                 for m in rows]
        if not flags or not flags[-1]:
            continue
        good_before = [i for i, flag in enumerate(flags) if not flag]
        first_bad = good_before[-1] + 1 if good_before else 0
        incident = rows[first_bad:]
        requests = sum(m["requests"] for m in incident)
        failed = sum(m["errors"] for m in incident)
        onset = _when(incident[0]["minute"])
        candidate = Impact(
            endpoint=endpoint, since=onset,
            error_rate=float(_fraction(failed, requests)),
            baseline_error_rate=float(base_rate),
            p95_ms=_p95([d for m in incident for d in m["durations_ms"]]),
            baseline_p95_ms=base_p95,
            requests=requests, failed=failed,
            users=len(set().union(*(m["failed_users"] for m in incident))),
            bad_minutes=len(incident),
            evidence=[f"onset {onset:%H:%M} UTC, {len(incident)} bad minute(s) in a row to "
                      f"the end of the window",
                      f"{failed} of {requests} requests failed since then "
                      f"(baseline {float(base_rate):.3%})"])
        if best is None or candidate.failed > best.failed:
            best = candidate
    return best


def what_changed(sources: Any, since: datetime) -> ChangeFinding:
    window_start = since - timedelta(minutes=15)
    window_end = since + timedelta(minutes=1)
    log = sorted(_load(sources.changes_url)["changes"], key=lambda c: _when(c["at"]))
    times = [_when(c["at"]) for c in log]
    lo, hi = bisect_left(times, window_start), bisect_left(times, window_end)
    inside = log[lo:hi]
    if not inside:
        return ChangeFinding(suspect=None, window_start=window_start, window_end=window_end,
                             evidence=["no change in the window: look elsewhere "
                                       "(traffic, dependencies, capacity)"])
    suspect = inside[-1]
    return ChangeFinding(suspect=suspect, window_start=window_start, window_end=window_end,
                         candidates=[c["id"] for c in inside],
                         evidence=[f"latest change before the onset: {suspect['id']} "
                                   f"({suspect['kind']}, {suspect['service']}) at "
                                   f"{suspect['at']}"])


def root_cause(sources: Any, trace_id: str) -> RootCause | None:
    spans: list[dict[str, Any]] = []
    for path in sources.log_paths:
        for raw in path.read_text(encoding="utf-8").splitlines():
            if raw.strip():
                record = json.loads(raw)
                if record.get("trace_id") == trace_id:
                    spans.append(record)
    failures = [r for r in spans if r.get("level") == "ERROR" and r.get("error")]
    if not failures:
        return None
    children = Counter(r.get("parent_span_id") for r in failures)
    leaves = [r for r in failures if children[r.get("span_id")] == 0] or failures
    deepest = max(leaves, key=lambda r: _when(r["ts"]))
    error, hops = deepest["error"], 0
    while error.get("cause") is not None:
        error, hops = error["cause"], hops + 1
    return RootCause(trace_id=trace_id, service=deepest["service"],
                     exception=error["type"], message=error["message"],
                     evidence=[f"{error['type']} ({hops} cause(s) below "
                               f"{deepest['error']['type']}) in {deepest['service']}"])


SNAPSHOT_SQL = text("""
    SELECT pid, state, query, pg_blocking_pids(pid) AS blocked_by,
           EXTRACT(EPOCH FROM statement_timestamp() - xact_start) AS held_for
      FROM pg_stat_activity
     WHERE datname = current_database() AND pid <> pg_backend_pid()
""")


def blocking_chain(sources: Any) -> Blocking | None:
    engine = create_engine(sources.database_url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            sessions = {row.pid: row for row in conn.execute(SNAPSHOT_SQL)}
    finally:
        engine.dispose()
    waits_for = {pid: set(row.blocked_by or []) for pid, row in sessions.items()}

    def heads_of(pid: int) -> set[int]:
        """Every session at the head of a chain that `pid` waits in."""
        found, seen, todo = set(), {pid}, list(waits_for.get(pid, ()))
        while todo:
            holder = todo.pop()
            if holder in seen:
                continue
            seen.add(holder)
            above = waits_for.get(holder)
            if above:
                todo.extend(above)
            elif holder in sessions:
                found.add(holder)
        return found

    behind: dict[int, set[int]] = defaultdict(set)
    for pid, holders in waits_for.items():
        if holders:
            for head in heads_of(pid):
                behind[head].add(pid)
    if not behind:
        return None
    head = max(behind, key=lambda pid: (len(behind[pid]), -pid))
    row = sessions[head]
    state = row.state or ""
    held = float(row.held_for or 0)
    waiting = sorted(behind[head], reverse=True)
    return Blocking(blocker_pid=head, blocker_query=row.query or "", blocker_state=state,
                    held_for_s=held, waiting_pids=waiting,
                    advice="terminate" if state.startswith("idle in transaction") else "wait",
                    evidence=[f"pid {head} is at the head: {len(waiting)} waiting ({waiting})",
                              f"state {state}, transaction open {held:.1f} s"])


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
