"""score_answer: key points recognised by their patterns, coverage, keyword lists penalised."""

from __future__ import annotations

from pathlib import Path

from dojo.content import Card, KeyPoint, Pattern, load_catalog
from dojo.quiz import score_answer
from dojo.quiz.scoring import KEYWORD_LIST_CAP

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "content"
CATALOG = load_catalog(FIXTURES)
DLQ = CATALOG.card("fx-dlq-what")


def card_with(*patterns: Pattern) -> Card:
    points = tuple(KeyPoint(f"p{i}", f"point {i}", (pattern,), 1)
                   for i, pattern in enumerate(patterns))
    return Card("t", "followup", "q?", "a", "", points, "lesson", Path("cards.yaml"), 1)


def test_the_model_answer_covers_every_key_point() -> None:
    score = score_answer(DLQ, DLQ.answer)
    assert score.coverage == 1.0 and score.missed == ()


def test_a_partial_answer_names_what_it_matched_and_what_it_missed() -> None:
    score = score_answer(DLQ, "A DLQ is where the consumer parks a message that keeps failing, "
                              "so the stream keeps moving. Transient errors are retried with "
                              "exponential backoff first.")
    assert score.matched_ids == ("parks", "backoff")
    assert [point.id for point in score.missed] == ["permanent-at-once", "pause-on-outage",
                                                    "alert-owner"]
    assert score.coverage == 2 / 5


def test_an_empty_answer_scores_zero_and_misses_everything() -> None:
    score = score_answer(DLQ, "   \n ")
    assert score.empty and score.coverage == 0.0
    assert len(score.missed) == len(DLQ.key_points)
    assert not score.keyword_list


def test_case_and_line_breaks_do_not_matter() -> None:
    text = "we RETRY the call\n   WITH\texponential BACKOFF when it times out"
    assert score_answer(DLQ, text).matched_ids == ("backoff",)


def test_a_window_pattern_needs_all_its_parts_close_together() -> None:
    card = card_with(Pattern(("dead letter", "block"), 60, 1))
    assert score_answer(card, "a dead letter queue means one message cannot block "
                              "the others").coverage == 1.0
    far = "a dead letter queue " + "is a thing we use in production systems " * 3 + "to block"
    assert score_answer(card, far).coverage == 0.0


def test_the_window_defaults_to_120_characters() -> None:
    card = card_with(Pattern(("alpha", "omega"), None, 1))
    assert score_answer(card, "alpha " + "and " * 27 + "omega").coverage == 1.0  # 119 chars
    assert score_answer(card, "alpha " + "and " * 28 + "omega").coverage == 0.0  # 123 chars


def test_a_plain_regex_matches_anywhere_in_the_answer() -> None:
    card = card_with(Pattern(("retr\\w* with backoff",), None, 1))
    filler = "this is the part of the answer that talks about something else. " * 20
    assert score_answer(card, filler + "it retries with backoff").coverage == 1.0


def test_any_one_pattern_of_a_key_point_is_enough() -> None:
    point = KeyPoint("p", "p", (Pattern(("never matches zzz",), None, 1),
                                Pattern(("second one",), None, 2)), 1)
    card = Card("t", "followup", "q", "a", "", (point,), "l", Path("c"), 1)
    assert score_answer(card, "the second one hits").coverage == 1.0


def test_a_comma_separated_keyword_list_is_flagged_and_capped() -> None:
    stuffed = ("dlq, dead letter, park, retry, backoff, exponential backoff, malformed, "
               "at once, dependency is down, pause consumption, alert, owner, replay")
    score = score_answer(DLQ, stuffed)
    assert score.keyword_list
    assert "keyword list" in score.shape.reason
    assert score.coverage <= KEYWORD_LIST_CAP
    assert score.coverage < score.raw_coverage


def test_a_newline_separated_list_of_short_fragments_is_flagged() -> None:
    stuffed = "parks in dlq\nretry with backoff\nmalformed at once\npause consumption\nalert owner"
    assert score_answer(DLQ, stuffed).keyword_list


def test_a_terse_answer_in_sentences_is_not_a_keyword_list() -> None:
    terse = ("Retry transient errors with backoff, then dead-letter after a few attempts; "
             "a malformed payload goes to the DLQ at once, and we alert on DLQ depth.")
    score = score_answer(DLQ, terse)
    assert not score.keyword_list
    assert score.coverage == score.raw_coverage


def test_an_answer_written_as_full_sentence_bullets_is_not_a_keyword_list() -> None:
    bullets = ("- The consumer parks a poison message in the DLQ so the partition keeps moving.\n"
               "- Timeouts are retried with exponential backoff before giving up.\n"
               "- When the database is down we pause consumption instead.\n"
               "- The DLQ needs an alert and an owner who reads it.")
    score = score_answer(DLQ, bullets)
    assert not score.keyword_list
    assert score.matched_ids == ("parks", "backoff", "pause-on-outage", "alert-owner")


def test_scoring_is_deterministic() -> None:
    text = "We retry with backoff and park poison messages in the dead letter topic."
    assert score_answer(DLQ, text) == score_answer(DLQ, text)


def test_telegraphic_fragments_of_four_or_five_words_are_a_keyword_list() -> None:
    notes = ("outbox row same transaction, relay polls then marks sent, consumer dedups by "
             "event id, retries with exponential backoff")
    assert score_answer(DLQ, notes).shape.looks_like_keyword_list
    sentences = ("It writes the row in one transaction, the relay polls it, the consumer "
                 "dedups it by the id, and it retries with a backoff.")
    assert not score_answer(DLQ, sentences).shape.looks_like_keyword_list
