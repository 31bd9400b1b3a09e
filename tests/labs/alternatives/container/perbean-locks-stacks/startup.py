"""The startup report (README, stage 8): what refresh() did, in order, and how long it took.

The step that ApplicationContext.startup_steps() returns, the phase names, the error a failing
bean stops refresh() with, and the recorder the context drives: it opens each phase as the
previous one ends and times every bean on the monotonic clock, without its dependencies.
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
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




class StartupRecorder:
    """Records refresh()'s phases one after another and each bean's own creation time.

    A phase ends when the next begins (or at end()). A bean's step spans its whole creation;
    its duration is that span minus the spans of the beans created inside it (its
    dependencies made for it), so the beans' durations add up to the time spent creating them.
    """

    def __init__(self) -> None:
        self.steps: list[StartupStep] = []
        self._phase: StartupStep | None = None
        self._open: contextvars.ContextVar[tuple[int, ...]] = contextvars.ContextVar(
            f"startup_{id(self)}", default=())
        self._spans: dict[int, float] = {}
        self._children: dict[int, list[int]] = {}

    def phase(self, name: str, **tags: str) -> None:
        self.end()
        self._phase = StartupStep(name, time.monotonic(), tags=dict(tags))
        self.steps.append(self._phase)

    def tag(self, **tags: str) -> None:
        if self._phase is not None:
            self._phase.tags.update(tags)

    def end(self) -> None:
        if self._phase is not None:
            self._phase.duration = time.monotonic() - self._phase.started
            self._phase = None

    @contextmanager
    def bean(self, name: str) -> Iterator[None]:
        step = StartupStep("bean", time.monotonic(), tags={"bean": name})
        index = id(step)
        self.steps.append(step)
        parents = self._open.get()
        if parents:
            self._children.setdefault(parents[-1], []).append(index)
        token = self._open.set((*parents, index))
        try:
            yield
        finally:
            self._open.reset(token)
            span = time.monotonic() - step.started
            self._spans[index] = span
            nested = sum(self._spans.get(c, 0.0) for c in self._children.pop(index, []))
            step.duration = span - nested


__all__ = ["PHASES", "BeanCreationError", "StartupRecorder", "StartupStep"]
