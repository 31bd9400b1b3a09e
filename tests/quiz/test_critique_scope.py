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


def card_with(says: str) -> Card:
    point = KeyPoint("p", "The main class sits in the root package", (), 1,
                     (parse_cue("main class + root package", {}),))
    mis = Misconception("p", "The claim", (parse_cue(says, {}),), (), 1)
    return Card("t", "followup", "q?", "a", "", (point,), "lesson", Path("cards.yaml"), 1,
                (mis,))


def verdict(says: str, answer: str) -> Verdict:
    return score_answer(card_with(says), answer).result("p").verdict


def test_a_misconception_lies_in_one_claim() -> None:
    says = "default scan > covers | reaches > com acme wallet"
    assert verdict(says, "The default scan covers com.acme.wallet.") is Verdict.CONTRADICTED
    # A semicolon starts another claim.
    assert verdict(says, "The default scan would only cover boot; it belongs in "
                         "com.acme.wallet.") is Verdict.MISSED
    # Six clause breaks apart is no one claim either.
    spread = ("@Transactional works through a proxy, and warmUp calls refresh, so the proxy is "
              "bypassed, which matters, and during @PostConstruct it is missing.")
    assert verdict("transactional > works > during > postconstruct", spread) is Verdict.MISSED
    assert verdict("transactional > works > during > postconstruct",
                   "@Transactional works fine during @PostConstruct.") is Verdict.CONTRADICTED


def test_a_setting_switched_off_denies_its_name() -> None:
    says = "turn on open in view"
    assert verdict(says, "Turning on spring.jpa.open-in-view=false helps.") is Verdict.MISSED
    assert verdict(says, "Turning on spring.jpa.open-in-view helps.") is Verdict.CONTRADICTED
    tokens = tokenize("open-in-view=false")
    match = match_cue(parse_cue("open in view + false", {}), tokens)
    assert match is not None and not match.negated


def test_a_judgement_before_a_colon_covers_what_follows() -> None:
    assert critique("scan* far too", "Scanning com is a bad idea: it scans far too much.")
    assert not critique("scan* far too", "Scanning com is fine and it scans far too much.")


def test_a_consequence_after_otherwise_argues_for_the_claim() -> None:
    # what happens when the claim is not followed does not criticise the claim
    assert not critique("never + static",
                        "It should never be static, otherwise its class is created too early "
                        "and loses its processing.")
    assert not critique("commit* + after", "Commit after the write, or else you lose it.")
    # a consequence in a plain clause still criticises
    assert critique("commit* + first", "Committing first loses the message.")


def test_a_denial_before_otherwise_is_said_the_other_way_round() -> None:
    point = KeyPoint("p", "A @Bean method returning a BeanFactoryPostProcessor should be static",
                     (), 1, (parse_cue("static + bean method", {}),
                             parse_cue("configuration class + too early", {})))
    card = Card("t", "followup", "q?", "a", "", (point,), "lesson", Path("cards.yaml"), 1)
    denied = ("The @Bean method should never be static, otherwise the configuration class is "
              "created too early and loses its processing.")
    assert score_answer(card, denied).result("p").verdict is Verdict.CONTRADICTED
    made = ("The @Bean method should be static, otherwise the configuration class is created "
            "too early and loses its processing.")
    assert score_answer(card, made).result("p").verdict is Verdict.MADE


def test_a_misconception_supposed_in_an_if_clause_is_no_claim() -> None:
    says = "lock* > in > request order | order of * request"
    # Naming the wrong way inside "if …" to say what it causes claims nothing.
    assert verdict(says, "If you lock them in the order of the request, opposite transfers "
                         "deadlock.") is Verdict.MISSED
    assert verdict(says, "Unless you lock them in request order, nothing deadlocks here.") \
        is Verdict.MISSED
    # Stated as what we do, it is the claim.
    assert verdict(says, "We lock them in the order of the request, source then target.") \
        is Verdict.CONTRADICTED
    # A match that runs on out of the "if" clause into the main clause is still a claim.
    assert verdict("dependency + down > keep consum*",
                   "If the dependency is down, we keep consuming.") is Verdict.CONTRADICTED
    # "when" as often describes what a team does: still a claim.
    assert verdict(says, "When we lock them in the order of the request, it works.") \
        is Verdict.CONTRADICTED


def test_a_bug_once_fixed_is_no_verdict_on_the_claim_after_it() -> None:
    assert not critique("replay + in one go", "Once the bug is fixed we replay the DLQ in one go.")
    assert not critique("replay + in one go",
                        "When the problem is found, we replay the DLQ in one go.")
    # its twin: the judgement word still criticises the claim it leads to
    assert critique("replay + in one go", "The bug is to replay the DLQ in one go.")
    assert critique("replay + in one go", "The mistake here is replaying the DLQ in one go.")
