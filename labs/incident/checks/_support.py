"""What the incident checks share: the seed, the sources handed to the learner, the metrics
and change-log server, and the README's arithmetic for the expected answers."""

from __future__ import annotations

import json
import os
import random
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from _history import BASELINE_MINUTES, KINDS, Recorded, Scenario, p95

from dojo.checks import machine_time_zone as any_time_zone

IMPACT = "where-to-look-first#step-1-impact-and-scope"
CHANGE = "where-to-look-first#step-2-what-changed"
REQUEST = "where-to-look-first#step-4-one-failing-request"
LOCKS = "where-to-look-first#step-6-its-dependencies"
SLOW = "where-to-look-first#step-6-its-dependencies"
POOLS = "where-to-look-first#step-5-the-services-own-health"
PROVE = "where-to-look-first#step-7-prove-it-fix-it-learn-from-it"
MITIGATE = "where-to-look-first#step-3-stop-the-bleeding"
ORDER = "where-to-look-first#the-order-and-why-it-is-an-order"


# the machine's time zone while a check's learner code writes an onset as HH:MM: UTC+05:45 (a
# POSIX TZ string, no tz database needed), where no minute reads as it does in UTC
LOCAL_TZ, LOCAL_OFFSET = "<+0545>-05:45", timedelta(hours=5, minutes=45)


def machine_time_zone(tz: str = LOCAL_TZ) -> AbstractContextManager[None]:
    """Run the block with the process's local time zone set to `tz` (TZ and time.tzset)."""
    return any_time_zone(tz)


def local_hm(at: datetime) -> str:
    """`at` as HH:MM in the machine_time_zone() (what astimezone() without a zone gives)."""
    return at.astimezone(timezone(LOCAL_OFFSET)).strftime("%H:%M")


def local_minute_fix(minute: str, local: str, listed: Any) -> str | None:
    """The fix when the evidence names the onset `minute` (UTC) only in the local time zone."""
    if not isinstance(listed, list) or any(isinstance(e, str) and minute in e for e in listed):
        return None
    if not any(isinstance(e, str) and local in e for e in listed):
        return None
    return (f"The evidence names {local}: the onset {minute} UTC in the machine's local time "
            "zone (UTC+05:45 here). A datetime turned local (astimezone() without a zone, "
            "time.localtime) is not UTC: write the onset minute from its UTC value, or from "
            "the metrics' own minute.")


def run_seed() -> int:
    """DOJO_INCIDENT_RUN when set (a replay), else a fresh one for this run."""
    text = os.environ.get("DOJO_INCIDENT_RUN", "").strip()
    return int(text) if text.isdigit() else random.SystemRandom().randrange(1, 10**6)


def run_kind(seed: int) -> str:
    """The incident this run breaks the system with."""
    return KINDS[seed % len(KINDS)]


@dataclass
class Sources:
    """What the learner's functions read. README, "The system"."""
    metrics_url: str
    changes_url: str
    log_paths: list[Path]
    now: datetime
    database_url: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


class _Handler(BaseHTTPRequestHandler):
    routes: dict[str, bytes] = {}
    looks: list[tuple[str, float]] = []

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        route = self.path.split("?")[0]
        body = self.routes.get(route)
        self.looks.append((route.strip("/"), time.monotonic()))
        if body is None:
            self.send_response(404)
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@contextmanager
def observability(scenario: Scenario, recorded: Recorded, log_paths: list[Path]
                  ) -> Iterator[Sources]:
    """The metrics endpoint and the change log served on 127.0.0.1, for the scenario."""
    routes = {
        "/metrics": json.dumps({"service": "shop", "minutes": recorded.minutes}).encode(),
        "/changes": json.dumps({"changes": scenario.changes}).encode(),
    }
    looks: list[tuple[str, float]] = []     # (route, when) of every GET, in order
    handler = type("Handler", (_Handler,), {"routes": routes, "looks": looks})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    # a short poll: shutdown() waits for it when the check ends
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                              daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        sources = Sources(f"{base}/metrics", f"{base}/changes", log_paths, scenario.end)
        sources.extra["looks"] = looks
        sources.extra["routes"] = routes    # a check may change what a route answers
        yield sources
    finally:
        server.shutdown()
        server.server_close()


