"""Spaced repetition with FSRS: self-grades in, due cards out, every review logged.

fsrs keeps each card's memory state (stability, difficulty, due); this wrapper keys it by our
card ids, persists it through the progress store, and answers the questions a quiz asks:
what is due, what is new, how well is a lesson known.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from enum import IntEnum

import fsrs

from dojo.content.models import Card, Lesson
from dojo.quiz.ids import stable_id
from dojo.quiz.scoring import Score
from dojo.store import ProgressStore

FSRS_ID_LOW, FSRS_ID_HIGH = 1, 1 << 53  # fits a JSON number and SQLite's INTEGER


class SelfGrade(IntEnum):
    """How the learner grades their own answer after seeing the model answer."""

    AGAIN = 1
    HARD = 2
    GOOD = 3
    EASY = 4

    @property
    def rating(self) -> fsrs.Rating:
        return fsrs.Rating(int(self))

    @property
    def label(self) -> str:
        return self.name.capitalize()

    @classmethod
    def parse(cls, text: str) -> SelfGrade | None:
        """`1`–`4` or a name (`good`, `g`); None for anything else."""
        text = text.strip().lower()
        if text.isdigit() and 1 <= int(text) <= 4:
            return cls(int(text))
        for grade in cls:
            if text and grade.name.lower().startswith(text):
                return grade
        return None


def suggested_grade(score: Score) -> SelfGrade:
    """A default the learner can accept with Enter: what the coverage suggests. Easy is
    never suggested; only the learner knows the answer came effortlessly."""
    if score.keyword_list or score.coverage < 0.35:
        return SelfGrade.AGAIN
    if score.coverage < 0.65:
        return SelfGrade.HARD
    return SelfGrade.GOOD


def _now() -> datetime:
    return datetime.now(UTC)


class ReviewScheduler:
    """FSRS over the progress store.

    Args:
        store: where card states and review logs are kept.
        scheduler: the fsrs Scheduler (default parameters, 90 % desired retention); tests
            pass one with fuzzing off for exact intervals.
    """

    def __init__(self, store: ProgressStore, scheduler: fsrs.Scheduler | None = None) -> None:
        self.store = store
        self.fsrs = scheduler or fsrs.Scheduler()
        self._states: dict[str, fsrs.Card] | None = None

    def _all_states(self) -> dict[str, fsrs.Card]:
        if self._states is None:
            self._states = self.store.card_states()
        return self._states

    def state(self, card_id: str) -> fsrs.Card | None:
        """The card's FSRS state, or None when it was never reviewed."""
        return self._all_states().get(card_id)

    def review(self, card_id: str, grade: SelfGrade, *, at: datetime | None = None,
               duration_ms: int | None = None) -> fsrs.Card:
        """Apply a self-grade: schedule the card's next review and log this one."""
        at = at or _now()
        card = self.state(card_id) or fsrs.Card(card_id=stable_id(card_id, FSRS_ID_LOW,
                                                                  FSRS_ID_HIGH), due=at)
        card, log = self.fsrs.review_card(card, grade.rating, at, duration_ms)
        self.store.record_review(card_id, card, log)
        self._all_states()[card_id] = card
        return card

    def preview(self, card_id: str, at: datetime | None = None) -> dict[SelfGrade, datetime]:
        """When the card would come back after each grade (as Anki shows on its buttons);
        nothing is stored."""
        at = at or _now()
        state = self.state(card_id) or fsrs.Card(card_id=stable_id(card_id, FSRS_ID_LOW,
                                                                   FSRS_ID_HIGH), due=at)
        out: dict[SelfGrade, datetime] = {}
        exact = copy.copy(self.fsrs)  # without the random fuzz, as Anki shows its buttons
        exact.enable_fuzzing = False
        for grade in SelfGrade:
            card, _ = exact.review_card(copy.deepcopy(state), grade.rating, at)
            out[grade] = card.due
        return out

    def due(self, cards: Iterable[Card], now: datetime | None = None) -> list[Card]:
        """Cards reviewed before whose next review has come, most overdue first."""
        now = now or _now()
        states = self._all_states()
        due = [card for card in cards if card.id in states and states[card.id].due <= now]
        return sorted(due, key=lambda card: states[card.id].due)

    def new(self, cards: Iterable[Card]) -> list[Card]:
        """Cards never reviewed, in the order given (lesson order)."""
        states = self._all_states()
        return [card for card in cards if card.id not in states]

    def next_cards(self, cards: Sequence[Card], limit: int,
                   now: datetime | None = None) -> list[Card]:
        """What to practise now: due cards first, then new ones, at most `limit`."""
        return (self.due(cards, now) + self.new(cards))[:limit]

    def next_due_at(self, cards: Iterable[Card]) -> datetime | None:
        """When the earliest reviewed card among `cards` falls due."""
        states = self._all_states()
        dues = [states[card.id].due for card in cards if card.id in states]
        return min(dues) if dues else None

    def retrievability(self, card_id: str, now: datetime | None = None) -> float:
        """FSRS's chance (0–1) that the learner recalls the card now; 0 if never reviewed."""
        card = self.state(card_id)
        if card is None:
            return 0.0
        return float(self.fsrs.get_card_retrievability(card, now or _now()))

    def lesson_mastery(self, lesson: Lesson, now: datetime | None = None) -> float:
        """Mean retrievability of the lesson's cards (unreviewed cards count as 0)."""
        if not lesson.cards:
            return 0.0
        now = now or _now()
        return sum(self.retrievability(card.id, now) for card in lesson.cards) / len(lesson.cards)
