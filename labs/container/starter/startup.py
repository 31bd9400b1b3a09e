"""The startup report (README, stage 8): what refresh() did, in order, and how long it took.

Given: the step that ApplicationContext.startup_steps() returns, the phase names, and the error
a failing bean stops refresh() with. You write the recording and the failure handling (in
context.py, or in helpers of your own here).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

# refresh()'s phases, in the order they run (README, stage 8)
PHASES = ("definitions", "auto-configuration", "definition-post-processors",
          "bean-post-processors", "singletons", "refreshed")


@dataclass
class StartupStep:
    """One step of the report: a phase (`name` in PHASES) or a bean (`name` "bean").

    `started` is the time.monotonic() reading when the step began, `duration` its length in
    seconds on the same clock; a bean's step has tags={"bean": <bean name>}.
    """

    name: str
    started: float
    duration: float = 0.0
    tags: dict[str, str] = field(default_factory=dict)


class BeanCreationError(RuntimeError):
    """A bean's own code failed while refresh() created it.

    `chain` names the beans being created at that moment, the one refresh() started with
    first and the failing bean last; raise it `from` the original exception.
    """

    def __init__(self, chain: Sequence[str], cause: BaseException) -> None:
        self.chain = list(chain)
        self.bean = self.chain[-1] if self.chain else ""
        super().__init__(f"error creating bean {self.bean!r} (" + " -> ".join(self.chain)
                         + f"): {type(cause).__name__}: {cause}")


__all__ = ["PHASES", "BeanCreationError", "StartupStep"]
