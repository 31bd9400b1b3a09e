"""The terminal side of `dojo quiz`: read answers and self-grades, on a TTY or from a pipe.

On a TTY the answer is typed under a ticking countdown and the grade is one key press. From
a pipe (scripts, tests) there is no clock: an answer is the lines up to an empty line, and a
grade is the next line (empty = the suggested grade). End of input ends the session.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from typing import TextIO

from dojo.cli.quiz_render import Style, grade_prompt, timer_header, use_colour
from dojo.cli.timed_input import TypedAnswer, read_key, read_timed_answer
from dojo.quiz.schedule import SelfGrade
from dojo.quiz.scoring import Score
from dojo.quiz.timer import Countdown

CHECKLIST_PROMPT = ("Tick or untick points by number if the scorer got you wrong "
                    "(e.g. 2 5), Enter keeps them: ")
CHECKLIST_PROMPT_ALOUD = "Which points did you say? Numbers (e.g. 1 2 4), Enter for none: "
ALOUD_HINT = "  say your answer out loud; Enter when you are done"
_PIPED_CHECKLIST = re.compile(r"^\s*points?\s*:\s*([\d\s,]*)$", re.IGNORECASE)


def parse_numbers(line: str, total: int) -> set[int] | None:
    """`2 5` / `2,5` → {2, 5}; None when something is not a number from 1 to `total`."""
    parts = line.replace(",", " ").split()
    if not all(part.isdigit() and 1 <= int(part) <= total for part in parts):
        return None
    return {int(part) for part in parts}


class StopQuiz(Exception):
    """The learner asked to stop (q) or the input ended."""


@dataclass
class Console:
    """Where the quiz reads from and prints to."""

    stdin: TextIO = field(default_factory=lambda: sys.stdin)
    stdout: TextIO = field(default_factory=lambda: sys.stdout)

    def __post_init__(self) -> None:
        self.interactive = self.stdin.isatty() and self.stdout.isatty()
        self.style = Style(use_colour(self.stdout))
        self._pending: str | None = None  # a piped line read ahead that was not a checklist

    def _readline(self) -> str:
        if self._pending is not None:
            line, self._pending = self._pending, None
            return line
        return self.stdin.readline()

    def read_checklist(self, score: Score, *, aloud: bool = False) -> Score:
        """The learner's word on the checklist: point numbers to tick or untick.

        On a terminal: a line of numbers (`2 5`), Enter keeps the machine's checklist. From
        a pipe: an optional line `points: 2 5` before the grade line (any other line is the
        grade). The result is the confirmed score the grade suggestion comes from."""
        total = len(score.results)
        if self.interactive:
            self.stdout.write(CHECKLIST_PROMPT_ALOUD if aloud else CHECKLIST_PROMPT)
            self.stdout.flush()
            while True:
                line = self.stdin.readline()
                numbers = parse_numbers(line, total)
                if numbers is not None:
                    break
                self.stdout.write(f"? numbers from 1 to {total}, separated by spaces: ")
                self.stdout.flush()
        else:
            line = self._readline()
            match = _PIPED_CHECKLIST.match(line)
            numbers = parse_numbers(match.group(1), total) if match else None
            if not match:
                self._pending = line
            numbers = numbers or set()
        for number in sorted(numbers):
            score = score.toggled(score.results[number - 1].point.id)
        return score if score.confirmed else score.with_checklist(score.matched_ids)

    def say(self, text: str = "") -> None:
        print(text, file=self.stdout, flush=True)

    def read_answer(self, seconds: float, *, aloud: bool = False) -> TypedAnswer:
        """The learner's answer. Raises StopQuiz when the input has ended before it began.
        Aloud: the clock runs while the learner speaks; Enter stops it, nothing is typed
        (from a pipe there is nothing to read)."""
        if aloud and not self.interactive:
            return TypedAnswer("", timed_out=False, seconds_used=0.0)
        if self.interactive:
            countdown = Countdown(seconds)
            hint = ALOUD_HINT if aloud else None
            answer = read_timed_answer(
                countdown, lambda c: timer_header(c.label(), c.remaining(), self.style, hint),
                self.stdout, self.stdin.fileno())
            if answer.timed_out:
                self.say(self.style.warn("⏱ Time is up."))
            return answer
        lines: list[str] = []
        while True:
            line = self._readline()
            if not line:
                if not lines:
                    raise StopQuiz("end of input")
                break
            if not line.strip():
                break
            lines.append(line.rstrip("\n"))
        return TypedAnswer("\n".join(lines).strip(), timed_out=False, seconds_used=0.0)

    def read_grade(self, suggested: SelfGrade) -> SelfGrade:
        """A self-grade; Enter takes the suggestion. Raises StopQuiz on q or end of input."""
        prompt = grade_prompt(suggested.label, int(suggested))
        self.stdout.write(prompt)
        self.stdout.flush()
        while True:
            if self.interactive:
                key = read_key(self.stdin.fileno())
                text = "" if key in ("\r", "\n") else key
                if key == "":
                    raise StopQuiz("end of input")
            else:
                line = self._readline()
                if not line:
                    self.say()
                    raise StopQuiz("end of input")
                text = line.strip()
            if text.lower() == "q":
                self.say("q")
                raise StopQuiz("stopped")
            grade = suggested if text == "" else SelfGrade.parse(text)
            if grade is not None:
                self.say(f"→ {int(grade)} {grade.label}")
                return grade
            if not self.interactive:
                self.say(f"? {text!r} is not a grade; type 1, 2, 3 or 4")
                self.stdout.write(prompt)
                self.stdout.flush()
