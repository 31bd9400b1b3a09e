"""`CheckLog`: the results of a check run as they stream in, failures in full."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.content import Content
from textual.widgets import Static

from dojo.tui.widgets._meter import STATUS_WORDS, stage_mark

if TYPE_CHECKING:
    from textual.timer import Timer

    from dojo.content.labs import Lab
    from dojo.runner.results import CheckResult, CheckStarted, ServicesReady, ServicesStarting

SPINNER = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"
SERVICE_NAMES = {"postgres": "PostgreSQL", "kafka": "Kafka"}


def _services(names: tuple[str, ...]) -> str:
    return " and ".join(SERVICE_NAMES.get(name, name) for name in names)


HEADLINE_CELLS = 72  # how much of a folded failure's first line the summary repeats


@dataclass
class _Fold:
    """Checks of one stage that failed with the same message: the first shows it in full
    (and the stage's hint), the rest are counted on one line after that."""

    after: Static  # the last line the first failure wrote
    headline: str
    checks: list[str] = field(default_factory=list)
    summary: Static | None = None

    def text(self) -> Content:
        count = len(self.checks)
        more = f"{count} more check fails" if count == 1 else f"{count} more checks fail"
        return Content.assemble(("✗ ", "$text-error"), f"{more} the same way: ",
                                (self.headline, "italic"), "\n",
                                (" · ".join(self.checks), "$text-muted"))


class CheckLog(VerticalScroll, can_focus=True):
    """One line per check (◌ while it runs, then its mark and time); a check that did not
    pass shows its whole message, its hint and the lesson section to read. Later checks of
    the stage that fail with the same message are folded into one line under it, so the
    message and the hint stay in view."""

    DEFAULT_CSS = """
    CheckLog {
        height: 1fr;
        padding: 0 1;
        scrollbar-size-vertical: 1;
        & > Static { height: auto; }
        & > .check-stage { margin-top: 1; color: $text-primary; text-style: bold; }
        & > .check-message {
            padding: 0 1 0 3; color: $foreground; background: $error 10%;
        }
        & > .check-note { color: $text-muted; }
        & > .check-fold { padding: 0 0 0 2; }
        & > .check-error { color: $text-error; }
        & > .check-summary { margin-top: 1; }
    }
    """

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("j", "scroll_down", "Down", show=False),
        Binding("k", "scroll_up", "Up", show=False),
        Binding("g", "scroll_home", "Top", show=False),
        Binding("G", "scroll_end", "Bottom", show=False),
    ]

    def __init__(self, lab: Lab, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.lab = lab
        self._stage = ""
        self._in_flight: dict[str, Static] = {}
        self._hinted: set[str] = set()  # stages whose hint is already shown in this run
        self._starting: tuple[Static, float, str, Timer] | None = None  # the spinner line
        self._folds: dict[tuple[str, str], _Fold] = {}  # (stage, message) -> its first failure
        self._held: Static | None = None  # the run's first failing check, kept in view

    def _add(self, content: Content | str, classes: str = "") -> Static:
        # the log follows new lines until a check fails; then that failure stays in view
        follow = self._held is None and self.scroll_y >= self.max_scroll_y - 1
        line = Static(content if isinstance(content, Content) else Content(content),
                      classes=classes)
        self.mount(line)
        if follow:
            self.call_after_refresh(self.scroll_end, animate=False)
        return line

    def clear(self) -> None:
        self._stop_spinner()
        self._stage = ""
        self._in_flight.clear()
        self._hinted.clear()
        self._folds.clear()
        self._held = None
        self.remove_children()

    def note(self, text: str, error: bool = False) -> None:
        self._add(text, "check-error" if error else "check-note")

    def services_starting(self, event: ServicesStarting) -> None:
        """A line that turns and counts seconds until `services_ready`."""
        self._stop_spinner()
        text = f"starting {_services(event.services)}…"
        line = self._add(Content.assemble((SPINNER[0] + " ", "$text-accent"), text),
                         "check-note")
        started = time.monotonic()
        turns = iter(range(1 << 30))

        def tick() -> None:
            spin = SPINNER[next(turns) % len(SPINNER)]
            line.update(Content.assemble((spin + " ", "$text-accent"), text,
                                         (f" {time.monotonic() - started:.1f} s",
                                          "$text-muted")))

        self._starting = (line, started, text, self.set_interval(0.1, tick))

    def services_ready(self, event: ServicesReady) -> None:
        """The spinner line says what started and how long it took."""
        starting = self._stop_spinner()
        if starting is not None:
            starting.update(Content.assemble(("✓ ", "$text-success"),
                                             f"{_services(event.started)} up",
                                             (f" in {event.seconds:.1f} s", "$text-muted")))

    def _stop_spinner(self) -> Static | None:
        if self._starting is None:
            return None
        line, _, _, timer = self._starting
        timer.stop()
        self._starting = None
        return line

    def _stage_heading(self, stage_id: str) -> None:
        if stage_id == self._stage:
            return
        self._stage = stage_id
        if stage_id in self.lab.stage_ids:
            stage = self.lab.stage(stage_id)
            number = self.lab.stage_ids.index(stage_id) + 1
            self._add(f"{number}. {stage.title} ({stage.id})", "check-stage")
        elif stage_id:
            self._add(stage_id, "check-stage")

    def started(self, event: CheckStarted) -> None:
        self._stage_heading(event.stage)
        self._in_flight[event.nodeid] = self._add(Content.assemble(
            ("◌ ", "$text-accent"), event.check, (" running…", "$text-muted")))

    def _fold(self, event: CheckResult) -> bool:
        """Count `event` under an earlier failure of its stage with the same message."""
        fold = self._folds.get((event.stage, event.message.strip()))
        if fold is None:
            return False
        running = self._in_flight.pop(event.nodeid, None) if event.nodeid else None
        if running is not None:
            running.remove()
        fold.checks.append(event.check)
        if fold.summary is None:
            fold.summary = Static(fold.text(), classes="check-fold")
            self.mount(fold.summary, after=fold.after)
        else:
            fold.summary.update(fold.text())
        return True

    def result(self, event: CheckResult) -> None:
        self._stop_spinner()
        if not event.passed and event.message.strip() and self._fold(event):
            return
        self._stage_heading(event.stage)
        took = f"{event.duration:.2f}s" if event.duration < 1 else f"{event.duration:.1f}s"
        line = Content.assemble(stage_mark(event.status), " ", event.check,
                                (f"  {took}", "$text-muted"))
        if not event.passed:
            word = (event.needs_label if event.status == "needs-backend"
                    else STATUS_WORDS.get(event.status, event.status))
            line = Content.assemble(line, (f"  {word}",
                                           "$text-error" if event.status != "needs-backend"
                                           else "$text-warning"))
        running = self._in_flight.pop(event.nodeid, None) if event.nodeid else None
        if running is not None:
            running.update(line)
        else:
            running = self._add(line)
        if event.passed:
            return
        if self._held is None:
            self._held = running
            self.call_after_refresh(self.scroll_to_widget, running, animate=False, top=True)
        # a typed failure is shown from its fields; its lessons join the stage's, once
        message = event.failure.render(lessons=False) if event.failure else event.message
        if message:
            shown = self._add(message.rstrip(), "check-message")
            headline = message.strip().splitlines()[0]
            if len(headline) > HEADLINE_CELLS:
                headline = headline[:HEADLINE_CELLS - 1] + "…"
            self._folds[(event.stage, event.message.strip())] = _Fold(shown, headline)
        first = event.stage not in self._hinted  # the hint and stage lesson once per stage
        self._hinted.add(event.stage)
        lessons = [lesson for lesson in (event.failure.lessons if event.failure else ())
                   if lesson != event.lesson]
        if first and event.lesson:
            lessons.append(event.lesson)
        extra: list[str | tuple[str, str]] = []
        if first and event.hint:
            extra += [("hint ", "bold $text-success"), event.hint]
        for lesson in lessons:
            extra += ["\n" if extra else "", ("read ", "bold $text-primary"), f"lesson {lesson}"]
        if extra:
            hint = self._add(Content.assemble(*extra), "check-note")
            fold = self._folds.get((event.stage, event.message.strip()))
            if fold is not None:
                fold.after = hint  # the hint stays right under the message

    def summary(self, text: Content) -> None:
        self._add(text, "check-summary")
