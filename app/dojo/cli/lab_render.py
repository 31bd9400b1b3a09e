"""How `dojo lab check` and `watch` print results: live lines, then a per-stage summary table.

Colour only on a terminal (and never with NO_COLOR set), so piped output and CI logs stay
plain text.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import TextIO

from dojo.content.labs import Lab
from dojo.runner.results import (
    POSTGRES_LABEL,
    CheckResult,
    CheckStarted,
    RunEvent,
    RunSummary,
    ServicesReady,
    ServicesStarting,
)

MARKS = {"pass": "✓", "fail": "✗", "error": "!", "needs-backend": "~", "not-run": "·",
         "infra": "!"}
COLOURS = {"pass": "32", "fail": "31", "error": "31", "needs-backend": "33", "not-run": "2",
           "infra": "33"}
LABELS = {"pass": "pass", "fail": "FAIL", "error": "ERROR", "needs-backend": "needs Apache Kafka",
          "not-run": "not run", "infra": "SERVICE DOWN"}


def _label(result: CheckResult) -> str:
    return result.needs_label if result.status == "needs-backend" else LABELS[result.status]


SERVICE_NAMES = {"postgres": "PostgreSQL", "kafka": "Kafka"}
SPINNER = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"


def services_phrase(names: tuple[str, ...]) -> str:
    """("postgres", "kafka") -> "PostgreSQL and Kafka"."""
    shown = [SERVICE_NAMES.get(name, name) for name in names]
    return " and ".join(shown) if len(shown) < 3 else ", ".join(shown[:-1]) + " and " + shown[-1]


class Spinner:
    """A line that turns and counts seconds until `stop()`, on a terminal only."""

    def __init__(self, out: TextIO, text: str) -> None:
        self.out, self.text = out, text
        self.started = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._spin, daemon=True, name="dojo-spinner")
        self._thread.start()

    def _spin(self) -> None:
        turn = 0
        while not self._stop.wait(0.1):
            elapsed = time.monotonic() - self.started
            self.out.write(f"\r{SPINNER[turn % len(SPINNER)]} {self.text} {elapsed:.1f} s")
            self.out.flush()
            turn += 1

    def stop(self) -> float:
        """Stop, clear the line; the seconds it ran."""
        self._stop.set()
        self._thread.join(1)
        self.out.write("\r\033[K")
        self.out.flush()
        return time.monotonic() - self.started


def use_colour(stream: TextIO) -> bool:
    return stream.isatty() and "NO_COLOR" not in os.environ


@dataclass
class Printer:
    """Prints a run's events as they arrive."""

    lab: Lab
    out: TextIO = field(default_factory=lambda: sys.stdout)
    colour: bool = False
    _stage: str | None = None
    _pending: bool = False  # a "running …" line is on screen, to be replaced by the result
    _spinner: Spinner | None = None
    # (stage, status, message) -> the check that printed it: a later check of the stage that
    # fails the same way gets one line, so the message and its hint stay in view
    _said: dict[tuple[str, str, str], str] = field(default_factory=dict)

    def paint(self, text: str, status: str) -> str:
        if not self.colour:
            return text
        return f"\033[{COLOURS.get(status, '0')}m{text}\033[0m"

    def bold(self, text: str) -> str:
        return f"\033[1m{text}\033[0m" if self.colour else text

    def header(self, what: str) -> None:
        print(self.bold(f"{self.lab.id} · {self.lab.title}") + f"  (checking {what})",
              file=self.out, flush=True)

    def _stage_header(self, stage_id: str) -> None:
        if stage_id == self._stage:
            return
        self._stage = stage_id
        if stage_id in self.lab.stage_ids:
            number = self.lab.stage_ids.index(stage_id) + 1
            title = self.lab.stage(stage_id).title
            print(self.bold(f"\nstage {number} · {stage_id}") + f" — {title}", file=self.out)
        else:
            print(self.bold(f"\n{stage_id or 'lab'}"), file=self.out)

    def event(self, event: RunEvent) -> None:
        """Print one event: services starting (a spinner on a terminal), a running line
        (terminal only), or a result with its message."""
        if self._spinner is not None:
            self._spinner.stop()
            self._spinner = None
        if isinstance(event, ServicesStarting):
            text = f"starting {services_phrase(event.services)}…"
            if self.colour:
                self._spinner = Spinner(self.out, text)
            else:
                print(text, file=self.out, flush=True)
            return
        if isinstance(event, ServicesReady):
            if event.started:
                backend = f" (Kafka: {event.backend})" if "kafka" in event.started else ""
                print(f"{services_phrase(event.started)} up in {event.seconds:.1f} s{backend}",
                      file=self.out, flush=True)
            return
        if isinstance(event, CheckStarted):
            self._stage_header(event.stage)
            if self.colour:  # a live "running" line only where it can be overwritten
                self.out.write(f"  … {event.check}")
                self.out.flush()
                self._pending = True
            return
        self.result(event)

    def result(self, result: CheckResult) -> None:
        if self._pending:
            self.out.write("\r\033[K")
            self._pending = False
        self._stage_header(result.stage)
        mark = self.paint(MARKS[result.status], result.status)
        timing = f"{result.duration:.2f} s" if result.duration >= 0.01 else ""
        label = "" if result.passed else "  " + self.paint(_label(result), result.status)
        print(f"  {mark} {result.check:<52} {timing:>8}{label}", file=self.out)
        if result.passed:
            self.out.flush()
            return
        # a typed failure is rendered from its fields, its lesson links with the stage's, once
        text = result.failure.render(lessons=False) if result.failure else result.message
        first = self._said.setdefault((result.stage, result.status, text), result.check)
        if first != result.check:
            print(f"      fails the same way as {first} above", file=self.out)
            self.out.flush()
            return
        for line in text.splitlines():
            print(f"      {line}", file=self.out)
        if result.hint:
            print(f"      hint: {result.hint}", file=self.out)
        if result.status in ("fail", "error"):
            shown = text if result.failure else result.message
            for lesson in result.lessons:
                if f"lesson {lesson}" not in shown:
                    print(f"      read: lesson {lesson}", file=self.out)
        self.out.flush()

    def summary(self, summary: RunSummary, stopped_early: bool,
                left_out: tuple[str, ...] = ()) -> None:
        """The per-stage table and the one line that says what to do next. `left_out` names
        the slow (thorough) checks of the stages run that this run did not include."""
        print(self.bold("\nsummary"), file=self.out)
        stages = summary.stages()
        for number, stage in enumerate(stages, 1):
            status = stage.status
            checks = f"{stage.count('pass')}/{len(stage.results)} checks" if stage.ran else ""
            label = LABELS[status]
            if status == "needs-backend" and all(r.needs_postgres_setting for r in stage.results
                                                 if r.status == status):
                label = POSTGRES_LABEL
            if status == "not-run" and stopped_early:
                label = "not run (an earlier stage did not pass)"
            print(f"  {number:>2} {stage.stage:<24} "
                  f"{self.paint(f'{MARKS[status]} {label:<20}', status)} {checks}".rstrip(),
                  file=self.out)
        passed = sum(1 for stage in stages if stage.passed)
        print(f"\n{passed} of {len(stages)} stages passed.", file=self.out)
        setting = sum(1 for r in summary.results if r.needs_postgres_setting)
        waiting = summary.count("needs-backend") - setting
        if setting:
            print(f"{setting} {'check needs' if setting == 1 else 'checks need'} a PostgreSQL "
                  "server setting this server lacks (its message says which) and could not be "
                  "verified: add it, restart the server, then check again.", file=self.out)
        if waiting:
            print(f"{waiting} {'check needs' if waiting == 1 else 'checks need'} Apache Kafka "
                  "and could not be verified on this broker: run `dojo services up --kafka "
                  "apache`, then check again.", file=self.out)
        if left_out:
            listed = ", ".join(left_out)
            command = f"`dojo lab check {self.lab.id} --thorough`"
            if len(left_out) == 1:
                text = (f"1 slow check was left out ({listed}): {command} runs it too (about a "
                        "minute more); the lab is done when it passes as well.")
            else:
                text = (f"{len(left_out)} slow checks were left out ({listed}): {command} runs "
                        "them too (a minute or more each); the lab is done when they pass too.")
            print(text, file=self.out)
        first = summary.first_unfinished_stage
        if first and first in self.lab.stage_ids and self.lab.stage(first).hints:
            print(f"next: stage {first!r}; stuck? `dojo lab hint {self.lab.id} {first}`",
                  file=self.out)
        self.out.flush()


def progress_marks(lab: Lab, statuses: dict[str, str], colour: bool) -> str:
    """One mark per stage, in order: ✓ passed, ✗ failed, ~ needs Kafka, · not checked yet."""
    marks = []
    for stage_id in lab.stage_ids:
        status = statuses.get(stage_id, "not-run")
        mark = MARKS.get(status, "·")
        marks.append(f"\033[{COLOURS.get(status, '0')}m{mark}\033[0m" if colour else mark)
    return "".join(marks)


def paint_diff(text: str, colour: bool) -> str:
    if not colour:
        return text
    painted = []
    for line in text.splitlines(keepends=True):
        if line.startswith(("+++", "---")):
            painted.append(f"\033[1m{line.rstrip(chr(10))}\033[0m\n")
        elif line.startswith("+"):
            painted.append(f"\033[32m{line.rstrip(chr(10))}\033[0m\n")
        elif line.startswith("-"):
            painted.append(f"\033[31m{line.rstrip(chr(10))}\033[0m\n")
        elif line.startswith("@@"):
            painted.append(f"\033[36m{line.rstrip(chr(10))}\033[0m\n")
        else:
            painted.append(line)
    return "".join(painted)