@dataclass
class Expected:
    endpoint: str
    since: datetime
    error_rate: float
    baseline_error_rate: float
    p95_ms: float
    baseline_p95_ms: float
    requests: int
    failed: int
    users: int
    mean_ms: float


def expected_impact(scenario: Scenario, recorded: Recorded) -> Expected:
    """The README's numbers for the scenario's incident (it has one)."""
    assert scenario.onset is not None and scenario.endpoint is not None
    rows = [r for r in recorded.minutes if r["endpoint"] == scenario.endpoint]
    base = [r for r in rows if _index(scenario, r) < BASELINE_MINUTES]
    after = [r for r in rows if _index(scenario, r) >= scenario.onset]
    durations = [d for r in after for d in r["durations_ms"]]
    return Expected(
        endpoint=scenario.endpoint,
        since=scenario.minute(scenario.onset),
        error_rate=sum(r["errors"] for r in after) / sum(r["requests"] for r in after),
        baseline_error_rate=(sum(r["errors"] for r in base) / sum(r["requests"] for r in base)),
        p95_ms=p95(durations),
        baseline_p95_ms=p95([d for r in base for d in r["durations_ms"]]),
        requests=sum(r["requests"] for r in after),
        failed=sum(r["errors"] for r in after),
        users=len({u for r in after for u in r["failed_users"]}),
        mean_ms=sum(durations) / len(durations),
    )


def baseline_durations(scenario: Scenario, recorded: Recorded) -> list[float]:
    """Every duration of the incident endpoint's baseline minutes."""
    return [d for r in recorded.minutes if r["endpoint"] == scenario.endpoint
            and _index(scenario, r) < BASELINE_MINUTES for d in r["durations_ms"]]


def iso_minute(at: datetime) -> str:
    """A minute as the metrics write it ("2026-03-14T13:58:00.000Z")."""
    return at.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _index(scenario: Scenario, row: dict[str, Any]) -> int:
    at = datetime.fromisoformat(row["minute"].replace("Z", "+00:00"))
    return int((at - scenario.start) / timedelta(minutes=1))


def first_error_minute(recorded: Recorded, endpoint: str) -> str:
    """The minute of the first ERROR line of `endpoint` in orders-api's log."""
    for line in recorded.lines["orders-api"]:
        if line["level"] == "ERROR" and line.get("endpoint") == endpoint:
            return str(line["ts"])[:16]
    return ""


def hm(at: Any) -> str:
    """An answer's time as YYYY-MM-DD HH:MM (UTC), or its repr when it is not a datetime."""
    if isinstance(at, datetime) and at.tzinfo is not None:
        return at.astimezone(UTC).strftime("%Y-%m-%d %H:%M")
    return repr(at)


def field_of(finding: Any, name: str) -> Any:
    """The finding's attribute `name`; a missing one is reported as <missing>."""
    return getattr(finding, name, "<missing>")


class ConnectionRecorder:
    """A TCP relay on 127.0.0.1 in front of PostgreSQL that notes when each connection through
    it opened (`looks`, as the metrics server notes its GETs): the order in which a triage
    looked at the database and at the other sources, seen from outside its code."""

    def __init__(self, url: str, looks: list[tuple[str, float]]) -> None:
        from sqlalchemy.engine import make_url

        target = make_url(url)
        self.upstream = (target.host or "127.0.0.1", target.port or 5432)
        self.looks = looks
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = target.set(host="127.0.0.1", port=self.listener.getsockname()[1]
                              ).render_as_string(hide_password=False)
        self.sockets: list[socket.socket] = []
        self.closed = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.closed.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            self.looks.append(("database", time.monotonic()))
            try:
                server = socket.create_connection(self.upstream, timeout=10)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            self.sockets += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for end in (source, sink):
                try:
                    end.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self.closed.set()
        self.listener.close()
        for end in self.sockets:
            end.close()
