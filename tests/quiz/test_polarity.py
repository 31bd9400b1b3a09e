"""Saying the opposite of a point without a misconception written for it: direct denials and
antonym swaps, derived from the point's own cues and statement (dojo.content.polarity)."""

from __future__ import annotations

from pathlib import Path

from dojo.content import Card, KeyPoint
from dojo.content.critique import criticised
from dojo.content.cues import match_cue, parse_cue
from dojo.content.tokens import tokenize
from dojo.content.typos import repair_typos
from dojo.quiz.scoring import Verdict, score_answer


def card(text: str, *cues: str, kind: str = "followup") -> Card:
    """A card with one essential: `text` is its statement, `cues` its `says`."""
    point = KeyPoint("p", text, (), 1, tuple(parse_cue(cue, {}) for cue in cues))
    return Card("t", kind, "q?", "a", "", (point,), "lesson", Path("cards.yaml"), 1)


def verdict(card_: Card, answer: str) -> Verdict:
    return score_answer(card_, answer).result("p").verdict


REPLAY = card("Replay into an idempotent consumer, so duplicates do no harm",
              "replay + idempotent | dedup*", "replay + already processed")


def test_a_direct_denial_wins_over_the_point_made_elsewhere() -> None:
    answer = ("We replay what was already processed. Replay has to be safe, which means the "
              "consumer does not need to be idempotent.")
    result = score_answer(REPLAY, answer).result("p")
    assert result.verdict is Verdict.CONTRADICTED and result.because == "negated"
    assert verdict(REPLAY, "We replay what was already processed.") is Verdict.MADE


def test_a_denial_inside_a_condition_or_a_criticism_is_no_claim() -> None:
    made = "We replay into an idempotent consumer. "
    assert verdict(REPLAY, made + "If the consumer is not idempotent, a replay pays twice.") \
        is Verdict.MADE
    assert verdict(REPLAY, made + "Replaying without idempotency is the classic mistake.") \
        is Verdict.MADE


def test_the_same_sentence_making_the_point_keeps_it() -> None:
    retry = card("Transient failures get retries with backoff", "retry + backoff")
    assert verdict(retry, "We don't retry validation errors; transient ones get retries "
                          "with backoff.") is Verdict.MADE


def test_denying_a_consequence_the_point_avoids_agrees_with_it() -> None:
    deser = card("An ErrorHandlingDeserializer keeps a bad record from pinning the consumer",
                 "errorhandlingdeserializer", "deserializ* + stuck | pin* | loop*")
    # "loop" is not in the statement, "pinning" is what the statement says must not happen.
    assert verdict(deser, "Use ErrorHandlingDeserializer so a bad payload does not loop "
                          "forever in deserialization.") is Verdict.MADE
    assert verdict(deser, "Use ErrorHandlingDeserializer: deserialization errors do not pin "
                          "the consumer.") is Verdict.MADE


def test_optional_denies_across_but_it_and_not_optional_affirms() -> None:
    timeout = card("The timeout bounds a single call", "timeout + bound* | limit* | single")
    assert verdict(timeout, "Every single call has a timeout. Innermost is the timeout, but "
                            "it is optional: calls may run past any limit.") \
        is Verdict.CONTRADICTED
    assert verdict(timeout, "The timeout is not optional: it limits every single call.") \
        is Verdict.MADE


def test_an_antonym_next_to_the_claim_contradicts_even_when_the_point_is_made() -> None:
    slow = card("The slow-call threshold goes just below the client's read timeout and above "
                "the normal p99", "slow + below | under | lower than + timeout",
                "slow + p99 | percentile")
    result = score_answer(slow, "The slow threshold sits above p99 and above my own "
                                "timeout.").result("p")
    assert result.verdict is Verdict.CONTRADICTED
    assert result.because == "“above” where the point says “below”"
    # The relation said the right way in the same sentence, or asked about, is no swap.
    assert verdict(slow, "The slow threshold sits above p99 and below my timeout.") \
        is Verdict.MADE
    assert verdict(slow, "Slow calls, how long above p99? Ask the timeout owners. The "
                         "slow threshold follows p99.") is Verdict.MADE


