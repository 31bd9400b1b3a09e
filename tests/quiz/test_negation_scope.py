"""What a negator governs: its own verb or noun phrase, each conjunct its own polarity, and a
point's match over several clauses taking the polarity of the clause that makes the claim."""

from __future__ import annotations

from dojo.content.cues import match_cue, parse_cue
from dojo.content.tokens import tokenize


def polarity(cue: str, text: str, by_clause: bool = False) -> str | None:
    found = match_cue(parse_cue(cue, {}), tokenize(text), by_clause)
    return None if found is None else "negated" if found.negated else "affirmed"


def test_a_noun_phrase_negator_governs_its_noun_phrase_only() -> None:
    assert polarity("retries + reorder", "Retries without idempotence can reorder batches.") \
        == "affirmed"
    assert polarity("retries + reorder", "Without idempotence, retries reorder batches.") \
        == "affirmed"
    assert polarity("idempotence", "Retries without idempotence can reorder batches.") \
        == "negated"
    # A gerund makes it a verb phrase: everything it says is denied.
    assert polarity("wait + commit", "We publish without waiting for the commit.") == "negated"
    assert polarity("retries + reorder", "Retries do not reorder batches.") == "negated"


def test_the_object_of_a_later_preposition_is_a_referent_not_what_is_denied() -> None:
    text = "The module does not open the package to the unnamed module."
    assert polarity("unnamed module", text) == "affirmed"
    assert polarity("open + package", text) == "negated"
    # The preposition itself is denied, and one right after the verb is what is denied.
    assert polarity("inside transaction", "Don't call the provider inside the transaction.") \
        == "negated"
    assert polarity("same transaction", "We don't write it in the same transaction.") \
        == "negated"


def test_each_conjunct_carries_its_own_polarity() -> None:
    text = "The send isn't enlisted and doesn't un-send anything."
    assert polarity("un send", text) == "negated"
    assert polarity("enlisted", text) == "negated"
    assert polarity("replay*", "The record isn't lost and is replayed later.") == "affirmed"
    assert polarity("replay*", "The record isn't lost or replayed.") == "negated"


def test_a_denied_without_states_a_requirement() -> None:
    assert polarity("publish + outbox", "You can't publish safely without the outbox.") \
        == "affirmed"
    assert polarity("alert + notice", "Without an alert, nobody notices.") == "affirmed"
    assert polarity("publish + outbox", "We publish without the outbox.") == "negated"


def test_not_yet_and_not_until_say_when_not_whether() -> None:
    assert polarity("credit + target", "We neither credit the target nor refund it yet.") \
        == "affirmed"
    assert polarity("commit offset + write",
                    "We don't commit the offset until the DB write is done.") == "affirmed"
    assert polarity("credit + target", "We do not credit the target, yet it works.") \
        == "negated"


def test_a_point_over_several_clauses_takes_the_polarity_of_its_claim() -> None:
    because = ("Don't call the provider inside the transaction because it holds a pooled "
               "connection.")
    assert polarity("provider + hold + connection", because, by_clause=True) == "affirmed"
    assert polarity("provider + hold + connection",
                    "Call the provider inside the transaction, because it does not hold a "
                    "connection.", by_clause=True) == "negated"
    # On a tie the later clause decides, unless an idea is denied directly.
    assert polarity("permanent + at once",
                    "Never retry a permanent error: it goes to the DLQ at once.",
                    by_clause=True) == "affirmed"
    assert polarity("need + consum*",
                    "We do not need that, since the event is consumed once.",
                    by_clause=True) == "negated"
    # A misconception keeps the strict rule: any negated idea blocks it.
    assert polarity("provider + hold + connection", because) == "negated"


def test_no_need_to_denies_the_verb_phrase_it_carries() -> None:
    assert polarity("configure + dead letter queue",
                    "There's no need to configure a dead letter queue.") == "negated"
    assert polarity("retry + permanent", "There is no reason to retry a permanent error.") \
        == "negated"
    assert polarity("retries + reorder", "With no idempotence, retries reorder batches.") \
        == "affirmed"
