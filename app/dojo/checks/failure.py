"""The typed failure every check raises: what went wrong, expected vs actual, the evidence,
and the lesson section that explains it.

    raise CheckFailure(
        "Two relays claimed the same row.",
        expected="each row claimed by one relay",
        actual="row 7 claimed by relay 0 and relay 1",
        evidence=table(rows, ("id", "lease_until")),
        lesson="transactional-outbox#claiming-for-update-skip-locked-and-leases",
    )

It is an AssertionError, so pytest counts it as a failed check (not a crash). Its fields
travel as data (`FailureReport`) through the results protocol, and the CLI and the TUI render
them (the lesson link once); `str()` gives the same text for any other reader.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dojo.checks.report import indent


def _lessons(lesson: str | Sequence[str] | None) -> tuple[str, ...]:
    if lesson is None:
        return ()
    if isinstance(lesson, str):
        return tuple(part for part in lesson.split() if part)
    return tuple(part for item in lesson for part in str(item).split() if part)


@dataclass(frozen=True)
class FailureReport:
    """A check failure as data: what the results protocol carries and the interfaces render.

    Attributes:
        what: one sentence: what went wrong, in the learner's terms.
        expected: what the check expected to see.
        actual: what it saw instead.
        evidence: the state that proves it (several lines), or None.
        lessons: `lesson-id#section` links to read, in order.
        fix: the change that fixes this particular mistake, or None.
    """

    what: str
    expected: str
    actual: str
    evidence: str | None = None
    lessons: tuple[str, ...] = ()
    fix: str | None = None

    def render(self, *, lessons: bool = True) -> str:
        """The failure as text.

        Args:
            lessons: False leaves out the `read: lesson …` lines, for an interface that
                shows the links itself (once, with the stage's own).

        Returns:
            The headline, `expected:`, `actual:`, the indented evidence, `fix:`, `read:`.
        """
        parts = [self.what, f"  expected: {self.expected}", f"  actual:   {self.actual}"]
        if self.evidence:
            parts.append("  evidence:\n" + indent(self.evidence, 4))
        if self.fix:
            parts.append(f"  fix: {self.fix}")
        if lessons:
            parts += [f"  read: lesson {lesson}" for lesson in self.lessons]
        return "\n".join(parts)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields."""
        return {"what": self.what, "expected": self.expected, "actual": self.actual,
                "evidence": self.evidence, "lessons": list(self.lessons), "fix": self.fix}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> FailureReport:
        """Build from decoded JSON; ValueError when a required field is missing."""
        try:
            return cls(str(raw["what"]), str(raw["expected"]), str(raw["actual"]),
                       None if raw.get("evidence") is None else str(raw["evidence"]),
                       _lessons(raw.get("lessons")),
                       None if raw.get("fix") is None else str(raw["fix"]))
        except KeyError as exc:
            raise ValueError(f"a failure needs {exc.args[0]!r}") from exc


class CheckFailure(AssertionError):
    """A check's verdict that the learner's code is wrong, with the state that shows it.

    Args:
        what: one sentence: what went wrong, in the learner's terms.
        expected: what the check expected to see.
        actual: what it saw instead.
        evidence: the state that proves it (rows, offsets, headers, lock holders, timings),
            usually a `table(...)`; several lines are fine.
        lesson: `lesson-id#section` to read (or several, as a sequence or space-separated).
        fix: optional: the change that fixes this particular mistake. Only where the check
            knows the mistake for sure; a canned fix for a different mistake misleads.
    """

    def __init__(self, what: str, expected: str, actual: str, evidence: str | None = None,
                 lesson: str | Sequence[str] | None = None, *, fix: str | None = None) -> None:
        self.report = FailureReport(what, expected, actual, evidence or None,
                                    _lessons(lesson), fix or None)
        super().__init__(self.report.render())

    @property
    def what(self) -> str:
        return self.report.what

    @property
    def expected(self) -> str:
        return self.report.expected

    @property
    def actual(self) -> str:
        return self.report.actual

    @property
    def evidence(self) -> str | None:
        return self.report.evidence

    @property
    def lessons(self) -> tuple[str, ...]:
        return self.report.lessons

    @property
    def fix(self) -> str | None:
        return self.report.fix

    @property
    def lesson(self) -> str | None:
        """The first lesson section named, or None."""
        return self.lessons[0] if self.lessons else None

    def render(self, *, lessons: bool = True) -> str:
        """The failure as text (see `FailureReport.render`)."""
        return self.report.render(lessons=lessons)

    def to_dict(self) -> dict[str, Any]:
        """The fields as JSON-ready data (what the results protocol carries)."""
        return self.report.to_dict()

    def __reduce__(self) -> Any:
        # exceptions cross process boundaries (run_concurrently with processes=True)
        return (_rebuild, (type(self), self.to_dict()))


def _rebuild(kind: type[CheckFailure], fields: dict[str, Any]) -> CheckFailure:
    failure = CheckFailure.__new__(kind)
    failure.report = FailureReport.from_dict(fields)
    AssertionError.__init__(failure, failure.report.render())
    return failure