def test_a_swap_far_from_the_rest_of_the_claim_or_among_nouns_is_no_swap() -> None:
    outer = card("The retry is outermost, so every attempt passes through the breaker",
                 "retry | attempts + outer* | outside | around")
    assert verdict(outer, "Retry sits outside everything. Attempts times timeout plus "
                          "backoff must fit inside the caller's budget.") is Verdict.MADE
    example = card("A withdrawal processed before the deposit it depended on",
                   "withdraw* + deposit* | credit* | before | depend*")
    assert verdict(example, "A withdrawal runs before its deposit, and on replay the deposit "
                            "lands after the withdrawal.") is Verdict.MADE


def test_a_swap_of_a_word_the_statement_does_not_say_is_no_swap() -> None:
    # A cue naming both sides contrasts them; the statement never says "transient".
    question = card("Ask whether the same message could succeed later",
                    "transient | temporary + permanent | malformed")
    assert verdict(question, "Permanent errors like malformed JSON go to the DLQ.") \
        is Verdict.MISSED
    assert verdict(question, "Temporary errors get retries, permanent ones go to the DLQ.") \
        is Verdict.MADE


def test_on_a_spot_card_a_fix_point_is_contradicted_only_in_the_fix() -> None:
    def spot(answer: str) -> Verdict:
        point = KeyPoint("p", "Fix: pass the provider's idempotency key on every retry", (), 1,
                         (parse_cue("idempotency key + @retry | provider", {}),))
        mistake = KeyPoint("m", "The retry repeats the call without an idempotency key", (),
                           2, (parse_cue("@retry + without idempotency key", {}),))
        card_ = Card("t", "spot-the-mistake", "q?", "a", "", (point, mistake), "lesson",
                     Path("cards.yaml"), 1)
        return score_answer(card_, answer).result("p").verdict

    mistake = "The provider call is retried without an idempotency key. "
    assert spot(mistake + "The fix: send the provider an idempotency key.") is Verdict.MADE
    assert spot(mistake + "Better: call the provider once more, without an idempotency key, "
                          "and send the key on a later retry to the provider.") \
        is Verdict.CONTRADICTED


def test_spot_the_mistake_answers_restate_the_mistake_without_contradicting() -> None:
    spot = card("Replay into an idempotent consumer", "replay + idempotent",
                "replay + already processed", kind="spot-the-mistake")
    answer = ("We replay what was already processed, and the consumer does not need to be "
              "idempotent: that is what the code does.")
    assert verdict(spot, answer) is Verdict.MADE


def test_stop_before_a_gerund_is_a_cue_not_but_stop_alone_is_a_word() -> None:
    def found(cue: str, text: str) -> bool | None:
        match = match_cue(parse_cue(cue, {}), tokenize(text))
        return None if match is None else not match.negated

    assert found("dlq + not block", "a DLQ means poison messages stop blocking the flow")
    assert found("stop + consum*", "on open we stop consuming") is True
    assert found("pause + consum*", "we pause, then stop consuming") is True


def test_a_denied_critique_word_is_no_criticism() -> None:
    tokens = tokenize("Lag grows, and that is not a problem.")
    match = match_cue(parse_cue("lag + grow*", {}), tokens)
    assert match is not None and not criticised(tokens, match)
    tokens = tokenize("Lag grows, and that is the problem.")
    match = match_cue(parse_cue("lag + grow*", {}), tokens)
    assert match is not None and criticised(tokens, match)


def test_a_form_of_a_card_word_is_no_typo_of_another() -> None:
    words = frozenset({"pause", "parsing"})
    tokens = repair_typos(tokenize("dead-letter instead of pausing"), words)
    assert [t.word for t in tokens][-1] == "pausing"
    assert [t.word for t in repair_typos(tokenize("a parsng error"), words)][-2] == "parsing"


def test_a_contrast_elsewhere_or_a_counterfactual_is_no_contradiction() -> None:
    inside = card("A plain listener runs inside the publisher's transaction",
                  "inside | within + transaction + listener", "plain listener + same thread")
    both = ("A plain listener runs inside the publisher's transaction. Putting @Async on the "
            "listener moves it to an executor, outside the transaction.")
    assert verdict(inside, both) is Verdict.MADE
    assert verdict(inside, "A plain listener uses the same thread. It runs outside the "
                           "transaction of the listener's caller.") is Verdict.CONTRADICTED
    assert verdict(REPLAY, "We replay into an idempotent consumer. Without idempotency a "
                           "replay would pay twice.") is Verdict.MADE


