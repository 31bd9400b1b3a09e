"""A triage toolkit: where to look first when a service starts failing.

Each function reads one kind of signal (metrics, the change log, the logs of one request,
the database's sessions) and returns a finding with the evidence that supports it, or None
when that signal shows nothing wrong. README.md fixes every name, unit and rule the checks
rely on; the finding classes below are ready to use (any object with the same attributes
will do).
"""

from __future__ import annotations

import json
import urllib.request
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any


@dataclass
class Impact:
    endpoint: str                 # "POST /orders"
    since: datetime               # the first bad minute, timezone-aware (UTC)
    error_rate: float             # failed / requests from `since` to now, 0..1
    baseline_error_rate: float    # the same over the first 10 minutes of the window
    p95_ms: float                 # nearest-rank p95 of the durations from `since` on
    baseline_p95_ms: float        # the same over the first 10 minutes
    requests: int                 # requests to the endpoint from `since` on
    failed: int                   # of which failed
    users: int                    # distinct users with a failed request from `since` on
    evidence: list[str] = field(default_factory=list)


@dataclass
class ChangeFinding:
    suspect: dict[str, Any] | None   # the change's record from the change log, or None
    window_start: datetime
    window_end: datetime
    evidence: list[str] = field(default_factory=list)


@dataclass
class RootCause:
    trace_id: str
    service: str                  # the service that logged the deepest cause
    exception: str                # its type, as logged ("builtins.KeyError")
    message: str                  # its message, as its error logged it ("'currency'")
    evidence: list[str] = field(default_factory=list)


@dataclass
class Blocking:
    blocker_pid: int              # the session at the head of the chain
    blocker_query: str            # its last statement (pg_stat_activity.query)
    blocker_state: str            # its state ("idle in transaction", "active")
    held_for_s: float             # seconds its transaction has been open
    waiting_pids: list[int]       # every session waiting behind it, directly or not
    advice: str                   # "terminate" or "wait"
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
    """GET `url` and decode its JSON body."""
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.load(response)


def impact(sources: Any) -> Impact | None:
    """Stage 1: which endpoint is failing, since when, how badly, for how many.

    Returns None when no endpoint is in an incident at the end of the window.
    """
    # TODO: group fetch_json(sources.metrics_url)["minutes"] by endpoint; the baseline is the
    #       first 10 minutes; walk back from the last minute while minutes are bad.
    raise NotImplementedError("impact: scope the incident from the metrics (README, stage 1)")


def what_changed(sources: Any, since: datetime) -> ChangeFinding:
    """Stage 2: the change just before `since`, or none in the window."""
    # TODO: fetch_json(sources.changes_url)["changes"]; keep since - 15 min <= at < since + 1 min
    raise NotImplementedError("what_changed: correlate the onset with the change log "
                              "(README, stage 2)")


def root_cause(sources: Any, trace_id: str) -> RootCause | None:
    """Stage 3: follow one request by its trace id to the deepest cause."""
    # TODO: read every file in sources.log_paths; keep the lines of this trace only
    raise NotImplementedError("root_cause: follow the request through the logs (README, stage 3)")


def blocking_chain(sources: Any) -> Blocking | None:
    """Stage 4: who blocks whom in the database, and what to do about it."""
    # TODO: pg_stat_activity and pg_blocking_pids() through sources.database_url
    raise NotImplementedError("blocking_chain: find the head of the lock chain "
                              "(README, stage 4)")


def statement_stats(sources: Any) -> Any:
    """Stage 5: a snapshot of pg_stat_statements for the shop's database, in any shape
    slow_query() can read back."""
    # TODO: calls and total_exec_time per queryid, rows of this database's dbid only
    raise NotImplementedError("statement_stats: snapshot pg_stat_statements (README, stage 5)")


def slow_query(sources: Any, before: Any) -> SlowQuery | None:
    """Stage 5: the statement whose mean time per call grew since `before`, its plan and
    the index it needs; None when no statement got slower."""
    # TODO: each period's calls and mean from the two snapshots; EXPLAIN (GENERIC_PLAN)
    raise NotImplementedError("slow_query: find the statement the change made slow "
                              "(README, stage 5)")


