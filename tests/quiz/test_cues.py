"""The cue language and the scorer's polarity: stems, order, typos, negation, misconceptions."""

from __future__ import annotations

import pytest

from dojo.content import content_root, load_catalog
from dojo.content.cues import match_cue, parse_cue
from dojo.content.tokens import tokenize
from dojo.content.typos import repair_typos
from dojo.quiz.scoring import CONTRADICTION_CAP, Verdict, score_answer

CATALOG = load_catalog(content_root())


def matched(cue: str, text: str) -> bool | None:
    """True: affirmed, False: negated, None: not there."""
    found = match_cue(parse_cue(cue, {}), tokenize(text))
    return None if found is None else not found.negated


def test_stems_and_any_order() -> None:
    assert matched("retry + backoff", "with backoff, we retried it") is True
    assert matched("retry + backoff", "nothing relevant here") is None


def test_ordered_ideas_tell_before_from_after() -> None:
    cue = "commit offset > after > db write"
    assert matched(cue, "we commit the offset after the DB write") is True
    assert matched(cue, "after the DB write we commit the offset") is None


def test_a_negator_in_the_clause_flips_the_match() -> None:
    assert matched("use + skip locked", "never use SKIP LOCKED") is False
    assert matched("use + skip locked", "we don't use SKIP LOCKED here") is False
    assert matched("use + skip locked", "SKIP LOCKED is not needed, we use a queue") is False
    assert matched("use + skip locked", "we use SKIP LOCKED, not a table lock") is True


def test_a_negation_the_cue_asks_for_is_not_a_contradiction() -> None:
    assert matched("dlq + not block", "the DLQ means one message doesn't block the rest") \
        is True
    assert matched("dlq + not block", "the DLQ blocks everything") is None


def test_the_scope_ends_at_the_clause() -> None:
    assert matched("retry + backoff", "It is not permanent, so we retry with backoff") is True


def test_typos_are_repaired_against_the_cards_words_only() -> None:
    words = frozenset({"idempotent", "exponential", "consumer"})
    tokens = repair_typos(tokenize("an idempotnet consumr with exponentail backoff"), words)
    assert [t.word for t in tokens] == ["idempotent", "consumer", "with", "exponential",
                                        "backoff"]
    assert [t.word for t in repair_typos(tokenize("the idea"), words)] == ["idea"]


@pytest.mark.skipif(not CATALOG.has_card("dlq-what"), reason="lesson 01 absent")
def test_a_misconception_zeroes_its_point_and_caps_the_answer() -> None:
    card = CATALOG.card("dlq-what")
    right = ("A DLQ is a side topic where we park poison messages so the partition keeps "
             "moving. Malformed payloads go straight to the DLQ without retries.")
    wrong = ("A DLQ is a side topic where we park poison messages so the partition keeps "
             "moving. We retry every failure a few times before it goes to the DLQ.")
    good = score_answer(card, right)
    bad = score_answer(card, wrong)
    assert good.result("permanent-straight-to-dlq").verdict is Verdict.MADE
    result = bad.result("permanent-straight-to-dlq")
    assert result.verdict is Verdict.CONTRADICTED and "every failure" in result.because
    assert bad.coverage <= CONTRADICTION_CAP < good.coverage


@pytest.mark.skipif(not CATALOG.has_card("dlq-what"), reason="lesson 01 absent")
def test_a_criticised_misconception_does_not_count() -> None:
    card = CATALOG.card("dlq-what")
    text = ("Retrying the message forever is the classic mistake: it stalls the partition. "
            "So we park it in a DLQ and the stream keeps moving.")
    assert not score_answer(card, text).contradicted


@pytest.mark.skipif(not CATALOG.has_card("dlq-what"), reason="lesson 01 absent")
def test_the_checklist_overrides_the_machine_both_ways() -> None:
    card = CATALOG.card("dlq-what")
    score = score_answer(card, "We park poison messages in a DLQ so the partition keeps moving.")
    assert score.matched_ids == ("parks-without-blocking",)
    ticked = score.toggled("idempotent-replay").toggled("parks-without-blocking")
    assert ticked.matched_ids == ("idempotent-replay",) and ticked.confirmed
    assert ticked.result("idempotent-replay").by_learner
    assert ticked.percent == 20


def test_a_qualifier_in_a_phrase_gap_breaks_the_phrase() -> None:
    cue = parse_cue("all exceptions roll back", {})
    assert match_cue(cue, tokenize("All unchecked exceptions roll back.")) is None
    assert match_cue(cue, tokenize("All some exceptions roll back.")) is None
    assert match_cue(cue, tokenize("All the runtime exceptions roll back.")) is not None
    assert match_cue(cue, tokenize("All exceptions roll back.")) is not None
