"""Correct design 2, written from the starter: SQLAlchemy with a single snapshot query per
look and graph/aggregation work in Python; the baseline located from sources.now; stage 3
walks the ERROR span tree top-down; stage 7 through the Kafka AdminClient (OffsetFetch and
ListOffsets) and a group-less consumer to read the record."""

from __future__ import annotations

import heapq
import json
import math
import re
import urllib.request
import uuid
from collections import Counter, defaultdict, deque
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

import sqlalchemy as sa


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


def fetch_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.load(response)


def _t(s: str) -> datetime:
    return datetime.fromisoformat(s.replace("Z", "+00:00")).astimezone(timezone.utc)


def _p95(values) -> float:
    values = list(values)
    if not values:
        return 0.0
    k = math.ceil(95 * len(values) / 100)    # integer arithmetic: the nearest rank
    return float(heapq.nsmallest(k, values)[-1])


class _Window:
    """One endpoint's minutes with the baseline split off by the clock."""

    def __init__(self, rows: list[dict], baseline_end: datetime):
        self.rows = sorted(rows, key=lambda r: _t(r["minute"]))
        self.base = [r for r in self.rows if _t(r["minute"]) < baseline_end]
        req = sum(r["requests"] for r in self.base)
        self.base_rate = sum(r["errors"] for r in self.base) / req if req else 0.0
        self.base_p95 = _p95(d for r in self.base for d in r["durations_ms"])

    def is_bad(self, r: dict) -> bool:
        if r["requests"] < 10:
            return False
        if r["errors"] / r["requests"] >= max(0.05, 3 * self.base_rate):
            return True
        return self.base_p95 > 0 and _p95(r["durations_ms"]) >= 3 * self.base_p95

    def tail(self) -> list[dict]:
        out: deque = deque()
        for r in reversed(self.rows):
            if not self.is_bad(r):
                break
            out.appendleft(r)
        return list(out)


def impact(sources: Any) -> Impact | None:
    minutes = fetch_json(sources.metrics_url)["minutes"]
    now = sources.now.astimezone(timezone.utc)
    start = now - timedelta(minutes=40)
    # the window's first minute: the first row at or after now - 40 min (robust to a now
    # that is not on a minute boundary)
    first = min((_t(r["minute"]) for r in minutes if _t(r["minute"]) >= start - timedelta(seconds=59)),
                default=start)
    baseline_end = first + timedelta(minutes=10)
    grouped = defaultdict(list)
    for r in minutes:
        grouped[r["endpoint"]].append(r)
    best: Impact | None = None
    for ep, rows in grouped.items():
        w = _Window(rows, baseline_end)
        tail = w.tail()
        if not tail:
            continue
        req = sum(r["requests"] for r in tail)
        failed = sum(r["errors"] for r in tail)
        since = _t(tail[0]["minute"])
        users = len(set().union(*(r["failed_users"] for r in tail)))
        cand = Impact(ep, since, failed / req if req else 0.0, w.base_rate,
                      _p95(d for r in tail for d in r["durations_ms"]), w.base_p95,
                      req, failed, users,
                      [f"onset {since:%H:%M}: {ep} error rate {failed / req if req else 0:.1%} "
                       f"since, p95 {_p95(d for r in tail for d in r['durations_ms']):.0f} ms"])
        if best is None or cand.failed > best.failed:
            best = cand
    return best


def what_changed(sources: Any, since: datetime) -> ChangeFinding:
    start = since - timedelta(minutes=15)       # aware arithmetic compares instants
    end = since + timedelta(minutes=1)
    best = None
    for c in fetch_json(sources.changes_url)["changes"]:
        at = _t(c["at"])
        if start <= at < end and (best is None or at > best[0]):
            best = (at, c)
    if best is None:
        return ChangeFinding(None, start, end, ["no change in the window"])
    c = best[1]
    return ChangeFinding(c, start, end, [f"change {c['id']} {c['kind']} at {c['at']}"])


