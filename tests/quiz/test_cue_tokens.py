"""How an answer is cut into words, clauses and sentences before cues look at it."""

from __future__ import annotations

from dojo.content.cues import match_cue, parse_cue
from dojo.content.tokens import tokenize
from dojo.content.typos import repair_typos


def one_sentence(cue: str, text: str) -> bool:
    """Whether `cue`, limited to one sentence (as misconceptions are), matches `text`."""
    return match_cue(parse_cue(cue, {}, sentences=1), tokenize(text)) is not None


def test_a_dotted_name_or_a_decimal_ends_no_sentence() -> None:
    assert one_sentence("boot + read* + every auto configuration",
                        "Boot reads spring.factories for every auto-configuration.")
    assert one_sentence("consumer + kicked out",
                        "The consumer waits past max.poll.interval.ms and gets kicked out.")
    assert one_sentence("ratio + half", "A ratio of 0.5 means half of the calls failed.")
    assert one_sentence("module + open* + reflection",
                        "The module com.acme.fx opens the package for reflection.")
    assert one_sentence("handler + dlt + automatically",
                        "The handler sends failures to a .DLT automatically.")
    # A full stop followed by a space still ends the sentence.
    assert not one_sentence("boot + every auto configuration",
                            "Boot reads it. Then every auto-configuration loads.")
    assert not one_sentence("handler + dlt", "The handler retries. DLT topics come later.")


def test_a_dotted_name_is_one_phrase_of_its_parts_and_a_decimal_one_word() -> None:
    tokens = tokenize("set max.poll.interval.ms to 0.5 of it, e.g. here")
    assert [t.word for t in tokens] == ["set", "max", "poll", "interval", "ms", "to", "0.5",
                                        "of", "it", "here"]
    assert len({t.sentence for t in tokens}) == 1
    assert match_cue(parse_cue("max poll interval", {}), tokens) is not None
    assert match_cue(parse_cue("spring.factories", {}),
                     tokenize("listed in spring factories")) is not None


def repaired(text: str, *card_words: str) -> list[str]:
    return [t.word for t in repair_typos(tokenize(text), frozenset(card_words))]


def test_an_english_word_is_never_bent_onto_a_card_word() -> None:
    assert repaired("a block, blocking, grows, the trade-off, the broker",
                    "lock", "locking", "rows", "trace", "broken") \
        == ["block", "blocking", "grows", "trade", "off", "broker"]


def test_a_repair_that_only_adds_or_drops_a_prefix_is_no_repair() -> None:
    # Neither word is in the English list, but de- and im- change the meaning.
    assert repaired("we deduplicate them", "duplicate") == ["we", "deduplicate", "them"]
    assert repaired("unretryable", "retryable") == ["unretryable"]


def test_misspelt_card_words_are_still_repaired_and_s_z_spellings_joined() -> None:
    assert repaired("an idempotnet consumr with exponentail backoff",
                    "idempotent", "consumer", "exponential") \
        == ["idempotent", "consumer", "with", "exponential", "backoff"]
    assert repaired("lazy initialization", "initialisation") == ["lazy", "initialisation"]


def test_nobody_or_nothing_in_a_cue_is_that_word_not_any_negator() -> None:
    cue = parse_cue("alert + nobody | nothing", {})
    assert match_cue(cue, tokenize("without an alert nobody notices")) is not None
    assert match_cue(cue, tokenize("we do not alert anyone")) is None
    assert match_cue(cue, tokenize("there is no alert here")) is None
    # `not` in a cue still stands for any negator, "nobody" among them.
    assert match_cue(parse_cue("not notice", {}), tokenize("nobody notices")) is not None


def test_an_irregular_verb_form_stems_like_its_base() -> None:
    assert match_cue(parse_cue("order + break*", {}), tokenize("The DLQ broke the order.")) \
        is not None
    assert match_cue(parse_cue("message + lose", {}), tokenize("The message was lost.")) \
        is not None
    assert match_cue(parse_cue("offset + send", {}), tokenize("The offset is sent.")) \
        is not None
