"""`CheckRunner`: runs a lab's checks and watches its files, in workers, posting messages.

It draws nothing; the lab screen mounts it and renders what it posts. Learner code runs in
the runner's child process (`dojo.runner.execute.CheckRun`), never here; the run itself
starts the services the lab needs (`ServicesStarting` / `ServicesReady` events).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from textual import work
from textual.message import Message
from textual.widget import Widget
from textual.worker import get_current_worker

from dojo.runner.results import CheckResult, RunEvent, RunSummary

if TYPE_CHECKING:
    from dojo.content.labs import Lab
    from dojo.runner.execute import CheckRun, RunOptions
    from dojo.tui.session import Services


def files_state(folder: Path, names: tuple[str, ...]) -> dict[str, tuple[int, int]]:
    """Modification time and size of each learner file: what a save changes."""
    state = {}
    for name in names:
        try:
            stat = (folder / name).stat()
        except OSError:
            continue
        state[name] = (stat.st_mtime_ns, stat.st_size)
    return state


class CheckRunner(Widget):
    """`run(options)` checks `impl` (the run starts the services first, when the lab needs
    them and they are down); each stage's result is written to the store as soon as the
    stage finishes. `watch(True)` posts `Saved` whenever a learner file changes."""

    DEFAULT_CSS = """
    CheckRunner { display: none; }
    """

    @dataclass
    class Event(Message):
        """Services are starting or ready, a check started, or a check has a result."""

        event: RunEvent

    @dataclass
    class Done(Message):
        """The run ended; `summary` is None when it never started (see `error`)."""

        summary: RunSummary | None
        cancelled: bool
        error: str = ""

    @dataclass
    class Saved(Message):
        """A learner file changed on disk (watch mode)."""

    def __init__(self, lab: Lab, impl: Path, services: Services, *,
                 id: str | None = None) -> None:
        super().__init__(id=id)
        self.lab = lab
        self.impl = impl
        self.services = services
        self._run: CheckRun | None = None
        self._busy = False
        self._watch_stop: threading.Event | None = None

    @property
    def busy(self) -> bool:
        return self._busy

    @property
    def watching(self) -> bool:
        return self._watch_stop is not None

    def run(self, options: RunOptions) -> bool:
        """Start a run; False when one is already going."""
        if self._busy:
            return False
        self._busy = True
        self._check(options)
        return True

    def cancel(self) -> None:
        """Stop the run: the child process is killed at once."""
        if self._run is not None:
            self._run.cancel()
        self.workers.cancel_group(self, "checks")

    def on_check_runner_done(self, message: Done) -> None:
        self._busy = False
        self._run = None  # the message then bubbles up to the screen

    @work(thread=True, exclusive=True, group="checks")
    def _check(self, options: RunOptions) -> None:
        try:
            self._check_now(options)
        except Exception as exc:  # said on screen; the app must outlive a broken run
            self.post_message(self.Done(None, False, f"the run failed: {type(exc).__name__}: "
                                                     f"{exc}"))

    def _check_now(self, options: RunOptions) -> None:
        from dojo.runner import progress
        from dojo.runner.execute import CheckRun

        worker = get_current_worker()
        run = CheckRun(self.lab, self.impl, options)
        self._run = run
        stage, results = "", list[CheckResult]()
        for event in run:
            if worker.is_cancelled:
                run.cancel()
                break
            self.post_message(self.Event(event))
            if isinstance(event, CheckResult) and event.stage in self.lab.stage_ids:
                if event.stage != stage:
                    if results:
                        progress.record_stage_results(self.lab, RunSummary((stage,), results))
                    stage, results = event.stage, []
                results.append(event)
        cancelled = run.cancelled or worker.is_cancelled
        if results and not cancelled:  # a stage cut short is not recorded
            progress.record_stage_results(self.lab, RunSummary((stage,), results))
        self.post_message(self.Done(run.summary, cancelled))

    def set_watching(self, on: bool) -> None:
        """Start or stop watching the learner files."""
        if on and self._watch_stop is None:
            self._watch_stop = threading.Event()
            self._watch(self._watch_stop)
        elif not on and self._watch_stop is not None:
            self._watch_stop.set()
            self._watch_stop = None

    @work(thread=True, group="watch")
    def _watch(self, stop: threading.Event) -> None:
        from watchfiles import watch

        seen = files_state(self.impl, self.lab.files)
        # every wake-up (a change or the timeout) compares with what the last check saw, so
        # a save that lands while checks run is not missed
        for _changes in watch(self.impl, debounce=300, rust_timeout=500,
                              yield_on_timeout=True, stop_event=stop):
            now = files_state(self.impl, self.lab.files)
            if now != seen:
                seen = now
                self.post_message(self.Saved())

    def on_unmount(self) -> None:
        self.set_watching(False)
        if self._run is not None:
            self._run.cancel()
