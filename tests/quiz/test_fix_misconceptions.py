"""A spot-the-mistake card's "Fix: …" misconception is a wrong fix: it counts only where the
answer turns to the fix (dojo.quiz.scoring._fix_from), since before that the answer restates
the mistake in the same words; a cue that opens with `@fix` finds its own fix."""

from __future__ import annotations

from pathlib import Path

from dojo.content import Card, KeyPoint
from dojo.content.cues import BUILTIN_TERMS, parse_cue
from dojo.content.models import Misconception
from dojo.quiz.scoring import Verdict, score_answer

QUESTION = "Spot the mistake: the provider is called inside the database transaction."


def spot_card(mis_text: str, says: str, kind: str = "spot-the-mistake") -> Card:
    names = KeyPoint("names", "Names the mistake: the provider call runs inside the transaction",
                     (), 1, (parse_cue("provider + inside + transaction", {}),))
    fix = KeyPoint("fix", "Fix: two short transactions with the call between them", (), 1,
                   (parse_cue("two + transactions", {}),))
    mis = Misconception("fix", mis_text, (parse_cue(says, {}),), (), 1)
    return Card("t", kind, QUESTION, "a", "", (names, fix), "lesson", Path("cards.yaml"), 1,
                (mis,))


WRONG_FIX = "Fix: call the provider inside the same transaction"
SAYS = "provider > inside > same transaction"


def test_a_wrong_fix_counts_once_the_answer_turns_to_the_fix() -> None:
    card = spot_card(WRONG_FIX, SAYS)
    answer = ("It holds the lock for seconds. The fix: two transactions, and call the "
              "provider inside the same transaction as the credit.")
    assert score_answer(card, answer).result("fix").verdict is Verdict.CONTRADICTED


def test_the_mistake_restated_before_the_fix_is_no_wrong_fix() -> None:
    card = spot_card(WRONG_FIX, SAYS)
    answer = ("They call the provider inside the same transaction, so the lock is held. "
              "The fix: two transactions with the call between them.")
    result = score_answer(card, answer).result("fix")
    assert result.verdict is Verdict.MADE


def test_an_answer_without_a_fix_sentence_is_read_whole() -> None:
    card = spot_card(WRONG_FIX, SAYS)
    answer = ("Use two transactions, and then call the provider inside the same transaction "
              "as the credit.")
    assert score_answer(card, answer).result("fix").verdict is Verdict.CONTRADICTED


def test_a_sentence_opening_with_instead_of_turns_to_the_fix() -> None:
    card = spot_card(WRONG_FIX, SAYS)
    answer = ("They call the provider inside the same transaction, so the lock is held. "
              "Instead of that, use two transactions with the call between them.")
    assert score_answer(card, answer).result("fix").verdict is Verdict.MADE


def test_only_fix_misconceptions_of_spot_cards_wait_for_the_fix() -> None:
    answer = ("They call the provider inside the same transaction, so the lock is held. "
              "The fix: two transactions with the call between them.")
    plain = spot_card("Call the provider inside the same transaction", SAYS)
    assert score_answer(plain, answer).result("fix").verdict is Verdict.CONTRADICTED
    followup = spot_card(WRONG_FIX, SAYS, kind="followup")
    assert score_answer(followup, answer).result("fix").verdict is Verdict.CONTRADICTED


def test_a_cue_that_opens_with_the_fix_finds_its_own_fix() -> None:
    card = spot_card("Fix: keep the call in the transaction",
                     "@fix > keep > call | provider > in | inside > transaction")
    answer = ("Two transactions sound nice, but the right move is to keep the provider call "
              "inside the transaction. The fix for the lock: a shorter timeout.")
    assert score_answer(card, answer).result("fix").verdict is Verdict.CONTRADICTED
    restated = ("They keep the provider call inside the transaction, so the lock is held. "
                "The fix: two transactions.")
    assert score_answer(card, restated).result("fix").verdict is Verdict.MADE


def test_the_fix_term_names_what_opens_a_fix() -> None:
    for phrase in ("fix", "instead", "better", "should", "right move", "i would"):
        assert phrase in BUILTIN_TERMS["fix"]
