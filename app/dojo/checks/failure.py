"""The typed failure every check raises: what went wrong, expected vs actual, the evidence,
and the lesson section that explains it.

    raise CheckFailure(
        "Two relays claimed the same row.",
        expected="each row claimed by one relay",
        actual="row 7 claimed by relay 0 and relay 1",
        evidence=table(rows, ("id", "lease_until")),
        lesson="transactional-outbox#claiming-for-update-skip-locked-and-leases",
    )

It is an AssertionError, so pytest counts it as a failed check (not a crash). The runner's
report plugin carries its fields through the results JSON as data, and the CLI and the TUI
render them (the lesson link once); `str()` gives the same text for any other reader.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def indent(block: str, spaces: int) -> str:
    """Every line of `block` indented by `spaces` (trailing blank lines dropped)."""
    pad = " " * spaces
    return "\n".join(pad + line for line in block.rstrip().splitlines())


def _lessons(lesson: str | Sequence[str] | None) -> tuple[str, ...]:
    if lesson is None:
        return ()
    if isinstance(lesson, str):
        return tuple(part for part in lesson.split() if part)
    return tuple(part for part in lesson if part)


class CheckFailure(AssertionError):
    """A check's verdict that the learner's code is wrong, with the state that shows it.

    Args:
        what: one sentence: what went wrong, in the learner's terms.
        expected: what the check expected to see.
        actual: what it saw instead.
        evidence: the state that proves it (rows, offsets, headers, lock holders, timings),
            usually a table; several lines are fine.
        lesson: `lesson-id#section` to read (or several, as a sequence or space-separated).
        fix: optional: the change that fixes this particular mistake. Only where the check
            knows the mistake for sure; a canned fix for a different mistake misleads.
    """

    def __init__(self, what: str, expected: str, actual: str, evidence: str | None = None,
                 lesson: str | Sequence[str] | None = None, *, fix: str | None = None) -> None:
        self.what = what
        self.expected = expected
        self.actual = actual
        self.evidence = evidence or None
        self.lessons = _lessons(lesson)
        self.fix = fix or None
        super().__init__(self.render())

    @property
    def lesson(self) -> str | None:
        """The first lesson section named, or None."""
        return self.lessons[0] if self.lessons else None

    def render(self, *, lessons: bool = True) -> str:
        """The failure as text; `lessons=False` leaves the lesson lines to the caller (a UI
        that shows the link itself, once)."""
        parts = [self.what, f"  expected: {self.expected}", f"  actual:   {self.actual}"]
        if self.evidence:
            parts.append("  evidence:\n" + indent(self.evidence, 4))
        if self.fix:
            parts.append(f"  fix: {self.fix}")
        if lessons:
            parts += [f"  read: lesson {lesson}" for lesson in self.lessons]
        return "\n".join(parts)

    def to_dict(self) -> dict[str, Any]:
        """The fields as JSON-ready data (what the results protocol carries)."""
        return {"what": self.what, "expected": self.expected, "actual": self.actual,
                "evidence": self.evidence, "lessons": list(self.lessons), "fix": self.fix}

    def __reduce__(self) -> Any:
        # exceptions cross process boundaries (run_concurrently with processes=True)
        return (_rebuild, (self.to_dict(),))


def _rebuild(fields: dict[str, Any]) -> CheckFailure:
    return CheckFailure(fields["what"], fields["expected"], fields["actual"],
                        fields.get("evidence"), fields.get("lessons"), fix=fields.get("fix"))
