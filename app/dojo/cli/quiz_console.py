"""The terminal side of `dojo quiz`: read answers and self-grades, on a TTY or from a pipe.

On a TTY the answer is typed under a ticking countdown and the grade is one key press. From
a pipe (scripts, tests) there is no clock: an answer is the lines up to an empty line, and a
grade is the next line (empty = the suggested grade). End of input ends the session.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import TextIO

from dojo.cli.quiz_render import Style, grade_prompt, timer_header, use_colour
from dojo.cli.timed_input import TypedAnswer, read_key, read_timed_answer
from dojo.quiz.schedule import SelfGrade
from dojo.quiz.timer import Countdown


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

    def say(self, text: str = "") -> None:
        print(text, file=self.stdout, flush=True)

    def read_answer(self, seconds: float) -> TypedAnswer:
        """The learner's answer. Raises StopQuiz when the input has ended before it began."""
        if self.interactive:
            countdown = Countdown(seconds)
            answer = read_timed_answer(
                countdown, lambda c: timer_header(c.label(), c.remaining(), self.style),
                self.stdout, self.stdin.fileno())
            if answer.timed_out:
                self.say(self.style.warn("⏱ Time is up."))
            return answer
        lines: list[str] = []
        while True:
            line = self.stdin.readline()
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
                line = self.stdin.readline()
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
