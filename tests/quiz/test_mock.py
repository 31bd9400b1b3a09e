"""Mock interviews: different lessons, one follow-up each, and a report that points onward."""

from __future__ import annotations

import random
from pathlib import Path

from dojo.content import Catalog, LabAvailability
from dojo.quiz import build_mock_interview, mock_report, score_answer


def test_each_question_comes_from_a_different_lesson(catalog: Catalog) -> None:
    interview = build_mock_interview(catalog, 2, random.Random(1))
    lessons = [question.lesson.id for question in interview.questions]
    assert sorted(lessons) == ["dead-letter-queue", "idempotent-consumer"]


def test_each_question_is_a_headline_with_a_follow_up_from_its_lesson(
        catalog: Catalog) -> None:
    for question in build_mock_interview(catalog, 2, random.Random(7)).questions:
        assert question.headline.kind == "headline"
        assert question.follow_up is not None
        assert question.follow_up.kind == "followup"
        assert question.follow_up.lesson_id == question.lesson.id


def test_asking_for_more_questions_than_lessons_gives_one_per_lesson(
        catalog: Catalog) -> None:
    assert len(build_mock_interview(catalog, 10, random.Random(0)).questions) == 2


def test_the_same_seed_builds_the_same_interview(catalog: Catalog) -> None:
    first = build_mock_interview(catalog, 2, random.Random(42))
    second = build_mock_interview(catalog, 2, random.Random(42))
    assert [c.id for c in first.cards] == [c.id for c in second.cards]


def test_the_report_names_the_weakest_lesson_and_its_labs(catalog: Catalog,
                                                          tmp_path: Path) -> None:
    interview = build_mock_interview(catalog, 2, random.Random(3))
    scores = {}
    for question in interview.questions:
        for card in question.cards:
            # Answer the idempotency questions perfectly, the DLQ ones not at all.
            text = card.answer if question.lesson.id == "idempotent-consumer" else "no idea"
            scores[card.id] = score_answer(card, text)
    report = mock_report(interview, scores, tmp_path)
    (weak,) = report.weakest
    assert weak.lesson.id == "dead-letter-queue" and weak.coverage == 0.0
    assert [(lab.lab, lab.stage, lab.availability) for lab in weak.labs] == [
        ("dlq", "classify", LabAvailability.COMING), ("dlq", "replay", LabAvailability.COMING)]
    assert {card.lesson_id for card in report.review_next} == {"dead-letter-queue"}
    assert report.overall == 0.5


def test_a_lab_that_exists_is_reported_ready(catalog: Catalog, tmp_path: Path) -> None:
    (tmp_path / "labs" / "dlq").mkdir(parents=True)
    (tmp_path / "labs" / "dlq" / "lab.yaml").write_text("id: dlq\n")
    interview = build_mock_interview(catalog, 2, random.Random(3))
    report = mock_report(interview, {}, tmp_path)
    dlq = next(weak for weak in report.weakest if weak.lesson.id == "dead-letter-queue")
    assert {lab.availability for lab in dlq.labs} == {LabAvailability.READY}


def test_unanswered_questions_count_as_zero(catalog: Catalog, tmp_path: Path) -> None:
    interview = build_mock_interview(catalog, 2, random.Random(5))
    report = mock_report(interview, {}, tmp_path)
    assert report.overall == 0.0
    assert all(result.headline is None for result in report.results)


def test_a_strong_interview_has_no_weak_lessons(catalog: Catalog, tmp_path: Path) -> None:
    interview = build_mock_interview(catalog, 2, random.Random(5))
    scores = {card.id: score_answer(card, card.answer) for card in interview.cards}
    report = mock_report(interview, scores, tmp_path)
    assert report.weakest == () and report.review_next == ()
    assert report.overall == 1.0