def root_cause(sources: Any, trace_id: str) -> RootCause | None:
    lines = []
    for p in sources.log_paths:
        with open(p, "rb") as fh:
            for raw in fh:
                try:
                    obj = json.loads(raw)
                except ValueError:
                    continue
                if isinstance(obj, dict) and obj.get("trace_id") == trace_id:
                    lines.append(obj)
    errors = {l["span_id"]: l for l in lines if l.get("level") == "ERROR" and l.get("error")}
    if not errors:
        return None
    # top-down: start at an ERROR line whose parent is not an ERROR line, follow ERROR children
    kids = defaultdict(list)
    for l in errors.values():
        kids[l.get("parent_span_id")].append(l)
    tops = [l for l in errors.values() if l.get("parent_span_id") not in errors]
    node = tops[0] if tops else next(iter(errors.values()))
    seen = set()
    while kids.get(node["span_id"]) and node["span_id"] not in seen:
        seen.add(node["span_id"])
        node = kids[node["span_id"]][0]
    err = node["error"]
    path = [err["type"]]
    while err.get("cause") is not None:
        err = err["cause"]
        path.append(err["type"])
    return RootCause(trace_id, node["service"], err["type"], err["message"],
                     [f"root cause {err['type']} ({' -> '.join(path)}) in {node['service']}"])


ACTIVITY = sa.text("""
    SELECT pid, state, query, pg_blocking_pids(pid) AS by,
           EXTRACT(EPOCH FROM clock_timestamp() - xact_start) AS held
      FROM pg_stat_activity
     WHERE datname = current_database() AND pid <> pg_backend_pid()
""")


def _engine(sources: Any) -> sa.Engine:
    return sa.create_engine(sources.database_url, poolclass=sa.pool.NullPool)


def blocking_chain(sources: Any) -> Blocking | None:
    eng = _engine(sources)
    try:
        with eng.connect() as c:
            rows = {r.pid: r for r in c.execute(ACTIVITY)}
    finally:
        eng.dispose()
    graph = defaultdict(set)           # holder -> direct waiters
    for r in rows.values():
        for h in r.by or []:
            graph[h].add(r.pid)
    if not graph:
        return None

    def behind(pid: int) -> set[int]:
        out, stack = set(), [pid]
        while stack:
            for w in graph[stack.pop()]:
                if w not in out:
                    out.add(w)
                    stack.append(w)
        out.discard(pid)
        return out

    heads = [h for h in graph if not (rows.get(h) and rows[h].by)]
    if not heads:
        return None
    ranked = sorted(((len(behind(h)), h) for h in heads), reverse=True)
    head = ranked[0][1]
    r = rows.get(head)
    state = (r.state if r else "") or ""
    advice = "terminate" if state.startswith("idle in transaction") else "wait"
    held = float(r.held) if r is not None and r.held is not None else 0.0
    return Blocking(head, (r.query if r else "") or "", state, held, sorted(behind(head)),
                    advice, [f"pid {head} heads the chain ({state}), {held:.1f} s"])


STATS = sa.text("""
    WITH mine AS (
        SELECT * FROM pg_stat_statements
         WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
           AND queryid IS NOT NULL
    ), texts AS (
        SELECT DISTINCT ON (queryid) queryid, query FROM mine
         ORDER BY queryid, toplevel DESC
    )
    SELECT m.queryid, t.query, sum(m.calls) AS calls, sum(m.total_exec_time) AS ms
      FROM mine m JOIN texts t USING (queryid)
     GROUP BY m.queryid, t.query
""")


def statement_stats(sources: Any) -> list[tuple[int, str, int, float]]:
    eng = _engine(sources)
    try:
        with eng.begin() as c:
            return [(int(r.queryid), r.query, int(r.calls), float(r.ms)) for r in c.execute(STATS)]
    finally:
        eng.dispose()


