"""ReviewScheduler: self-grades scheduled by FSRS, logged, and turned into due cards."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import fsrs
import pytest

from dojo.content import Catalog
from dojo.quiz import ReviewScheduler, SelfGrade, score_answer, suggested_grade
from dojo.store import ProgressStore

T0 = datetime(2026, 3, 2, 8, 0, tzinfo=UTC)


@pytest.mark.parametrize(("text", "grade"), [
    ("1", SelfGrade.AGAIN), ("2", SelfGrade.HARD), ("3", SelfGrade.GOOD), ("4", SelfGrade.EASY),
    ("good", SelfGrade.GOOD), ("e", SelfGrade.EASY), (" Again ", SelfGrade.AGAIN),
    ("5", None), ("", None), ("maybe", None),
])
def test_self_grades_parse_from_numbers_and_names(text: str, grade: SelfGrade | None) -> None:
    assert SelfGrade.parse(text) is grade


def test_self_grades_map_onto_fsrs_ratings() -> None:
    assert [grade.rating for grade in SelfGrade] == [fsrs.Rating.Again, fsrs.Rating.Hard,
                                                     fsrs.Rating.Good, fsrs.Rating.Easy]


def test_a_review_is_stored_with_its_log(scheduler: ReviewScheduler,
                                         store: ProgressStore) -> None:
    scheduler.review("fx-dlq-what", SelfGrade.GOOD, at=T0, duration_ms=41_000)
    (log,) = store.reviews("fx-dlq-what")
    assert (log.rating, log.reviewed_at, log.review_duration_ms) == (fsrs.Rating.Good, T0,
                                                                     41_000)
    assert store.card_state("fx-dlq-what") is not None


def test_the_state_survives_a_new_scheduler_on_the_same_store(
        scheduler: ReviewScheduler, store: ProgressStore) -> None:
    card = scheduler.review("fx-dlq-what", SelfGrade.GOOD, at=T0)
    again = ReviewScheduler(store)
    assert again.state("fx-dlq-what") is not None
    assert again.state("fx-dlq-what").due == card.due  # type: ignore[union-attr]


def test_again_brings_a_card_back_sooner_than_easy(scheduler: ReviewScheduler) -> None:
    hard_card = scheduler.review("fx-dlq-what", SelfGrade.AGAIN, at=T0)
    easy_card = scheduler.review("fx-dlq-record", SelfGrade.EASY, at=T0)
    assert hard_card.due < easy_card.due


def test_fsrs_ids_are_stable_per_card(scheduler: ReviewScheduler, store: ProgressStore) -> None:
    first = scheduler.review("fx-dlq-what", SelfGrade.GOOD, at=T0)
    with ProgressStore(store.path.parent / "other.sqlite3") as elsewhere:
        other = ReviewScheduler(elsewhere)
        assert other.review("fx-dlq-what", SelfGrade.GOOD, at=T0).card_id == first.card_id


def test_due_lists_reviewed_cards_whose_time_has_come_most_overdue_first(
        scheduler: ReviewScheduler, catalog: Catalog) -> None:
    scheduler.review("fx-dlq-record", SelfGrade.AGAIN, at=T0)  # back in about a minute
    scheduler.review("fx-dlq-what", SelfGrade.AGAIN, at=T0 - timedelta(hours=1))
    scheduler.review("fx-dlq-replay", SelfGrade.EASY, at=T0)  # days away
    due = scheduler.due(catalog.cards, now=T0 + timedelta(minutes=30))
    assert [card.id for card in due] == ["fx-dlq-what", "fx-dlq-record"]


def test_new_cards_are_those_never_reviewed_in_lesson_order(
        scheduler: ReviewScheduler, catalog: Catalog) -> None:
    scheduler.review("fx-dlq-what", SelfGrade.GOOD, at=T0)
    lesson = catalog.lesson("dead-letter-queue")
    assert [card.id for card in scheduler.new(lesson.cards)] == [
        "fx-dlq-record", "fx-dlq-replay", "fx-dlq-spot"]


def test_next_cards_puts_due_before_new_and_respects_the_limit(
        scheduler: ReviewScheduler, catalog: Catalog) -> None:
    scheduler.review("fx-idem-spot", SelfGrade.AGAIN, at=T0)
    picked = scheduler.next_cards(catalog.cards, 3, now=T0 + timedelta(hours=1))
    assert [card.id for card in picked] == ["fx-idem-spot", "fx-dlq-what", "fx-dlq-record"]


def test_mastery_is_zero_before_any_review_and_grows_after(
        scheduler: ReviewScheduler, catalog: Catalog) -> None:
    lesson = catalog.lesson("dead-letter-queue")
    assert scheduler.lesson_mastery(lesson, now=T0) == 0.0
    for card in lesson.cards[:2]:
        scheduler.review(card.id, SelfGrade.GOOD, at=T0)
    mastery = scheduler.lesson_mastery(lesson, now=T0 + timedelta(hours=1))
    assert 0.4 < mastery <= 0.5  # two of four cards, each recalled with high probability


def test_the_next_due_time_is_the_earliest_one(scheduler: ReviewScheduler,
                                               catalog: Catalog) -> None:
    assert scheduler.next_due_at(catalog.cards) is None
    soon = scheduler.review("fx-dlq-what", SelfGrade.AGAIN, at=T0)
    scheduler.review("fx-dlq-record", SelfGrade.EASY, at=T0)
    assert scheduler.next_due_at(catalog.cards) == soon.due


def test_the_suggested_grade_follows_coverage(catalog: Catalog) -> None:
    card = catalog.card("fx-dlq-what")
    assert suggested_grade(score_answer(card, card.answer)) is SelfGrade.GOOD
    assert suggested_grade(score_answer(card, "")) is SelfGrade.AGAIN
    partial = score_answer(card, "The consumer parks a poison message in the DLQ so the stream "
                                 "keeps moving, and it retries timeouts with backoff first. "
                                 "Every DLQ needs an alert and an owner.")
    assert partial.coverage == 3 / 5
    assert suggested_grade(partial) is SelfGrade.HARD


def test_a_keyword_list_is_suggested_again_whatever_it_matched(catalog: Catalog) -> None:
    card = catalog.card("fx-dlq-what")
    stuffed = score_answer(card, "park in dlq, retry with backoff, malformed at once, "
                                 "pause consumption, needs alert owner")
    assert stuffed.keyword_list
    assert suggested_grade(stuffed) is SelfGrade.AGAIN
