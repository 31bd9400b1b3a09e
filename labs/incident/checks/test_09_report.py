"""Stage report: the whole triage, in the lesson's order, written up as an incident note.

Each check breaks the shop three ways in turn (a payments deploy, a feature flag, an inventory
job holding a row lock: the stage 1-4 scenarios, live), or not at all. The learner's triage()
reaches the system only through `sources`, and the check watches, from outside its code, in
which order it looked: its metrics endpoint and change log note every GET, `request()` notes
every call, and the database URL leads through a relay that notes every connection. The
report is judged by its fields (README, stage 9) against the scenario the check built.
"""

from __future__ import annotations

import re
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from _history import root_of
from _live import SKU, SPARED_USER
from _support import (
    LOCAL_OFFSET,
    LOCAL_TZ,
    MITIGATE,
    ORDER,
    PROVE,
    ConnectionRecorder,
    field_of,
    hm,
    local_hm,
    local_minute_fix,
    machine_time_zone,
)
from sqlalchemy import text

from dojo.checks import CheckFailure, call, table

pytestmark = pytest.mark.stage("report")

# the incidents of this stage, each check sees all three (the seed draws their minutes, users
# and ids: replay with DOJO_INCIDENT_RUN); the row lock last, as its blocker holds the lock
# until the check ends
REPORT_KINDS = ("refund-deploy", "pricing-flag", "stock-lock")
# the looks, in the lesson's order (README, stage 9)
STEPS = ("metrics", "changes", "request", "database")
SAID = {"metrics": "the metrics", "changes": "the change log",
        "request": "a failing request", "database": "the database"}
# the metrics' first answer of each run is held this long, and a first read of the change log
# begun before the metrics answered is held HOLD_EARLY_CHANGES_S: a read of the change log
# begun while the metrics' answer is on its way (at the same time, not after it) reaches the
# recorded change log first, and the two reads overlap
HOLD_FIRST_METRICS_S = 0.08
HOLD_EARLY_CHANGES_S = 0.03
# the incident that also has a lock chain headed by a session running a statement (active)
BUSY_KIND, BUSY_APP, BUSY_SKU = "pricing-flag", "reports/stock-recount", "sku-1041"


class HeldReads:
    """The metrics endpoint and the change log as triage() reaches them: a relay to the
    recorded ones (which note each look when the relay passes the GET on) that holds the
    metrics' first answer, and a change log read that begins before it came. `spans` holds,
    per route, (asked, answered) of each GET."""

    def __init__(self, upstream: dict[str, str]) -> None:
        self.spans: dict[str, list[tuple[float, float]]] = {route: [] for route in upstream}
        self.lock = threading.Lock()
        self.started: set[str] = set()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                route = self.path.split("?")[0]
                asked = time.monotonic()
                with outer.lock:
                    first = route not in outer.started
                    outer.started.add(route)
                    metrics_answered = bool(outer.spans.get("/metrics"))
                if route not in upstream:
                    self.send_response(404)
                    self.end_headers()
                    return
                if first and route == "/metrics":
                    time.sleep(HOLD_FIRST_METRICS_S)
                elif first and not metrics_answered:
                    time.sleep(HOLD_EARLY_CHANGES_S)
                with urllib.request.urlopen(upstream[route], timeout=10) as answer:  # noqa: S310
                    body = answer.read()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                with outer.lock:
                    outer.spans[route].append((asked, time.monotonic()))

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05},
                         daemon=True).start()

    def overlap(self, route: str) -> bool:
        """Whether a GET of `route` and the metrics' first GET were on their way at once."""
        with self.lock:
            metrics, other = self.spans["/metrics"][:1], self.spans.get(route, [])
        return any(a1 < b2 and a2 < b1 for a1, b1 in metrics for a2, b2 in other)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@dataclass
class TriageSources:
    """What triage() gets (README, stage 9): the stage 1-4 attributes and request()."""
    metrics_url: str
    changes_url: str
    log_paths: list[Path]
    now: datetime
    database_url: str
    _shop: Any = None
    _looks: list[tuple[str, float]] = field(default_factory=list)
    _answered: list[int] = field(default_factory=list)

    def request(self, endpoint: str) -> tuple[int, str]:
        """One request to the live shop, as a client makes it: (status, X-Trace-Id). The first
        is a customer the incident spares (README: call it until it answers 500 or above)."""
        first = not any(look == "request" for look, _ in self._looks)
        self._looks.append(("request", time.monotonic()))
        status, trace = (self._shop.request(endpoint, SPARED_USER) if first
                         else self._shop.request(endpoint))
        self._answered.append(status)
        return status, trace


