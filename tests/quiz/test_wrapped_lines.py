"""Round 14: a hard-wrapped line goes on (a claim split over two lines is one claim), and the
false contradictions that joining the lines exposed (dojo.content.tokens, cues, polarity)."""

from __future__ import annotations

from pathlib import Path

from dojo.content import Card, KeyPoint
from dojo.content.cues import parse_cue
from dojo.content.models import Misconception
from dojo.content.tokens import tokenize
from dojo.quiz.scoring import Verdict, score_answer


def card(text: str, *cues: str, mistakes: tuple[str, ...] = ()) -> Card:
    point = KeyPoint("p", text, (), 1, tuple(parse_cue(cue, {}) for cue in cues))
    mis = tuple(Misconception("p", "The claim", (parse_cue(says, {}),), (), 1)
                for says in mistakes)
    return Card("t", "followup", "q?", "a", "", (point,), "lesson", Path("cards.yaml"), 1,
                mis)


def verdict(card_: Card, answer: str) -> Verdict:
    return score_answer(card_, answer).result("p").verdict


def sentences(text: str) -> set[int]:
    return {token.sentence for token in tokenize(text)}


def test_a_wrapped_line_is_one_sentence() -> None:
    assert len(sentences("SimpleDateFormat is\nthread-safe under load")) == 1
    assert len(sentences("It is not safe.\nUse a DateTimeFormatter")) == 2
    assert len(sentences("First paragraph\n\nSecond paragraph")) == 2
    assert len(sentences("Two steps:\n- mark it\n- send it")) == 3


def test_a_misconception_split_over_a_wrapped_line_is_caught() -> None:
    mistaken = card("SimpleDateFormat is not thread-safe", "simpledateformat + not thread safe",
                    mistakes=("simpledateformat > is > thread safe",))
    assert verdict(mistaken, "The SimpleDateFormat is\nthread-safe, so sharing it is fine."
                   ) is Verdict.CONTRADICTED


def test_a_phrase_does_not_run_over_a_colon_or_a_sentence_end() -> None:
    outage = card("A dependency outage is not what a DLQ is for", "outage + dlq",
                  mistakes=("dlq > is for > outage*",))
    assert verdict(outage, "Those messages never belonged in the DLQ. Ordering is broken: "
                   "events for an account that arrived after the outage sat in the DLQ."
                   ) is not Verdict.CONTRADICTED
    assert verdict(outage, "The DLQ is for outages.") is Verdict.CONTRADICTED


def test_the_sentence_holding_most_of_a_match_decides_its_polarity() -> None:
    offsets = card("The consumer commits its own offset", "consumer + commit* + offset")
    assert verdict(offsets, "Brokers have no notion of a failed delivery for consumer groups. "
                   "They only store the offset you commit.") is Verdict.MADE


def test_a_statement_after_its_semicolon_says_what_the_other_way_costs() -> None:
    layers = card("Only one layer retries; retries at every layer multiply the load",
                  "@retry + multipl* | amplif*")
    assert verdict(layers, "The retries fail fast instead of multiplying load."
                   ) is not Verdict.CONTRADICTED


def test_a_denied_repetition_is_no_denial_of_the_step() -> None:
    money = card("The key is stored in the same transaction as the money movement",
                 "same transaction | together + money")
    assert verdict(money, "It stores the key together with the result and returns the saved "
                   "result instead of moving the money a second time.") is not Verdict.CONTRADICTED


def test_without_followed_by_a_need_requires_the_thing() -> None:
    hints = card("What needs reflection is recorded as hints in the metadata",
                 "hints + metadata")
    assert verdict(hints, "Spring records the hints in the metadata. Libraries without "
                   "metadata need hints of their own.") is Verdict.MADE
