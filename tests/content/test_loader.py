"""load_catalog: lessons and cards as typed models, never a crash on broken files."""

from __future__ import annotations

from pathlib import Path

import pytest

from dojo.content import LabAvailability, lab_availability, load_catalog
from tests.content.conftest import DLQ, FIXTURE_ROOT, IDEM, ContentRoot


def test_lessons_are_sorted_by_track_then_order() -> None:
    catalog = load_catalog(FIXTURE_ROOT)
    assert [(lesson.track, lesson.id) for lesson in catalog.lessons] == [
        ("interview", "dead-letter-queue"), ("next", "idempotent-consumer")]


def test_a_lesson_is_found_by_id_and_an_unknown_id_names_the_known_ones() -> None:
    catalog = load_catalog(FIXTURE_ROOT)
    assert catalog.lesson("idempotent-consumer").title == "Idempotent consumers"
    with pytest.raises(KeyError, match="dead-letter-queue"):
        catalog.lesson("no-such-lesson")


def test_a_card_is_found_by_id_and_knows_its_lesson() -> None:
    catalog = load_catalog(FIXTURE_ROOT)
    card = catalog.card("fx-idem-spot")
    assert card.kind == "spot-the-mistake"
    assert catalog.lesson_of(card).id == "idempotent-consumer"


def test_front_matter_fields_are_typed() -> None:
    lesson = load_catalog(FIXTURE_ROOT).lesson("dead-letter-queue")
    assert lesson.order == 1 and lesson.seconds == 60
    assert [(link.lab, link.stage) for link in lesson.labs] == [("dlq", "classify"),
                                                                ("dlq", "replay")]
    assert lesson.related == ("idempotent-consumer",)


def test_sections_come_in_file_order_with_their_subsections() -> None:
    lesson = load_catalog(FIXTURE_ROOT).lesson("dead-letter-queue")
    assert lesson.sections[0].title == "The 60-second answer"
    deep = lesson.section("deep-dive")
    assert deep is not None
    assert [sub.title for sub in deep.subsections] == ["Block or lose", "Replay"]


def test_the_sixty_second_answer_is_the_text_of_its_section() -> None:
    lesson = load_catalog(FIXTURE_ROOT).lesson("dead-letter-queue")
    assert lesson.sixty_second_answer.startswith("A dead letter queue is a separate queue")
    assert lesson.sixty_second_answer.endswith("silent graveyard that nobody reads.")


def test_follow_ups_are_grouped_by_level_with_question_and_answer() -> None:
    lesson = load_catalog(FIXTURE_ROOT).lesson("dead-letter-queue")
    assert [item.level for item in lesson.follow_ups] == [1, 2, 3]
    first = lesson.follow_ups[0]
    assert first.question == "What do you put in a dead-letter record?"
    assert first.answer.startswith("The original payload") and "trace id" in first.answer


def test_a_follow_up_written_with_bold_q_label_reads_the_same() -> None:
    # "**Q:** text" renders like the documented "**Q: text**"; both are accepted.
    lesson = load_catalog(FIXTURE_ROOT).lesson("idempotent-consumer")
    assert lesson.follow_ups[1].question == "Why not check first and insert after?"


def test_common_mistakes_rows_have_three_cells() -> None:
    lesson = load_catalog(FIXTURE_ROOT).lesson("dead-letter-queue")
    assert len(lesson.mistakes) == 4
    assert lesson.mistakes[1].consequence == "The message is lost for good"


def test_diagrams_are_the_fenced_blocks_marked_diagram(content: ContentRoot) -> None:
    lesson = load_catalog(content.root).lesson("dead-letter-queue")
    assert len(lesson.diagrams) == 1
    assert lesson.diagrams[0].line == content.line_of(DLQ / "lesson.md", "```diagram")
    assert "dead-letter topic" in lesson.diagrams[0].text


def test_headings_inside_code_blocks_are_not_sections(content: ContentRoot) -> None:
    content.replace(IDEM / "lesson.md", "create table", "## Not a section\ncreate table")
    lesson = load_catalog(content.root).lesson("idempotent-consumer")
    assert lesson.section("Not a section") is None


def test_key_points_keep_their_patterns() -> None:
    card = load_catalog(FIXTURE_ROOT).card("fx-dlq-what")
    parks = card.key_points[0]
    assert parks.id == "parks"
    assert parks.patterns[1].regexes == ("dead[- ]letter|dlq",
                                         "(block|stall|hold up|keeps? (flowing|moving))")
    assert parks.patterns[1].within == 160
    assert parks.patterns[0].within is None


def test_malformed_cards_yaml_is_a_problem_at_its_line_not_a_crash(
        content: ContentRoot) -> None:
    content.replace(IDEM / "cards.yaml", "kind: followup", "kind: [followup")
    catalog = load_catalog(content.root)
    assert catalog.lesson("idempotent-consumer").cards == ()
    problems = [p for p in catalog.problems if p.path.name == "cards.yaml"]
    assert len(problems) == 1
    assert "invalid YAML" in problems[0].message
    # PyYAML reports the line where the flow sequence turned out to be broken.
    assert problems[0].line >= content.line_of(IDEM / "cards.yaml", "kind: [followup")


def test_malformed_front_matter_skips_that_lesson_only(content: ContentRoot) -> None:
    content.replace(DLQ / "lesson.md", "order: 1", "order: [1")
    catalog = load_catalog(content.root)
    assert [lesson.id for lesson in catalog.lessons] == ["idempotent-consumer"]
    (problem,) = catalog.problems
    assert problem.path == content.path(DLQ / "lesson.md")
    assert problem.line >= content.line_of(DLQ / "lesson.md", "order: [1")


def test_a_lesson_without_front_matter_is_a_problem_on_line_one(content: ContentRoot) -> None:
    path = content.path(DLQ / "lesson.md")
    path.write_text(path.read_text().replace("---\n", "", 1))
    (problem,) = load_catalog(content.root).problems
    assert problem.line == 1 and "front matter" in problem.message


def test_an_empty_content_root_is_an_empty_catalog(tmp_path: Path) -> None:
    catalog = load_catalog(tmp_path)
    assert catalog.lessons == () and catalog.problems == ()


def test_a_lab_is_ready_only_when_its_lab_yaml_exists(content: ContentRoot) -> None:
    assert lab_availability(content.root, "saga") is LabAvailability.COMING
    (content.path("labs/saga")).mkdir(parents=True)
    assert lab_availability(content.root, "saga") is LabAvailability.COMING
    (content.path("labs/saga/lab.yaml")).write_text("id: saga\n")
    assert lab_availability(content.root, "saga") is LabAvailability.READY