@dataclass
class Run:
    kind: str | None
    scenario: Any
    sources: TriageSources
    looks: list[tuple[str, float]]
    blocker_pid: int | None = None
    held: HeldReads | None = None
    busy_pid: int | None = None         # a blocker running a statement (active): waited for

    def first_looks(self) -> list[str]:
        """Each kind of look once, in the order of its first occurrence."""
        seen: list[str] = []
        for what, _at in sorted(self.looks, key=lambda look: look[1]):
            if what in STEPS and what not in seen:
                seen.append(what)
        return seen

    def want(self) -> tuple[str, str]:
        """The first mitigation the README asks for: (action, target)."""
        if self.blocker_pid is not None:
            return "terminate", str(self.blocker_pid)
        return "rollback", str(self.scenario.suspect_id)

    def evidence(self) -> str:
        scenario = self.scenario
        rows = [(c["id"], c["at"], c["kind"], c["service"], c["description"])
                for c in sorted(scenario.changes, key=lambda c: c["at"])]
        text_ = scenario.describe()
        if scenario.since is not None:
            text_ += (f"\nincident: {scenario.endpoint} failing since {hm(scenario.since)}"
                      f"; its request fails with {root_of(scenario.kind)[1]}")
        if self.blocker_pid is not None:
            text_ += f"\nrow lock on stock held by inventory-sync, pid {self.blocker_pid}, idle"
        if self.busy_pid is not None:
            text_ += (f"\nrow lock on stock held by {BUSY_APP}, pid {self.busy_pid}, running a "
                      "statement (active), an order session waiting behind it")
        return (text_ + "\nthe change log:\n"
                + table(rows, ("id", "at", "kind", "service", "description"))
                + "\nwhat triage() looked at, in order: "
                + (", ".join(SAID[w] for w in self.first_looks()) or "nothing"))


