"""The results protocol: typed events and their JSON-lines form (one codec, both directions).

The check child writes one JSON object per line; the parent (`dojo.runner.execute`) decodes
them and yields typed events to the CLI and the TUI, which render them. Every line carries
`"event"` (its kind) and `"version"` (PROTOCOL_VERSION):

  {"event": "collected", "checks": [{"nodeid", "stage", "check"}, …]}
  {"event": "started", "nodeid", "stage", "check", "limit"}
  {"event": "result", "stage", "check", "status", "message", "hint", "lesson", "duration",
   "nodeid", "failure": {what, expected, actual, evidence, lessons, fix} | null,
   "needs": ["transactions", …]}
  {"event": "services-starting", "services": ["postgres", "kafka"]}
  {"event": "services-ready", "seconds", "started": [...], "backend"}

`status` is pass | fail | error | needs-backend | infra; needs-backend is never a pass, and
infra (a service broke, not the learner's code) is neither a pass nor the learner's failure.
A failed check's typed fields travel in `failure` (rendered by the interfaces, the lesson link
once); `message` keeps the whole text for readers that only want text (and golden files).
A needs-backend result lists what the broker lacks in `needs`. Lines without a version are
version 1 (no failure, no needs) and still decode.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, cast, get_args

from dojo.checks.failure import FailureReport

PROTOCOL_VERSION = 2

Status = Literal["pass", "fail", "error", "needs-backend", "infra"]
STATUSES: tuple[Status, ...] = get_args(Status)
# what a needs-backend check lacks when it is not Kafka semantics: a PostgreSQL setting
POSTGRES_NEEDS = frozenset({"pg_stat_statements"})
POSTGRES_LABEL = "needs a PostgreSQL setting"
KAFKA_LABEL = "needs Apache Kafka"

StageStatus = Literal["pass", "fail", "error", "needs-backend", "infra", "not-run"]


@dataclass(frozen=True)
class CheckResult:
    """What one check found. `message` teaches (expected, got, the state that proves it);
    `failure` holds the same as typed fields when the check raised a CheckFailure."""

    stage: str
    check: str
    status: Status
    message: str = ""
    hint: str = ""
    lesson: str = ""
    duration: float = 0.0
    nodeid: str = ""  # pytest's id; the runner uses it to resume after a hang or crash
    failure: FailureReport | None = None
    needs: tuple[str, ...] = ()  # needs-backend: the capabilities the broker lacks

    @property
    def passed(self) -> bool:
        return self.status == "pass"

    @property
    def needs_postgres_setting(self) -> bool:
        """A needs-backend result whose missing capability is a PostgreSQL server setting
        (an extension to preload), not Kafka semantics the broker lacks."""
        return (self.status == "needs-backend" and bool(self.needs)
                and set(self.needs) <= POSTGRES_NEEDS)

    @property
    def needs_label(self) -> str:
        """What a needs-backend result waits for, in the words both front ends show."""
        return POSTGRES_LABEL if self.needs_postgres_setting else KAFKA_LABEL

    @property
    def check_id(self) -> str:
        """The check id mutants name: the function name without `test_` and parameters."""
        return self.check.split("[", 1)[0]

    @property
    def lessons(self) -> tuple[str, ...]:
        """Every lesson section to read, each once: the failure's, then the stage's."""
        found = list(self.failure.lessons) if self.failure else []
        if self.lesson and self.lesson not in found:
            found.append(self.lesson)
        return tuple(found)

    def to_json(self) -> str:
        """One JSON line (no trailing newline), as the protocol writes it."""
        return encode_event(self)

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> CheckResult:
        """Build from a decoded JSON object; ValueError on a wrong shape or status."""
        status = raw.get("status")
        if status not in STATUSES:
            raise ValueError(f"status must be one of {', '.join(STATUSES)}, got {status!r}")
        try:
            failure = raw.get("failure")
            return cls(
                stage=str(raw["stage"]),
                check=str(raw["check"]),
                status=cast(Status, status),
                message=str(raw.get("message", "")),
                hint=str(raw.get("hint", "")),
                lesson=str(raw.get("lesson", "")),
                duration=float(raw.get("duration", 0.0)),
                nodeid=str(raw.get("nodeid", "")),
                failure=FailureReport.from_dict(failure) if isinstance(failure, Mapping)
                else None,
                needs=tuple(str(n) for n in raw.get("needs") or ()),
            )
        except KeyError as exc:
            raise ValueError(f"a check result needs {exc.args[0]!r}") from exc

    @classmethod
    def from_json(cls, line: str) -> CheckResult:
        """Decode one JSON line; ValueError when it is not a check result."""
        event = decode_event(line)
        if not isinstance(event, CheckResult):
            raise ValueError(f"not a check result: {line[:80]!r}")
        return event


@dataclass(frozen=True)
class CheckStarted:
    """The runner began `check`; a UI shows it as running until its result arrives."""

    stage: str
    check: str
    nodeid: str
    limit: float | None = None  # its own time limit, when it has one


@dataclass(frozen=True)
class PlannedCheck:
    """One check the child collected, in the order it will run."""

    nodeid: str
    stage: str
    check: str


@dataclass(frozen=True)
class Collected:
    """The child collected its checks (the run's plan)."""

    checks: tuple[PlannedCheck, ...]


@dataclass(frozen=True)
class ServicesStarting:
    """PostgreSQL and/or Kafka are being started for this run; an interface shows a spinner
    with the time elapsed until `ServicesReady` (or a result saying they failed)."""

    services: tuple[str, ...]


@dataclass(frozen=True)
class ServicesReady:
    """The services are up; the run's checks use these, resolved once for the whole run."""

    seconds: float
    started: tuple[str, ...] = ()  # what this run had to start ("postgres", "kafka")
    backend: str = ""  # the Kafka backend: tansu | apache | external


RunEvent = ServicesStarting | ServicesReady | CheckStarted | CheckResult
ProtocolEvent = RunEvent | Collected

_KINDS: dict[type, str] = {Collected: "collected", CheckStarted: "started",
                           CheckResult: "result", ServicesStarting: "services-starting",
                           ServicesReady: "services-ready"}


def encode_event(event: ProtocolEvent) -> str:
    """One JSON line (no newline) for `event`, with its kind and the protocol version."""
    fields: dict[str, Any]
    if isinstance(event, CheckResult):
        fields = {"stage": event.stage, "check": event.check, "status": event.status,
                  "message": event.message, "hint": event.hint, "lesson": event.lesson,
                  "duration": event.duration, "nodeid": event.nodeid,
                  "failure": event.failure.to_dict() if event.failure else None,
                  "needs": list(event.needs)}
    elif isinstance(event, CheckStarted):
        fields = {"nodeid": event.nodeid, "stage": event.stage, "check": event.check,
                  "limit": event.limit}
    elif isinstance(event, Collected):
        fields = {"checks": [{"nodeid": c.nodeid, "stage": c.stage, "check": c.check}
                             for c in event.checks]}
    elif isinstance(event, ServicesStarting):
        fields = {"services": list(event.services)}
    else:
        fields = {"seconds": event.seconds, "started": list(event.started),
                  "backend": event.backend}
    return json.dumps({"event": _KINDS[type(event)], "version": PROTOCOL_VERSION, **fields},
                      ensure_ascii=False)


def decode_event(line: str | Mapping[str, Any]) -> ProtocolEvent:
    """The event in one JSON line (or its decoded object).

    A line without "event" is a version-1 result line. ValueError for anything else that
    is not an event of this protocol, or from a newer protocol version.
    """
    raw = json.loads(line) if isinstance(line, str) else line
    if not isinstance(raw, Mapping):
        raise ValueError("an event is a JSON object")
    version = raw.get("version", 1)
    if not isinstance(version, int) or version > PROTOCOL_VERSION:
        raise ValueError(f"results protocol version {version!r} is newer than this dojo's "
                         f"({PROTOCOL_VERSION}): update dojo")
    kind = raw.get("event", "result")
    try:
        if kind == "result":
            return CheckResult.from_dict(raw)
        if kind == "started":
            limit = raw.get("limit")
            return CheckStarted(str(raw["stage"]), str(raw["check"]), str(raw["nodeid"]),
                                float(limit) if limit is not None else None)
        if kind == "collected":
            return Collected(tuple(PlannedCheck(str(c["nodeid"]), str(c["stage"]),
                                                str(c["check"])) for c in raw["checks"]))
        if kind == "services-starting":
            return ServicesStarting(tuple(str(s) for s in raw.get("services") or ()))
        if kind == "services-ready":
            return ServicesReady(float(raw.get("seconds", 0.0)),
                                 tuple(str(s) for s in raw.get("started") or ()),
                                 str(raw.get("backend", "")))
    except (KeyError, TypeError) as exc:
        raise ValueError(f"a {kind} event is missing {exc}") from exc
    raise ValueError(f"unknown event {kind!r}")


@dataclass(frozen=True)
class StageSummary:
    """How one stage went. `ran` is False when the run stopped before reaching it."""

    stage: str
    results: tuple[CheckResult, ...]

    @property
    def ran(self) -> bool:
        return bool(self.results)

    def count(self, status: Status) -> int:
        return sum(1 for result in self.results if result.status == status)

    @property
    def passed(self) -> bool:
        """Every check of the stage ran and passed (needs-backend is not a pass)."""
        return self.ran and all(result.passed for result in self.results)

    @property
    def status(self) -> StageStatus:
        """The worst result of the stage (infra, error, fail, needs-backend, pass), or
        not-run."""
        if not self.ran:
            return "not-run"
        worst: tuple[Status, ...] = ("infra", "error", "fail", "needs-backend")
        for status in worst:
            if self.count(status):
                return status
        return "pass"


@dataclass
class RunSummary:
    """Every result of one run, grouped by stage in lab order."""

    stage_order: tuple[str, ...]
    results: list[CheckResult] = field(default_factory=list)

    def add(self, result: CheckResult) -> None:
        self.results.append(result)

    def stages(self) -> list[StageSummary]:
        """One summary per lab stage (in order), then any stage the lab does not name."""
        order = list(self.stage_order)
        order += sorted({r.stage for r in self.results} - set(order))
        return [StageSummary(stage, tuple(r for r in self.results if r.stage == stage))
                for stage in order]

    def count(self, status: Status) -> int:
        return sum(1 for result in self.results if result.status == status)

    @property
    def passed(self) -> bool:
        """True only when every stage ran and every check passed."""
        return all(stage.passed for stage in self.stages())

    @property
    def first_unfinished_stage(self) -> str | None:
        for stage in self.stages():
            if not stage.passed:
                return stage.stage
        return None


def encode_lines(results: Iterable[CheckResult]) -> str:
    """JSON lines, one per result, each ending in a newline."""
    return "".join(encode_event(result) + "\n" for result in results)


def decode_lines(text: str) -> list[CheckResult]:
    """The results in a JSON-lines text; blank lines and non-result events are skipped,
    anything that is not an event raises ValueError."""
    found = (decode_event(line) for line in text.splitlines() if line.strip())
    return [event for event in found if isinstance(event, CheckResult)]
