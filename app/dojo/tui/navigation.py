"""Messages that ask the app to go somewhere. Screens and the command palette post them; the
app (and only the app) pushes screens, so no screen imports another."""

from __future__ import annotations

from dataclasses import dataclass

from textual.message import Message


@dataclass
class OpenLesson(Message):
    """Open a lesson; `section` is a slug to scroll to, `position` a line to resume at."""

    lesson_id: str
    section: str = ""
    position: int | None = None


@dataclass
class OpenLab(Message):
    """Open a lab, with `stage` selected."""

    lab_id: str
    stage: str = ""


@dataclass
class StartDrill(Message):
    """A quiz round over these cards (in this order)."""

    card_ids: tuple[str, ...]
    title: str = "Drill"


@dataclass
class StartMock(Message):
    """A mock interview of `questions` questions, each with a follow-up."""

    questions: int = 3


@dataclass
class OpenProgress(Message):
    """The progress overview."""


@dataclass
class ContinueLast(Message):
    """Go back to where the learner was last (lesson, lab or quiz)."""


@dataclass
class StartServices(Message):
    """Start PostgreSQL and Kafka (Home shows the progress)."""
