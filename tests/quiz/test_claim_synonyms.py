"""A misconception's cue words stand for their claim synonyms (dojo.content.synonyms): the
rival claim said with another verb ("lets" for "allows") is still the rival claim, while the
same words negated, or a point's own cue, are not widened."""

from __future__ import annotations

from pathlib import Path

from dojo.content import Card, KeyPoint
from dojo.content.cues import parse_cue
from dojo.content.models import Misconception
from dojo.content.synonyms import widened
from dojo.quiz.scoring import Verdict, score_answer

QUESTION = "Two beans get the same name. What happens?"


def naming_card() -> Card:
    fails = KeyPoint("fails", "Boot disables overriding: startup fails", (), 1,
                     (parse_cue("startup | start* + fail*", {}),))
    other = KeyPoint("explicit", "Give one an explicit name", (), 1,
                     (parse_cue("explicit + name", {}),))
    mis = Misconception("fails", "Spring Boot allows bean definition overriding by default",
                        (parse_cue("boot > allow* > overrid* > by default", {}, sentences=1),),
                        (), 1)
    return Card("t", "followup", QUESTION, "a", "", (fails, other), "lesson",
                Path("cards.yaml"), 1, (mis,))


def test_the_rival_claim_with_a_synonym_verb_is_flagged() -> None:
    answer = ("Spring Boot lets the later definition override the earlier one by default. "
              "Give one an explicit name.")
    result = score_answer(naming_card(), answer).result("fails")
    assert result.verdict is Verdict.CONTRADICTED


def test_its_correct_twin_is_not_flagged() -> None:
    answer = ("Spring Boot no longer lets one definition override another by default, so "
              "startup fails. Give one an explicit name.")
    score = score_answer(naming_card(), answer)
    assert score.result("fails").verdict is Verdict.MADE
    assert score.percent == 100


def test_widening_replaces_one_word_at_a_time_and_keeps_the_cue_as_written() -> None:
    cue = parse_cue("allow* > overrid*", {})
    ideas = widened(cue).ideas
    first = {" ".join(word.text for word in phrase) for phrase in ideas[0].phrases}
    assert first == {"allow", "let", "enable"}
    assert {" ".join(w.text for w in p) for p in ideas[1].phrases} >= {"overrid", "replace"}


def test_a_word_with_no_group_is_left_alone() -> None:
    cue = parse_cue("offset + key", {})
    assert widened(cue).ideas == cue.ideas


def timeout_card(says: str) -> Card:
    bound = KeyPoint("bound", "A client timeout bounds every call", (), 1,
                     (parse_cue("timeout + bound* | every call", {}),))
    mis = Misconception("bound", "No client timeout is needed", (parse_cue(says, {}, sentences=1),),
                        (), 1)
    return Card("t", "followup", "Why a timeout?", "a", "", (bound,), "lesson",
                Path("cards.yaml"), 1, (mis,))


def test_the_unneeded_term_flags_a_step_waved_away() -> None:
    card = timeout_card("@unneeded > client timeout | timeout")
    answer = "The breaker cuts slow calls off, so there is no need for a client timeout."
    assert score_answer(card, answer).result("bound").verdict is Verdict.CONTRADICTED


def test_the_unneeded_term_leaves_the_requirement_alone() -> None:
    card = timeout_card("@unneeded > client timeout | timeout")
    answer = "The breaker cannot stop a waiting call, so a client timeout bounds every call."
    assert score_answer(card, answer).result("bound").verdict is Verdict.MADE


def test_the_fine_term_flags_a_risk_called_harmless_but_not_one_called_a_risk() -> None:
    card = timeout_card("no timeout | without a timeout + @fine")
    assert score_answer(card, "Running without a timeout is not a problem here.").result(
        "bound").verdict is Verdict.CONTRADICTED
    assert score_answer(card, "Running without a timeout is the problem: a timeout bounds "
                        "every call.").result("bound").verdict is Verdict.MADE
