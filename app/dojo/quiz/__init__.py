"""The self-quiz: key-point scoring, spaced repetition (FSRS), mock interviews, the clock.

The TUI and CLI call:
- `score_answer(card, text) -> Score` — matched / missed key points, coverage, keyword-list flag.
- `ReviewScheduler(store)` — `.review(card_id, SelfGrade.GOOD)`, `.next_cards(cards, n)`,
  `.due(cards)`, `.lesson_mastery(lesson)`.
- `suggested_grade(score)` — the default self-grade to offer.
- `build_mock_interview(catalog, n)` and `mock_report(interview, scores, root)`.
- `Countdown(seconds)` — `.remaining()`, `.expired`, `.label()`.
"""

from dojo.quiz.answer_shape import AnswerShape, answer_shape
from dojo.quiz.mock import (
    LabPointer,
    MockInterview,
    MockQuestion,
    MockReport,
    QuestionResult,
    WeakLesson,
    build_mock_interview,
    mock_report,
)
from dojo.quiz.schedule import ReviewScheduler, SelfGrade, suggested_grade
from dojo.quiz.scoring import Score, score_answer
from dojo.quiz.timer import Countdown

__all__ = [
    "AnswerShape",
    "Countdown",
    "LabPointer",
    "MockInterview",
    "MockQuestion",
    "MockReport",
    "QuestionResult",
    "ReviewScheduler",
    "Score",
    "SelfGrade",
    "WeakLesson",
    "answer_shape",
    "build_mock_interview",
    "mock_report",
    "score_answer",
    "suggested_grade",
]