def slow_query(sources: Any, before: list[tuple[int, str, int, float]]) -> SlowQuery | None:
    then = {q: (calls, ms) for q, _, calls, ms in before}
    regressed = []
    for qid, query, calls, ms in statement_stats(sources):
        if qid not in then:
            continue
        c0, t0 = then[qid]
        c1, t1 = calls - c0, ms - t0
        if min(c0, c1) < 3:
            continue
        m0, m1 = t0 / c0, t1 / c1
        if m1 >= 3 * m0 and m1 - m0 >= 1:
            regressed.append((m1 / m0 if m0 else math.inf, qid, query, c0, c1, m0, m1))
    if not regressed:
        return None
    factor, qid, query, c0, c1, m0, m1 = max(regressed)
    eng = _engine(sources)
    try:
        with eng.connect() as c:
            raw = c.connection.driver_connection        # psycopg connection
            cur = raw.cursor()
            cur.execute("EXPLAIN (GENERIC_PLAN) " + query)
            plan = "\n".join(row[0] for row in cur.fetchall())
            raw.rollback()
    finally:
        eng.dispose()
    table = re.search(r"Seq Scan on (\S+)", plan).group(1)
    cols = re.findall(r"\(?(\w+)\)?(?:::[\w ]+)? = \$\d", plan)
    index = f"CREATE INDEX ON {table} ({cols[0]})" if cols else ""
    return SlowQuery(qid, query, c0, c1, m0, m1, plan, index,
                     [f"queryid {qid}: {m0:.2f} ms -> {m1:.2f} ms per call", index])


@dataclass
class PoolLeak:
    application_name: str
    leaked: int
    by_path: dict[str, dict[str, int]]
    evidence: list[str] = field(default_factory=list)


SESSIONS = sa.text("""
    SELECT application_name, state FROM pg_stat_activity
     WHERE datname = current_database() AND pid <> pg_backend_pid()
""")


def connection_leak(sources: Any) -> PoolLeak | None:
    eng = _engine(sources)
    try:
        with eng.connect() as c:
            rows = c.execute(SESSIONS).all()
    finally:
        eng.dispose()
    counts = Counter((r.application_name or "", r.state or "") for r in rows)
    by_path: dict[str, dict[str, int]] = defaultdict(dict)
    for (app, st), n in counts.items():
        by_path[app][st] = n
    leaked = Counter()
    for (app, st), n in counts.items():
        if st in ("idle in transaction", "idle in transaction (aborted)"):
            leaked[app] += n
    top = [(app, n) for app, n in leaked.most_common() if n >= 3]
    if not top:
        return None
    app, n = top[0]
    return PoolLeak(app, n, {k: dict(v) for k, v in by_path.items()},
                    [f"{app}: {n} connections checked out and left in a transaction"])


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


def lag_snapshot(sources: Any) -> dict[int, dict[str, int]]:
    from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition
    from confluent_kafka.admin import AdminClient, OffsetSpec

    admin = AdminClient(dict(sources.kafka))
    md = admin.list_topics(sources.topic, timeout=10).topics[sources.topic]
    parts = sorted(md.partitions)
    req = ConsumerGroupTopicPartitions(
        sources.group, [TopicPartition(sources.topic, p) for p in parts])
    committed = admin.list_consumer_group_offsets([req])[sources.group].result(timeout=15)
    ends = admin.list_offsets({TopicPartition(sources.topic, p): OffsetSpec.latest()
                               for p in parts}, request_timeout=15)
    out = {p: {"committed": None, "end": None} for p in parts}
    for tp in committed.topic_partitions:
        out[tp.partition]["committed"] = tp.offset
    for tp, fut in ends.items():
        out[tp.partition]["end"] = fut.result(timeout=15).offset
    return out


