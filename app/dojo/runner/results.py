"""Typed check results and run summaries, and their JSON-lines form.

One `CheckResult` per check, as the runner streams them:
`{"stage", "check", "status", "message", "hint", "lesson", "duration", "nodeid"}`.
`status` is pass | fail | error | needs-backend | infra; needs-backend is never a pass, and
infra (a service broke, not the learner's code) is neither a pass nor the learner's failure.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, cast

Status = Literal["pass", "fail", "error", "needs-backend", "infra"]
STATUSES: tuple[Status, ...] = ("pass", "fail", "error", "needs-backend", "infra")


@dataclass(frozen=True)
class CheckResult:
    """What one check found. `message` teaches (expected, got, the state that proves it)."""

    stage: str
    check: str
    status: Status
    message: str = ""
    hint: str = ""
    lesson: str = ""
    duration: float = 0.0
    nodeid: str = ""  # pytest's id; the runner uses it to resume after a hang or crash

    @property
    def passed(self) -> bool:
        return self.status == "pass"

    @property
    def check_id(self) -> str:
        """The check id mutants name: the function name without `test_` and parameters."""
        return self.check.split("[", 1)[0]

    def to_json(self) -> str:
        """One JSON line (no trailing newline)."""
        return json.dumps(asdict(self), ensure_ascii=False)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> CheckResult:
        """Build from a decoded JSON object; ValueError on a wrong shape or status."""
        status = raw.get("status")
        if status not in STATUSES:
            raise ValueError(f"status must be one of {', '.join(STATUSES)}, got {status!r}")
        try:
            return cls(
                stage=str(raw["stage"]),
                check=str(raw["check"]),
                status=cast(Status, status),
                message=str(raw.get("message", "")),
                hint=str(raw.get("hint", "")),
                lesson=str(raw.get("lesson", "")),
                duration=float(raw.get("duration", 0.0)),
                nodeid=str(raw.get("nodeid", "")),
            )
        except KeyError as exc:
            raise ValueError(f"a check result needs {exc.args[0]!r}") from exc

    @classmethod
    def from_json(cls, line: str) -> CheckResult:
        """Decode one JSON line; ValueError when it is not a check result."""
        raw = json.loads(line)
        if not isinstance(raw, dict):
            raise ValueError("a check result is a JSON object")
        return cls.from_dict(raw)


@dataclass(frozen=True)
class CheckStarted:
    """The runner began `check`; a UI shows it as running until its result arrives."""

    stage: str
    check: str
    nodeid: str


RunEvent = CheckStarted | CheckResult


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
    def status(self) -> str:
        """pass | fail | error | needs-backend | not-run: the worst result of the stage."""
        if not self.ran:
            return "not-run"
        for status in ("infra", "error", "fail", "needs-backend"):
            if self.count(cast(Status, status)):
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
    return "".join(result.to_json() + "\n" for result in results)


def decode_lines(text: str) -> list[CheckResult]:
    """The results in a JSON-lines text; blank lines are ignored, anything else raises."""
    return [CheckResult.from_json(line) for line in text.splitlines() if line.strip()]
