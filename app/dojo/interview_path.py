"""The guided path through the interview: its questions in order, each read, then drilled,
then practised in its lab, and what to do next.

The eight questions of the interview are the lessons of the `interview` track, in order. A
question is done when its lesson was read to the end, every one of its cards was answered at
least once, and every lab stage it pairs with (in a lab that is built) passes. The next step
is the first thing not done, question by question, in that order: read → drill → lab.

Pure: `interview_path` takes what the store and the scheduler know, so the TUI, the CLI and
the tests all get the same answer.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from dojo.content import Catalog, Lesson

INTERVIEW_TRACK = "interview"
StepKind = Literal["read", "drill", "lab", "done"]


@dataclass(frozen=True)
class QuestionProgress:
    """How far one question of the interview is."""

    number: int  # 1-based, in the interview's order
    lesson: Lesson
    read: str  # unread | reading | read
    reviewed: int  # cards answered at least once
    stages: tuple[tuple[str, str, bool], ...]  # (lab, stage, passed) in built labs

    @property
    def cards(self) -> int:
        return len(self.lesson.cards)

    @property
    def fraction(self) -> float:
        """0 to 1: the mean of its parts (reading, drilling, its lab stages if any)."""
        parts = [1.0 if self.read == "read" else 0.5 if self.read == "reading" else 0.0]
        if self.cards:
            parts.append(min(self.reviewed, self.cards) / self.cards)
        if self.stages:
            parts.append(sum(passed for *_, passed in self.stages) / len(self.stages))
        return sum(parts) / len(parts)


@dataclass(frozen=True)
class Step:
    """What to do next: read (or finish reading) a lesson, drill its cards, or pass a lab
    stage. `done` when every question is."""

    kind: StepKind
    question: QuestionProgress | None = None
    lab: str = ""
    stage: str = ""

    def describe(self) -> str:
        """In words, e.g. `Question 2 of 8 · drill the 7 cards of “Case study: …”`."""
        question = self.question
        if self.kind == "done" or question is None:
            return "Every question is read, drilled and practised: run a mock interview."
        title = question.lesson.title
        if self.kind == "read":
            verb = "finish reading" if question.read == "reading" else "read"
            return f"{verb} “{title}”"
        if self.kind == "drill":
            left = question.cards - question.reviewed
            cards = "the card" if question.cards == 1 else f"the {question.cards} cards"
            return (f"drill {cards} of “{title}”" if left == question.cards
                    else f"drill “{title}”: {left} card{'s' if left != 1 else ''} to go")
        return f"lab {self.lab}: pass stage {self.stage} (for “{title}”)"


@dataclass(frozen=True)
class InterviewPath:
    questions: tuple[QuestionProgress, ...]

    @property
    def fraction(self) -> float:
        """0 to 1 over the whole interview."""
        if not self.questions:
            return 0.0
        return sum(question.fraction for question in self.questions) / len(self.questions)

    @property
    def next_step(self) -> Step:
        for question in self.questions:
            if question.read != "read":
                return Step("read", question)
            if question.reviewed < question.cards:
                return Step("drill", question)
            for lab, stage, passed in question.stages:
                if not passed:
                    return Step("lab", question, lab, stage)
        return Step("done")


def interview_path(catalog: Catalog, read: Mapping[str, str], reviewed: Collection[str],
                   passed: Mapping[str, Collection[str]], built_labs: Collection[str]
                   ) -> InterviewPath:
    """The path over the interview's lessons.

    Args:
        catalog: the lessons and their cards.
        read: lesson id -> reading | read (unread lessons are absent).
        reviewed: ids of the cards answered at least once.
        passed: lab id -> the stages whose latest run passed.
        built_labs: the labs that exist (stages of a lab still to come are left out).

    Returns:
        One `QuestionProgress` per interview lesson, in order.
    """
    questions = []
    for number, lesson in enumerate(catalog.track(INTERVIEW_TRACK), start=1):
        stages = tuple((link.lab, link.stage, link.stage in passed.get(link.lab, ()))
                       for link in lesson.labs if link.lab in built_labs)
        questions.append(QuestionProgress(
            number, lesson, read.get(lesson.id, "unread"),
            sum(1 for card in lesson.cards if card.id in reviewed), stages))
    return InterviewPath(tuple(questions))