def consumer_lag(sources: Any, before: dict[int, dict[str, int]]) -> ConsumerLag | None:
    from confluent_kafka import Consumer, TopicPartition

    now = lag_snapshot(sources)
    lag = {p: v["end"] - v["committed"] for p, v in now.items()}
    lagging = [p for p in now if lag[p] > 0 and p in before]
    moving = sorted(p for p in lagging if now[p]["committed"] != before[p]["committed"])
    stuck = [p for p in lagging if now[p]["committed"] == before[p]["committed"]]
    if not stuck:
        return None
    p = sorted(stuck, key=lambda x: -lag[x])[0]
    off = now[p]["committed"]
    reader = Consumer({**sources.kafka, "group.id": f"triage-reader-{uuid.uuid4().hex}",
                       "enable.auto.commit": False})
    msg = None
    try:
        reader.assign([TopicPartition(sources.topic, p, off)])
        deadline = 100
        while deadline and msg is None:
            deadline -= 1
            m = reader.poll(0.2)
            if m is not None and m.error() is None and m.offset() == off:
                msg = m
    finally:
        reader.close()
    k = msg.key() if msg is not None else None
    key = k.decode() if k is not None else None
    headers = {n: (v.decode() if v is not None else "") for n, v in (msg.headers() or [])} \
        if msg is not None else {}
    return ConsumerLag(sources.topic, sources.group, lag, moving, p, off, key, headers,
                       [f"partition {p} stuck at offset {off}", f"key {key!r}"])


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
    data = fetch_json(sources.metrics_url)
    state = {d["dependency"]: d["breaker"] for d in data["dependencies"]}
    per = defaultdict(list)
    for r in data["outbound"]:
        per[r["dependency"]].append(r)
    summary, failing = {}, []
    for dep, rows in per.items():
        rows.sort(key=lambda r: _t(r["minute"]))
        calls = sum(r["calls"] for r in rows)
        summary[dep] = {
            "error_rate": (sum(r["errors"] for r in rows) / calls) if calls else 0.0,
            "p95_ms": _p95(d for r in rows for d in r["durations_ms"]),
            "breaker": state.get(dep, "closed"),
        }
        run = []
        for r in reversed(rows):
            bad = r["short_circuited"] > 0 or (r["calls"] and r["timeouts"] / r["calls"] >= 0.2)
            if not bad:
                break
            run.insert(0, r)
        if run:
            failing.append((sum(r["timeouts"] for r in run), dep, run))
    if not failing:
        return None
    _, dep, run = max(failing, key=lambda f: f[0])
    since = _t(run[0]["minute"])
    sent = sum(r["calls"] for r in run)
    to = sum(r["timeouts"] for r in run)
    caused = own = 0
    for r in data["minutes"]:
        if _t(r["minute"]) >= since:
            caused += r["errors_by_cause"].get(dep, 0)
            own += r["errors_by_cause"].get("own", 0)
    return Downstream(dep, since, to / sent if sent else 0.0, state.get(dep, "closed"),
                      caused, own, summary, [f"{dep} failing since {since:%H:%M}"])


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
            return "System healthy. No action."
        return (f"{self.impact.endpoint} down since {self.impact.since:%H:%M}Z. "
                f"Do now: {self.mitigation} -> {self.target}. Suspect {self.suspect}.\n"
                + "\n".join(self.evidence))


def triage(sources: Any) -> Report:
    imp = impact(sources)
    if imp is None:
        return Report(healthy=True, evidence=["healthy: no bad last minute"])
    ev = list(imp.evidence)
    chg = what_changed(sources, imp.since)
    ev += chg.evidence
    rc = None
    for _ in range(4):
        status, trace = sources.request(imp.endpoint)
        if status >= 500:
            rc = root_cause(sources, trace)
            break
    if rc is not None:
        ev += rc.evidence
    leak = connection_leak(sources)
    lock = blocking_chain(sources)
    sus = chg.suspect["id"] if chg.suspect else None
    if lock is not None and lock.advice == "terminate":
        mit, tgt = "terminate", str(lock.blocker_pid)
        ev += lock.evidence
    elif sus is not None:
        mit, tgt = "rollback", sus
    elif leak is not None:
        mit, tgt = "restart", leak.application_name
    else:
        mit, tgt = None, None
    return Report(False, imp, sus, rc, mit, tgt,
                  f"alert: {imp.endpoint} 5xx rate above baseline for 1 minute", ev)
