"""A critique word protects only the claim it criticises (dojo.content.critique), and a
question, or an echo of the card's question, claims nothing."""

from __future__ import annotations

from pathlib import Path

from dojo.content import Card, KeyPoint
from dojo.content.critique import criticised
from dojo.content.cues import match_cue, parse_cue
from dojo.content.models import Misconception
from dojo.content.tokens import tokenize
from dojo.quiz.scoring import Verdict, score_answer


def critique(cue: str, text: str) -> bool:
    tokens = tokenize(text)
    match = match_cue(parse_cue(cue, {}), tokens)
    assert match is not None, (cue, text)
    return criticised(tokens, match)


def test_a_critique_word_elsewhere_in_the_sentence_protects_nothing() -> None:
    assert not critique("start* read* code",
                        "I started reading the code to find the bug.")
    assert not critique("read committed + prevent*",
                        "READ COMMITTED prevents lost updates.")
    assert not critique("offset + commit*", "The offset is committed and nothing is lost.")


def test_the_claim_a_critique_word_criticises_is_protected() -> None:
    assert critique("retry + forever", "Retrying forever is the classic mistake.")
    assert critique("retry + forever", "The mistake is to retry forever.")
    assert critique("commit* + first", "Committing first loses the message.")
    assert critique("commit* + first", "We lose the message if we commit first.")
    assert critique("mark* + first", "The relay marks first, which is a bug.")
    assert critique("mark* + first", "The relay marks first. That is a mistake.")
    assert critique("retry + forever", "Pitfalls: retry forever, no alert.")


def test_a_denied_or_averted_critique_word_criticises_nothing() -> None:
    assert not critique("mark* + first", "The relay marks first, which is not a problem.")
    assert not critique("mark* + first", "The relay marks first, which avoids a stall.")


def card_with_misconception(question: str) -> Card:
    point = KeyPoint("p", "The outbox stays; the marker table is a separate concern", (), 1,
                     (parse_cue("outbox + stay*", {}),))
    mis = Misconception("p", "The outbox replaces the marker table",
                        (parse_cue("replac* + marker table", {}),), (), 1)
    return Card("t", "followup", question, "a", "", (point,), "lesson", Path("cards.yaml"), 1,
                (mis,))


def test_a_question_claims_nothing_unless_answered_yes() -> None:
    card = card_with_misconception("What does the outbox do?")
    asked = score_answer(card, "Does it replace the marker table? No. The outbox stays.")
    assert asked.result("p").verdict is Verdict.MADE
    answered = score_answer(card, "Does it replace the marker table? Yes. The outbox stays.")
    assert answered.result("p").verdict is Verdict.CONTRADICTED


def test_an_echo_of_the_cards_question_claims_nothing() -> None:
    question = "A teammate says the new outbox replaces the marker table entirely. Is that right?"
    card = card_with_misconception(question)
    echo = ("The teammate says the new outbox replaces the marker table entirely. "
            "It does not; the outbox stays.")
    assert score_answer(card, echo).result("p").verdict is Verdict.MADE
    claim = "The outbox replaces the marker table, so the outbox stays."
    assert score_answer(card, claim).result("p").verdict is Verdict.CONTRADICTED
