"""A point whose statement puts one step before another is contradicted by an answer that
puts the same two steps the other way round (dojo.content.order)."""

from __future__ import annotations

from pathlib import Path

from dojo.content import Card, KeyPoint
from dojo.content.cues import occurrences, parse_cue
from dojo.content.order import sequence
from dojo.content.tokens import tokenize
from dojo.quiz.scoring import Verdict, score_answer


def card(text: str, *cues: str) -> Card:
    point = KeyPoint("p", text, (), 1, tuple(parse_cue(cue, {}) for cue in cues))
    return Card("t", "followup", "q?", "a", "", (point,), "lesson", Path("cards.yaml"), 1)


def verdict(card_: Card, answer: str) -> Verdict:
    return score_answer(card_, answer).result("p").verdict


SEND_THEN_MARK = card("The right order: send the record, wait for the acknowledgement, then "
                      "mark the row", "send* > ack* > mark*", "send* + mark* + row")
OFFSET_AFTER_DB = card("Commit the offset only after the database transaction commits",
                       "offset + database | db")


def test_the_steps_the_other_way_round_contradict_the_point() -> None:
    result = score_answer(SEND_THEN_MARK, "We mark the row published, then send the record.")
    assert result.result("p").verdict is Verdict.CONTRADICTED
    assert result.result("p").because == "the steps in the opposite order"
    assert verdict(OFFSET_AFTER_DB, "We commit the offset, then write to the database.") \
        is Verdict.CONTRADICTED
    assert verdict(OFFSET_AFTER_DB, "Commit the offset before the database write.") \
        is Verdict.CONTRADICTED


def test_the_same_order_in_other_words_makes_the_point() -> None:
    assert verdict(SEND_THEN_MARK, "Send the record and mark the row only after the ack.") \
        is Verdict.MADE
    assert verdict(OFFSET_AFTER_DB, "After the database commit, we commit the offset.") \
        is Verdict.MADE
    assert verdict(OFFSET_AFTER_DB, "We commit the offset after the database commit.") \
        is Verdict.MADE
    assert verdict(OFFSET_AFTER_DB, "Write the database first, then commit the offset.") \
        is Verdict.MADE


def test_an_imagined_case_or_a_contrast_is_no_reversed_claim() -> None:
    assert verdict(SEND_THEN_MARK, "If the relay marks the row, then sends the record, a crash "
                                   "loses it. So: send, wait for the ack, then mark the row.") \
        is Verdict.MADE
    assert verdict(SEND_THEN_MARK, "Marking the row, then sending, loses events; send the "
                                   "record, wait for the ack, then mark the row.") \
        is Verdict.MADE


def test_an_order_word_orders_only_the_step_it_leads() -> None:
    tokens = tokenize("Postgres detects it after deadlock_timeout and aborts one transaction.")
    detects = occurrences(parse_cue("detect* + abort*", {}).ideas[0], tokens)[0]
    aborts = occurrences(parse_cue("detect* + abort*", {}).ideas[1], tokens)[0]
    assert sequence(tokens, detects, aborts) == 0
    tokens = tokenize("Mark the row, then send the record.")
    mark, send = (occurrences(parse_cue(f"{w} + x", {}).ideas[0], tokens)[0]
                  for w in ("mark*", "send*"))
    assert sequence(tokens, mark, send) == 1


def test_an_order_word_in_another_clause_does_not_lead_the_step() -> None:
    tokens = tokenize("Postgres detects the cycle after deadlock_timeout, one second.")
    cue = parse_cue("detect* + one", {})
    detects, one = occurrences(cue.ideas[0], tokens)[0], occurrences(cue.ideas[1], tokens)[0]
    assert sequence(tokens, detects, one) == 0