@dataclass
class PoolLeak:
    application_name: str             # the leaking code path, as pg_stat_activity names it
    leaked: int                       # its sessions idle in transaction
    by_path: dict[str, dict[str, int]]  # sessions per application_name, then per state
    evidence: list[str] = field(default_factory=list)


def connection_leak(sources: Any) -> PoolLeak | None:
    """Stage 6: the code path whose connections are checked out and never returned, with
    every path's sessions counted by state; None when no path leaks."""
    # TODO: count pg_stat_activity per application_name and state (this database only,
    #       not your own session); a path leaks when 3 or more are idle in transaction
    raise NotImplementedError("connection_leak: find the path that leaks connections "
                              "(README, stage 6)")


@dataclass
class ConsumerLag:
    topic: str
    group: str
    lag: dict[int, int]               # partition -> end offset - the group's committed offset
    moving: list[int]                 # lagging partitions whose committed offset advanced
    partition: int                    # the stuck partition
    offset: int                       # its committed offset: the next record the group reads
    key: str | None                   # that record's key, decoded as UTF-8
    headers: dict[str, str]           # its headers, values decoded as UTF-8
    evidence: list[str] = field(default_factory=list)


def lag_snapshot(sources: Any) -> Any:
    """Stage 7: one look at the group: its committed offset and the end offset of every
    partition of sources.topic now, in any shape consumer_lag() can read back."""
    # TODO: confluent_kafka.Consumer({**sources.kafka, "group.id": sources.group,
    #       "enable.auto.commit": False}); committed(...) and get_watermark_offsets(...)
    raise NotImplementedError("lag_snapshot: read the group's committed and end offsets "
                              "(README, stage 7)")


def consumer_lag(sources: Any, before: Any) -> ConsumerLag | None:
    """Stage 7: the lag per partition now, the partition stuck since `before` (a
    lag_snapshot) and the record it is stuck on; None when no partition is stuck."""
    # TODO: lag = end - committed; stuck = lag > 0 and the committed offset did not move
    raise NotImplementedError("consumer_lag: find the partition the group is stuck on "
                              "(README, stage 7)")


@dataclass
class Downstream:
    dependency: str                   # the failing dependency, as the metrics name it
    since: datetime                   # the first minute of its run of bad minutes
    timeout_rate: float               # its calls sent since then that timed out, 0..1
    breaker: str                      # its breaker now: "closed", "open" or "half-open"
    caused_errors: int                # inbound errors it caused since then
    own_errors: int                   # inbound errors of the service's own since then
    by_dependency: dict[str, dict[str, Any]]  # {name: {"error_rate", "p95_ms", "breaker"}}
    evidence: list[str] = field(default_factory=list)


def downstream(sources: Any) -> Downstream | None:
    """Stage 8: the dependency whose outbound calls time out, since when, with every
    dependency's outbound error rate, p95 and breaker; None when no dependency fails."""
    # TODO: fetch_json(sources.metrics_url): "outbound" rows per dependency per minute and
    #       "dependencies" with each breaker's state; a refusing breaker counts as failing
    raise NotImplementedError("downstream: find the dependency that times out "
                              "(README, stage 8)")


@dataclass
class Report:
    healthy: bool                     # True when no endpoint is in an incident
    impact: Impact | None = None      # the stage 1 finding
    suspect: str | None = None        # the suspect change's id
    root_cause: RootCause | None = None   # the stage 3 finding of one failing request
    mitigation: str | None = None     # what to do first: "terminate" or "rollback"
    target: str | int | None = None   # the blocker's pid, or the change's id
    missing_alarm: str | None = None  # the symptom alert that would have paged first
    evidence: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        # TODO: the incident note: endpoint, onset (HH:MM), suspect, mitigation, alarm,
        #       evidence; or a line saying the system is healthy
        return repr(self)


def triage(sources: Any) -> Report:
    """Stage 9: impact, what changed, one failing request (sources.request), the service's
    own health and its dependencies, in that order; the report with the first mitigation."""
    # TODO: impact(sources) first: None means healthy, stop there. Then what_changed,
    #       root_cause of a failing sources.request(endpoint), connection_leak, blocking_chain
    raise NotImplementedError("triage: run the steps in order and write the report "
                              "(README, stage 9)")
