"""The guided path: the interview's questions in order, each read → drilled → practised in its
lab, and the next step is the first thing not done."""

from __future__ import annotations

from pathlib import Path

import pytest

from dojo.content import Catalog, load_catalog
from dojo.interview_path import interview_path

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return load_catalog(REPO)


def every_card(catalog: Catalog, lesson_id: str) -> set[str]:
    return {card.id for card in catalog.lesson(lesson_id).cards}


def test_the_path_is_the_eight_interview_questions_in_order(catalog: Catalog) -> None:
    path = interview_path(catalog, {}, set(), {}, set())
    assert [question.number for question in path.questions] == list(range(1, 9))
    assert [question.lesson.id for question in path.questions] == [
        lesson.id for lesson in catalog.track("interview")]
    assert path.fraction == 0
    step = path.next_step
    assert (step.kind, step.question and step.question.lesson.id) == ("read",
                                                                      "dead-letter-queue")
    assert step.describe() == "read “Dead letter queues”"


def test_after_reading_comes_drilling_then_the_lab_stages_in_the_lessons_order(
        catalog: Catalog) -> None:
    read = {"dead-letter-queue": "read"}
    cards = sorted(every_card(catalog, "dead-letter-queue"))
    step = interview_path(catalog, read, set(cards[:2]), {}, {"dlq"}).next_step
    assert step.kind == "drill"
    assert step.describe().endswith(f"{len(cards) - 2} cards to go")
    path = interview_path(catalog, read, set(cards), {"dlq": {"classify"}}, {"dlq"})
    step = path.next_step
    lesson = catalog.lesson("dead-letter-queue")
    first_open = next(link for link in lesson.labs if link.stage != "classify")
    assert (step.kind, step.lab, step.stage) == ("lab", "dlq", first_open.stage)


def test_stages_of_a_lab_not_built_are_not_on_the_path(catalog: Catalog) -> None:
    path = interview_path(catalog, {"dead-letter-queue": "read"},
                          every_card(catalog, "dead-letter-queue"), {}, built_labs=set())
    assert path.questions[0].fraction == 1
    step = path.next_step
    assert step.kind == "read" and step.question is not None and step.question.number == 2


def test_progress_is_the_mean_of_each_questions_parts(catalog: Catalog) -> None:
    lesson = catalog.lesson("dead-letter-queue")
    stages = {link.stage for link in lesson.labs}
    half_read = interview_path(catalog, {"dead-letter-queue": "reading"}, set(), {}, {"dlq"})
    assert half_read.questions[0].fraction == pytest.approx(0.5 / 3), \
        "reading counts half of one part in three (read, drill, lab)"
    done = interview_path(catalog, {"dead-letter-queue": "read"},
                          every_card(catalog, "dead-letter-queue"), {"dlq": stages}, {"dlq"})
    assert done.questions[0].fraction == 1
    others = [question.fraction for question in done.questions[1:]]
    assert all(fraction < 1 for fraction in others)
    assert done.fraction == pytest.approx((1 + sum(others)) / 8), "the whole is the mean"


def test_when_every_question_is_done_the_next_step_is_a_mock_interview(catalog: Catalog
                                                                       ) -> None:
    lessons = catalog.track("interview")
    read = {lesson.id: "read" for lesson in lessons}
    reviewed = {card.id for lesson in lessons for card in lesson.cards}
    passed: dict[str, set[str]] = {}
    for lesson in lessons:
        for link in lesson.labs:
            passed.setdefault(link.lab, set()).add(link.stage)
    path = interview_path(catalog, read, reviewed, passed, set(passed))
    assert path.fraction == 1 and path.next_step.kind == "done"
    assert "mock interview" in path.next_step.describe()
