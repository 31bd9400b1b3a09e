"""`PathBar`: Home's two lines about the whole interview: how far along it is, and the next
step of the guided path (read → drill → lab, question by question)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from textual.content import Content
from textual.widgets import Static

from dojo.tui.widgets._meter import meter, percent

if TYPE_CHECKING:
    from dojo.interview_path import InterviewPath

BAR_CELLS = 24


class PathBar(Static):
    """Shows an `InterviewPath` (`show(path)`); the screen binds the key that takes the step."""

    DEFAULT_CSS = """
    PathBar {
        height: 2;
        padding: 0 1;
        background: $panel;
        text-wrap: nowrap;
        text-overflow: ellipsis;
    }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__("", id=id)
        self.path: InterviewPath | None = None

    def show(self, path: InterviewPath) -> None:
        self.path = path
        questions = path.questions
        if not questions:
            self.update(Content.styled("No interview lessons yet.", "$text-muted"))
            return
        done = sum(question.fraction >= 1 for question in questions)
        step = path.next_step
        where = (f"question {step.question.number} of {len(questions)} · "
                 if step.question else "")
        self.update(Content.assemble(
            ("Interview ", "bold"), meter(path.fraction, BAR_CELLS),
            (f"{percent(path.fraction)}", "bold"),
            (f"  {done} of {len(questions)} questions ready", "$text-muted"), "\n",
            ("Next ", "bold $text-accent"), (where, "$text-muted"), step.describe(),
            ("  n", "bold $text-accent"), (" go", "$text-muted")))
