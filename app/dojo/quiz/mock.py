"""A mock interview: N headline questions from different lessons, each with one follow-up,
and a report that says where the learner is weakest and what to do about it."""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from dojo.content.lab_links import LabAvailability, lab_availability
from dojo.content.models import Card, Catalog, KeyPoint, Lesson
from dojo.quiz.scoring import Score

WEAK_BELOW = 0.7  # a question answered with less coverage marks its lesson as weak
MAX_WEAKEST = 3


@dataclass(frozen=True)
class MockQuestion:
    """One lesson's headline question and the follow-up the interviewer asks after it."""

    lesson: Lesson
    headline: Card
    follow_up: Card | None

    @property
    def cards(self) -> tuple[Card, ...]:
        return (self.headline,) + ((self.follow_up,) if self.follow_up else ())


@dataclass(frozen=True)
class MockInterview:
    questions: tuple[MockQuestion, ...]

    @property
    def cards(self) -> tuple[Card, ...]:
        """Every card in the order they are asked."""
        return tuple(card for question in self.questions for card in question.cards)


def build_mock_interview(catalog: Catalog, count: int,
                         rng: random.Random | None = None) -> MockInterview:
    """Pick `count` lessons that have a headline card (fewer if the catalog has fewer) and,
    for each, one follow-up card (a spot-the-mistake when the lesson has no follow-up)."""
    rng = rng or random.Random()
    lessons = [lesson for lesson in catalog.lessons if lesson.headline_card is not None]
    chosen = rng.sample(lessons, min(count, len(lessons)))
    questions = []
    for lesson in chosen:
        headline = lesson.headline_card
        assert headline is not None  # filtered above
        follow_ups = [card for card in lesson.cards if card.kind == "followup"] or \
            [card for card in lesson.cards if card.kind == "spot-the-mistake"]
        questions.append(MockQuestion(lesson, headline,
                                      rng.choice(follow_ups) if follow_ups else None))
    return MockInterview(tuple(questions))


@dataclass(frozen=True)
class LabPointer:
    """A lab stage to practise, and whether it can be started yet."""

    lab: str
    stage: str
    availability: LabAvailability


@dataclass(frozen=True)
class QuestionResult:
    question: MockQuestion
    headline: Score | None  # None when the question was not answered (interview cut short)
    follow_up: Score | None

    @property
    def coverage(self) -> float:
        """Mean coverage over the cards of this question; unanswered counts as 0."""
        scores = [self.headline, self.follow_up] if self.question.follow_up else [self.headline]
        return sum(score.coverage if score else 0.0 for score in scores) / len(scores)

    @property
    def missed(self) -> tuple[KeyPoint, ...]:
        return tuple(point for score in (self.headline, self.follow_up) if score
                     for point in score.missed)


@dataclass(frozen=True)
class WeakLesson:
    """A lesson to go back to: how it went, what was missed, the labs that train it."""

    lesson: Lesson
    coverage: float
    missed: tuple[KeyPoint, ...]
    labs: tuple[LabPointer, ...]


@dataclass(frozen=True)
class MockReport:
    results: tuple[QuestionResult, ...]
    weakest: tuple[WeakLesson, ...]  # weakest first, at most MAX_WEAKEST
    review_next: tuple[Card, ...]  # cards to drill again, weakest lesson first

    @property
    def overall(self) -> float:
        if not self.results:
            return 0.0
        return sum(result.coverage for result in self.results) / len(self.results)


def mock_report(interview: MockInterview, scores: Mapping[str, Score],
                root: Path) -> MockReport:
    """The report after a mock interview. `scores` maps card id to its score; cards not in it
    were not answered. `root` is the content root, to tell ready labs from coming ones."""
    results = tuple(
        QuestionResult(question, scores.get(question.headline.id),
                       scores.get(question.follow_up.id) if question.follow_up else None)
        for question in interview.questions)
    weak = sorted((result for result in results if result.coverage < WEAK_BELOW),
                  key=lambda result: (result.coverage, result.question.lesson.id))[:MAX_WEAKEST]
    weakest = tuple(
        WeakLesson(result.question.lesson, result.coverage, result.missed,
                   tuple(LabPointer(link.lab, link.stage, lab_availability(root, link.lab))
                         for link in result.question.lesson.labs))
        for result in weak)
    review_next = tuple(card for result in weak for card in result.question.cards
                        if (score := scores.get(card.id)) is None or score.coverage < 1.0)
    return MockReport(results, weakest, review_next)
