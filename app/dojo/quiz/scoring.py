"""`score_answer(card, text)`: which key points a typed answer makes, and how much it covers."""

from __future__ import annotations

from dataclasses import dataclass

from dojo.content.matching import fold, key_point_matches
from dojo.content.models import Card, KeyPoint
from dojo.quiz.answer_shape import AnswerShape, answer_shape

# A keyword list shows recall, not understanding: it keeps at most this share of the score.
KEYWORD_LIST_FACTOR = 0.5
KEYWORD_LIST_CAP = 0.25


@dataclass(frozen=True)
class Score:
    """The result of scoring one answer against one card."""

    card_id: str
    matched: tuple[KeyPoint, ...]
    missed: tuple[KeyPoint, ...]
    raw_coverage: float  # matched / all key points
    coverage: float  # what counts: raw coverage, reduced for a keyword list (0–1)
    shape: AnswerShape

    @property
    def matched_ids(self) -> tuple[str, ...]:
        return tuple(point.id for point in self.matched)

    @property
    def keyword_list(self) -> bool:
        """True when the answer reads like a list of terms; `shape.reason` says why."""
        return self.shape.looks_like_keyword_list

    @property
    def empty(self) -> bool:
        return self.shape.words == 0

    @property
    def percent(self) -> int:
        return round(self.coverage * 100)


def score_answer(card: Card, text: str) -> Score:
    """Score `text` against `card`'s key points. Deterministic: the same text always scores
    the same. Case is ignored and runs of whitespace count as one space."""
    folded = fold(text)
    matched = tuple(point for point in card.key_points if key_point_matches(point, folded))
    missed = tuple(point for point in card.key_points if point not in matched)
    raw = len(matched) / len(card.key_points) if card.key_points else 0.0
    shape = answer_shape(text)
    coverage = min(raw * KEYWORD_LIST_FACTOR, KEYWORD_LIST_CAP) if shape.looks_like_keyword_list \
        else raw
    return Score(card.id, matched, missed, raw, coverage, shape)