@pytest.fixture
def report_run(shop: Callable[..., Any], database: Any) -> Iterator[Callable[[str | None], Run]]:
    """report_run(kind) → the live shop broken the way `kind` says (None: healthy), with the
    sources triage() gets; for stock-lock an order session queues behind the job's lock."""
    relays: list[ConnectionRecorder] = []
    relayed: list[HeldReads] = []
    busy: list[tuple[threading.Thread, list[int]]] = []
    waiters: list[tuple[threading.Thread, list[int]]] = []
    observer = database.make_admin_engine()

    def end_busy_chains() -> None:
        """The next incident has no busy chain (the row lock's would tie with it)."""
        while busy:
            thread, pids = busy.pop()
            with observer.connect() as conn:
                for pid in pids:
                    conn.execute(text("SELECT pg_cancel_backend(:p)"), {"p": pid})
            thread.join(10)

    def make(kind: str | None) -> Run:
        end_busy_chains()
        the_shop, scenario, base = shop(kind)
        looks: list[tuple[str, float]] = base.extra["looks"]
        relay = ConnectionRecorder(database.url, looks)
        relays.append(relay)
        reads = HeldReads({"/metrics": base.metrics_url, "/changes": base.changes_url})
        relayed.append(reads)
        sources = TriageSources(f"{reads.base}/metrics", f"{reads.base}/changes",
                                base.log_paths, base.now, relay.url, the_shop, looks)
        run = Run(kind, scenario, sources, looks, held=reads)
        if kind == "stock-lock":
            with observer.connect() as conn:
                run.blocker_pid = int(conn.execute(text(
                    "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                    "AND application_name = 'inventory-sync'")).scalar_one())
            pids: list[int] = []
            thread = threading.Thread(target=_queue_behind, args=(database, pids), daemon=True)
            thread.start()
            waiters.append((thread, pids))
            _wait_for_lock_waiter(observer)
        if kind == BUSY_KIND:
            # a recount running a long statement holds another row, an order waits behind it:
            # a lock chain whose head is active (stage 4 advice "wait"), beside the flag
            pids = []
            thread = threading.Thread(target=_busy_chain, args=(database, pids), daemon=True)
            thread.start()
            busy.append((thread, pids))
            _wait_for_lock_waiter(observer)
            run.busy_pid = pids[0]
        return run

    try:
        yield make
    finally:
        end_busy_chains()
        with observer.connect() as conn:
            for _thread, pids in waiters:
                for pid in pids:
                    conn.execute(text("SELECT pg_cancel_backend(:p)"), {"p": pid})
        for thread, _pids in waiters:
            thread.join(10)
        for relay in relays:
            relay.close()
        for reads in relayed:
            reads.close()
        observer.dispose()


def _queue_behind(database: Any, pids: list[int], sku: str = SKU) -> None:
    """An order session waiting for a stock row (a request stuck behind the job's lock)."""
    engine = database.make_engine(connect_args={"application_name": "orders-api/place-order"})
    try:
        with engine.begin() as conn:
            pids.append(int(conn.execute(text("SELECT pg_backend_pid()")).scalar_one()))
            conn.execute(text("SET LOCAL statement_timeout = '60s'"))
            conn.execute(text("UPDATE stock SET qty = qty - 1 WHERE sku = :s"), {"s": sku})
    except Exception:  # noqa: BLE001 (cancelled when the check ends)
        pass
    finally:
        engine.dispose()


def _busy_chain(database: Any, pids: list[int]) -> None:
    """A session running one long statement that holds a row lock on BUSY_SKU (active), and
    an order session waiting for that row; pids[0] is the active one."""
    busy = database.make_engine(connect_args={"application_name": BUSY_APP})
    try:
        with busy.connect() as conn:
            pids.append(int(conn.execute(text("SELECT pg_backend_pid()")).scalar_one()))
            conn.commit()
            waiter = threading.Thread(target=_queue_behind, args=(database, pids, BUSY_SKU),
                                      daemon=True)
            conn.execute(text("SET statement_timeout = '60s'"))
            later = threading.Timer(0.05, waiter.start)
            later.start()
            conn.execute(text(
                "WITH held AS (UPDATE stock SET qty = qty WHERE sku = :s RETURNING sku) "
                "SELECT pg_sleep(60) FROM held"), {"s": BUSY_SKU})
    except Exception:  # noqa: BLE001 (cancelled when the check ends)
        pass
    finally:
        busy.dispose()


def _wait_for_lock_waiter(observer: Any) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with observer.connect() as conn:
            if conn.execute(text(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND wait_event_type = 'Lock'")).scalar_one():
                return
        time.sleep(0.02)
    raise AssertionError("PostgreSQL never showed the order session waiting on the lock")


def _triage(learner: Any, run: Run) -> Any:
    return call(learner.module("triage").triage, run.sources)


def _minute(at: Any) -> datetime | None:
    if isinstance(at, datetime) and at.tzinfo is not None:
        return at.astimezone(UTC).replace(second=0, microsecond=0)
    return None


def test_impact_is_measured_before_any_cause(learner, report_run):
    # every incident: the looks a triage takes may depend on what it finds
    for kind in REPORT_KINDS:
        _looks_in_order(learner, report_run(kind))


def _looks_in_order(learner: Any, run: Run) -> None:
    _triage(learner, run)
    order = run.first_looks()
    expected = ("the metrics first; then, of what it looks at, the change log before a "
                "failing request, a failing request before the database")
    if not order or order[0] != "metrics":
        first = SAID[order[0]] if order else "nothing"
        fix = (f"It looked at {first} before the metrics. Impact comes first: which endpoint, "
               "since when, how many users; it says whether there is an incident at all and "
               "when it began, which is what the change log and a failing request are read "
               "against. Measure the impact, then look for causes.")
        if order and order[0] == "changes" and run.held is not None and run.held.overlap(
                "/changes"):
            fix = ("It asked for the metrics and for the change log at the same time: the change "
                   "log's answer came while the metrics' answer was still on its way (held "
                   f"{HOLD_FIRST_METRICS_S * 1000:.0f} ms here). Two reads at once are in no "
                   "order. Read the metrics, take the impact from them, then read the next "
                   "source.")
        raise CheckFailure(
            "triage() looked for a cause before it measured the impact.",
            expected=expected,
            actual="looked at " + ", ".join(SAID[w] for w in order) if order
            else "never read the metrics",
            evidence=run.evidence(),
            lesson=ORDER,
            fix=fix,
        )
    ranks = [STEPS.index(w) for w in order]
    if ranks == sorted(ranks):
        return
    raise CheckFailure(
        "triage() did not look in the lesson's order.",
        expected=expected,
        actual="looked at " + ", ".join(SAID[w] for w in order),
        evidence=run.evidence(),
        lesson=ORDER,
        fix=("Cheap, broad signals first: what changed, then one failing request, then the "
             "service's own health and its dependencies (the database)."),
    )


def test_the_report_names_the_incident_and_its_cause(learner, report_run):
    # every incident: each fails its own endpoint with its own status (500, 502, 503)
    for kind in REPORT_KINDS:
        _names_the_incident(learner, report_run(kind))


def _names_the_incident(learner: Any, run: Run) -> None:
    scenario = run.scenario
    report = _triage(learner, run)
    impact = field_of(report, "impact")
    cause = field_of(report, "root_cause")
    _service, exception, _message = root_of(scenario.kind)
    got = {
        "healthy": field_of(report, "healthy"),
        "impact.endpoint": field_of(impact, "endpoint") if impact is not None else None,
        "impact.since": hm(field_of(impact, "since")) if impact is not None else None,
        "suspect": field_of(report, "suspect"),
        "root_cause.exception": field_of(cause, "exception") if cause is not None else None,
    }
    want = {
        "healthy": False,
        "impact.endpoint": scenario.endpoint,
        "impact.since": hm(scenario.since),
        "suspect": scenario.suspect_id,
        "root_cause.exception": exception,
    }
    alarm = field_of(report, "missing_alarm")
    wrong = [(name, want[name], got[name]) for name in want if got[name] != want[name]]
    if not (isinstance(alarm, str) and scenario.endpoint in alarm):
        wrong.append(("missing_alarm", f"a str naming {scenario.endpoint}", alarm))
    if not wrong:
        return
    answered = run.sources._answered
    failures = sorted({status for status in answered if status >= 500})
    fix = None
    if got["root_cause.exception"] is None and answered and not failures:
        made = "one request(), which" if len(answered) == 1 else (
            f"{len(answered)} request() calls, which all")
        fix = (f"triage() made {made} went through: an incident seldom fails every request. "
               "Call request() again, a few tries, until one answers 500 or above, and follow "
               "that one.")
    elif got["root_cause.exception"] is None and failures and 500 not in failures:
        fix = (f"request() answered {', '.join(map(str, failures))}: a failed request, though "
               "not 500 (502: a call to payments failed; 503: a lock wait ran out). Any status "
               "of 500 or above is a failure: follow its trace id.")
    raise CheckFailure(
        "triage() did not report the incident, its suspect change and its root cause.",
        expected="; ".join(f"{name} {value!r}" for name, value, _got in wrong),
        actual="; ".join(f"{name} {value!r}" for name, _want, value in wrong)[:400],
        evidence=run.evidence(),
        lesson=PROVE,
        fix=fix,
    )


def test_the_first_mitigation_stops_the_bleeding(learner, report_run):
    # every incident: a change to roll back (a deploy, a flag), and the row lock, where a
    # blocker and a suspect change meet, so the order between terminate and rollback shows
    for kind in REPORT_KINDS:
        _first_mitigation(learner, report_run(kind))


def _first_mitigation(learner: Any, run: Run) -> None:
    report = _triage(learner, run)
    action, target = field_of(report, "mitigation"), field_of(report, "target")
    want_action, want_target = run.want()
    if action == want_action and str(target) == want_target:
        return
    _service, exception, _message = root_of(run.scenario.kind)
    fix = None
    if action == "terminate" and want_action == "rollback" and run.busy_pid is not None:
        fix = (f"The session at the head of the lock chain (pid {run.busy_pid}) is running a "
               "statement (active): stage 4 advises to wait, it will commit or fail on its "
               "own. Terminate only a blocker idle in transaction; otherwise roll back the "
               "suspect change.")
    elif action == "rollback" and want_action == "terminate":
        fix = ("Rolling back the change that started the job does not end the transaction it "
               "holds open: the lock stays until that session ends. Terminate the blocker "
               "first (its work is rolled back), then undo the change.")
    elif action not in ("rollback", "terminate", "fail-fast") or exception in str(target):
        fix = ("That fixes the root cause: a code change, a review and a deploy while users "
               "keep failing. Stop the bleeding first with what undoes the harm now (roll "
               "back the suspect change, or end the blocking session), then fix the cause.")
    raise CheckFailure(
        "triage() did not put first the mitigation that stops the bleeding.",
        expected=f"mitigation {want_action!r}, target {want_target!r}",
        actual=f"mitigation {action!r}, target {target!r}"[:300],
        evidence=run.evidence(),
        lesson=MITIGATE,
        fix=fix,
    )


def test_a_healthy_system_gets_a_healthy_report(learner, report_run):
    run = report_run(None)
    report = _triage(learner, run)
    got = {name: field_of(report, name)
           for name in ("healthy", "impact", "suspect", "root_cause", "mitigation", "target")}
    note = str(report)
    if (got["healthy"] is True and all(got[name] is None for name in got if name != "healthy")
            and "healthy" in note.lower()):
        return
    fix = None
    if got["suspect"] is not None or got["mitigation"] is not None:
        fix = ("Nothing is failing: no endpoint is in an incident. A change with no symptom "
               "after it is not a cause, and rolling back or terminating on a healthy system "
               "takes a risk for nothing. Report healthy and name no cause.")
    raise CheckFailure(
        "triage() raised an alarm on a healthy system."
        if got["healthy"] is not True or fix else
        "triage()'s report of a healthy system does not say so.",
        expected="healthy True; impact, suspect, root_cause, mitigation and target None; the "
                 "note (str(report)) says healthy",
        actual="; ".join(f"{name} {value!r}" for name, value in got.items())[:300]
        + f"; note {note[:120]!r}",
        evidence=run.evidence(),
        lesson=ORDER,
        fix=fix,
    )


def test_the_report_carries_its_evidence(learner, report_run):
    # every incident: the blocker's pid is needed in the row lock's only
    for kind in REPORT_KINDS:
        _carries_its_evidence(learner, report_run(kind))


def _carries_its_evidence(learner: Any, run: Run) -> None:
    scenario = run.scenario
    with machine_time_zone(LOCAL_TZ):      # an onset written in local time is not UTC
        report = _triage(learner, run)
    listed = field_of(report, "evidence")
    _service, exception, _message = root_of(scenario.kind)
    needed = {"the onset minute": scenario.since.strftime("%H:%M"),
              "the suspect change": str(scenario.suspect_id), "the root cause": exception}
    if run.blocker_pid is not None:
        needed["the blocker's pid"] = str(run.blocker_pid)
    if isinstance(listed, list) and listed and all(isinstance(e, str) for e in listed):
        missing = [what for what, word in needed.items() if not any(word in e for e in listed)]
    else:
        missing = list(needed)
    if not missing:
        return
    fix = (local_minute_fix(needed["the onset minute"], local_hm(scenario.since), listed)
           if "the onset minute" in missing else None)
    raise CheckFailure(
        "triage() returned a report without the evidence that supports it.",
        expected="evidence: a non-empty list of str naming " + ", ".join(needed)
        + " (the onset as HH:MM UTC; the machine's time zone is UTC+05:45)",
        actual="nothing names " + ", ".join(missing) + f"; evidence {listed!r}"[:200],
        evidence=run.evidence(),
        lesson=PROVE,
        fix=fix,
    )


def test_the_report_reads_as_an_incident_note(learner, report_run):
    # every incident: the target is a change's id, or the blocker's pid
    for kind in REPORT_KINDS:
        _reads_as_an_incident_note(learner, report_run(kind))


def _reads_as_an_incident_note(learner: Any, run: Run) -> None:
    scenario = run.scenario
    with machine_time_zone(LOCAL_TZ):      # triage() runs and its note is written there
        report = _triage(learner, run)
        note = str(report)
    _action, target = run.want()
    onset = scenario.since.strftime("%H:%M")
    local = scenario.since.astimezone(timezone(LOCAL_OFFSET)).strftime("%H:%M")
    needed = {"the endpoint": scenario.endpoint, "the onset minute": onset,
              "the mitigation's target": target}
    missing = [what for what, word in needed.items() if word not in note]
    # the onset in the machine's local time, labelled as UTC
    mislabelled = re.search(rf"(?<![\d:]){local}(?::\d\d(?:\.\d+)?)?\s*\(?(?:UTC|GMT|Z\b)",
                            note)
    if not missing and mislabelled is None:
        return
    fix = None
    if mislabelled is not None:
        fix = (f"{mislabelled.group(0)!r} is the onset {onset} UTC in the machine's local time "
               f"zone (UTC+05:45 here): a datetime turned local (astimezone() without a zone, "
               "time.localtime) is not UTC. Write the onset from its UTC value: "
               "since.astimezone(timezone.utc).")
    raise CheckFailure(
        "str(report) is not an incident note a colleague can act on.",
        expected="a note naming " + ", ".join(f"{what} ({word})" for what, word in needed.items())
        + f"; the onset as {onset} UTC (the machine's time zone is UTC+05:45)",
        actual=(("it does not name " + ", ".join(missing)) if missing else
                f"it gives the onset as {mislabelled.group(0)!r}")  # type: ignore[union-attr]
        + f": {(note.splitlines() or [''])[0][:200]!r}",
        evidence=run.evidence(),
        lesson=PROVE,
        fix=fix,
    )