def test_without_x_followed_by_a_denied_consequence_requires_x() -> None:
    parked = card("Park a message with its origin and exception, or it cannot be investigated",
                  "origin | exception + park* | dlq",
                  "not origin | not exception + not investigat* | not debug*")
    assert verdict(parked, "A message parked without its origin and exception cannot be "
                           "investigated.") is Verdict.MADE
    assert verdict(parked, "Messages are parked in the DLQ without origin or exception "
                           "headers.") is Verdict.CONTRADICTED


def test_no_reason_to_and_not_a_good_idea_to_deny_directly() -> None:
    pause = card("Pause the consumer while the circuit is open", "open + pause | stop")
    made = "We pause the consumer while the circuit is open. "
    assert verdict(pause, made + "The circuit is open, but that is no reason to pause.") \
        is Verdict.CONTRADICTED


def test_equal_cards_loaded_twice_score_the_same() -> None:
    """The antonym variants are cached by value: a second, equal copy of a card (the catalog
    loaded again) must find the swapped idea by value, not by identity."""
    def slow() -> Card:
        return card("The slow-call threshold goes just below the client's read timeout",
                    "slow + below | under + timeout")

    answer = ("Slow calls are what I watch most closely in production: the threshold sits "
              "above my timeout.")
    assert [verdict(slow(), answer) for _ in range(2)] == [Verdict.CONTRADICTED] * 2


def test_a_denial_under_an_earlier_negator_or_narrowed_to_a_case_is_no_denial() -> None:
    drain = card("More partitions is a planned change: drain first", "partition* + drain*",
                 "add* partitions + plan* | migrat*")
    made = "Adding partitions is a planned migration. "
    assert verdict(drain, made + "Never resize it in place, or add partitions without "
                                 "draining.") is Verdict.MADE
    assert verdict(drain, made + "Then you add partitions without draining.") \
        is Verdict.CONTRADICTED
    session = card("The idempotent producer only removes duplicates within one session",
                   "idempotent producer + session | retries | duplicates")
    assert verdict(session, "The idempotent producer removes duplicates from its retries. "
                            "The idempotent producer does not help across sessions.") \
        is Verdict.MADE
    assert verdict(session, "The idempotent producer removes duplicates from its retries. "
                            "In one session, the idempotent producer does not help.") \
        is Verdict.CONTRADICTED


def test_a_misspelt_negator_is_repaired_and_negates() -> None:
    tokens = repair_typos(tokenize("com.acme.fx is a sibling, nevver scanned"),
                          frozenset({"scanned"}))
    match = match_cue(parse_cue("com acme fx is scanned", {}), tokens)
    assert match is not None and match.negated
    tokens = repair_typos(tokenize("we publish withot the outbox"), frozenset({"outbox"}))
    match = match_cue(parse_cue("publish + outbox", {}), tokens)
    assert match is not None and match.negated


SAME_TX = card("Insert the key in the same transaction as the money movement",
               "same transaction + money | debit")


def test_a_separate_transaction_turns_round_the_same_one() -> None:
    assert verdict(SAME_TX, "The key insert runs in a separate transaction before the money "
                            "movement.") is Verdict.CONTRADICTED
    assert verdict(SAME_TX, "The key insert and the debit run in the same transaction.") \
        is Verdict.MADE


def test_a_swap_far_from_the_right_claim_still_contradicts_it() -> None:
    right = "The key and the debit commit in the same transaction. "
    filler = "Keys expire after a day. Clients reuse a key on retry. "
    wrong = "The key insert runs in a separate transaction before the money movement."
    assert verdict(SAME_TX, right + filler + wrong) is Verdict.CONTRADICTED
    # right next to each other, the two are a contrast of two cases
    assert verdict(SAME_TX, "The audit row goes in a separate transaction from the money "
                            "movement; the key goes in the same transaction as the debit.") \
        is Verdict.MADE
