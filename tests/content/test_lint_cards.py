"""lint_lessons on cards.yaml: schema, counts, headline, patterns; each with its line."""

from __future__ import annotations

from pathlib import Path

from dojo.content import Problem, lint_lessons
from tests.content.conftest import DLQ, IDEM, ContentRoot

CARDS = IDEM / "cards.yaml"


def problems_in(content: ContentRoot, relative: Path = CARDS) -> list[Problem]:
    return [p for p in lint_lessons(content.root) if p.path == content.path(relative)]


def messages(content: ContentRoot, relative: Path = CARDS) -> list[str]:
    return [p.message for p in problems_in(content, relative)]


def only(content: ContentRoot, relative: Path = CARDS) -> Problem:
    found = problems_in(content, relative)
    assert len(found) == 1, "expected exactly one problem, got:\n" + "\n".join(map(str, found))
    return found[0]


def drop_card(content: ContentRoot, card_id: str) -> None:
    path = content.path(CARDS)
    text = path.read_text()
    start = text.index(f"  - id: {card_id}\n")
    end = text.find("\n  - id: ", start + 1)
    path.write_text(text[:start] + (text[end + 1:] if end != -1 else ""))


def test_a_bad_regex_is_reported_at_its_line(content: ContentRoot) -> None:
    content.replace(CARDS, "'both apply'", "'both apply('")
    problem = only(content)
    assert "pattern 'both apply(' does not compile" in problem.message
    assert problem.line == content.line_of(CARDS, "'both apply('")


def test_a_pattern_matching_empty_text_is_reported(content: ContentRoot) -> None:
    content.replace(CARDS, "'let the conflict'", "'(let the conflict)?'")
    assert "matches empty text" in only(content).message


def test_a_lesson_needs_four_cards(content: ContentRoot) -> None:
    drop_card(content, "fx-idem-source")
    assert "3 cards; a lesson needs at least 4" in only(content).message


def test_a_lesson_needs_exactly_one_headline(content: ContentRoot) -> None:
    content.replace(CARDS, "  - id: fx-idem-source\n    kind: followup",
                    "  - id: fx-idem-source\n    kind: headline\n    measuring: \"x\"")
    problem = only(content)
    assert "2 headline cards; exactly one" in problem.message
    assert problem.line == content.line_of(CARDS, "- id: fx-idem-source")


def test_a_lesson_needs_a_spot_the_mistake_card(content: ContentRoot) -> None:
    content.replace(CARDS, "kind: spot-the-mistake", "kind: followup")
    assert "no spot-the-mistake card" in only(content).message


def test_the_headline_must_ask_the_lesson_question(content: ContentRoot) -> None:
    content.replace(CARDS, 'question: "How do you make a consumer idempotent?"',
                    'question: "What is Kafka?"')
    assert "does not ask the lesson's question" in only(content).message


def test_the_headline_answer_must_be_the_sixty_second_answer(content: ContentRoot) -> None:
    content.replace(CARDS, "Natural idempotence also works: an upsert by business key, or a"
                           " state machine that ignores\n      a transition it has already "
                           "made, needs no extra table at all.", "That is all.")
    assert "must be the lesson's 60-second answer" in only(content).message


def test_a_card_needs_four_to_eight_key_points(content: ContentRoot) -> None:
    content.replace(CARDS, "      - id: let-conflict\n        text: \"Insert and let the conflict "
                           "decide\"\n        patterns: ['let the conflict']\n", "")
    problem = only(content)
    assert "4 to 8 key points, this one has 3" in problem.message


def test_a_key_point_its_own_answer_does_not_show_is_reported(content: ContentRoot) -> None:
    content.replace(CARDS, "'(a|an) (uuid|ulid)'", "'(a|an) (snowflake|ulid)'")
    problem = only(content)
    assert "key point 'uuid' is not recognised in card 'fx-idem-source''s own answer" \
        in problem.message
    assert problem.line == content.line_of(CARDS, "- id: uuid")


def test_a_bare_word_pattern_is_reported(content: ContentRoot) -> None:
    content.replace(CARDS, "'(a|an) (uuid|ulid)'", "'uuid|ulid'")
    problem = only(content)
    assert "matches a bare word" in problem.message
    assert problem.line == content.line_of(CARDS, "'uuid|ulid'")


def test_a_pattern_joining_two_words_is_not_bare(content: ContentRoot) -> None:
    content.replace(CARDS, "'(a|an) (uuid|ulid)'", "'uuid\\W+(\\w+\\W+){0,3}header'")
    assert problems_in(content) == []


def test_card_ids_are_unique_across_lessons(content: ContentRoot) -> None:
    content.replace(CARDS, "id: fx-idem-spot", "id: fx-dlq-spot")
    problem = only(content)
    assert "card id 'fx-dlq-spot' is already used in lesson 'dead-letter-queue'" \
        in problem.message


def test_a_card_without_a_question_is_reported(content: ContentRoot) -> None:
    content.replace(CARDS, '    question: "Where does the event id come from?"\n', "")
    found = messages(content)
    assert "card is missing `question`" in found, found


def test_an_unknown_kind_is_reported(content: ContentRoot) -> None:
    content.replace(CARDS, "kind: spot-the-mistake", "kind: trick")
    assert any("kind 'trick' must be one of" in m for m in messages(content))


def test_an_unknown_card_key_is_reported(content: ContentRoot) -> None:
    content.replace(CARDS, "  - id: fx-idem-source\n", "  - id: fx-idem-source\n    level: 1\n")
    problem = only(content)
    assert "unknown card key `level`" in problem.message
    assert problem.line == content.line_of(CARDS, "level: 1")


def test_a_key_written_twice_is_reported(content: ContentRoot) -> None:
    content.replace(CARDS, "  - id: fx-idem-source\n    kind: followup\n",
                    "  - id: fx-idem-source\n    kind: followup\n    kind: followup\n")
    problem = only(content)
    assert "`kind` appears twice" in problem.message
    assert problem.line == content.line_of(CARDS, "kind: followup", nth=2)


def test_the_lesson_key_must_name_the_lesson(content: ContentRoot) -> None:
    content.replace(CARDS, "lesson: idempotent-consumer", "lesson: idempotency")
    assert "must be this lesson's id 'idempotent-consumer'" in only(content).message


def test_a_window_pattern_needs_a_positive_within(content: ContentRoot) -> None:
    content.replace(CARDS, "within: 120}", "within: -1}")
    assert any("`within` must be a positive number" in m for m in messages(content))


def test_yaml_errors_in_cards_name_the_line_pyyaml_reports(content: ContentRoot) -> None:
    content.replace(DLQ / "cards.yaml", "    kind: followup\n    question: \"What do you put",
                    "    kind: followup\n   question: \"What do you put")
    problem = only(content, DLQ / "cards.yaml")
    assert problem.message.startswith("invalid YAML")
    assert problem.line == content.line_of(DLQ / "cards.yaml", "   question: \"What do you put")
