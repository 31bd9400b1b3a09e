"""score_answer on the repository's own cards: model answers score fully, keyword lists do not.

Every card is checked, whatever lessons exist; the hand-written answers below target a few
headline cards and are skipped while their lesson is not written.
"""

from __future__ import annotations

import re

import pytest

from dojo.content import Card, content_root, load_catalog
from dojo.quiz import score_answer
from dojo.quiz.answer_shape import FUNCTION_WORDS
from dojo.quiz.scoring import KEYWORD_LIST_CAP

CATALOG = load_catalog(content_root())
CARDS = CATALOG.cards


def real_card(card_id: str) -> Card:
    if not CATALOG.has_card(card_id):
        pytest.skip(f"card {card_id} is not written yet")
    return CATALOG.card(card_id)


def keywords_of(text: str) -> str:
    """The answer's own meaningful words, comma-separated, in order: the strongest keyword
    list there is, since patterns see every term in the model's order."""
    words = [word for word in re.findall(r"\w+", text) if word.lower() not in FUNCTION_WORDS]
    return ", ".join(words)


@pytest.mark.parametrize("card", CARDS, ids=[card.id for card in CARDS])
def test_a_model_answer_reads_as_prose(card: Card) -> None:
    assert not score_answer(card, card.answer).keyword_list, card.answer


@pytest.mark.parametrize("card", CARDS, ids=[card.id for card in CARDS])
def test_the_model_answer_turned_into_keywords_is_capped(card: Card) -> None:
    score = score_answer(card, keywords_of(card.answer))
    assert score.keyword_list
    assert score.coverage <= KEYWORD_LIST_CAP


def test_dlq_a_good_answer_in_own_words_covers_most_points() -> None:
    card = real_card("dlq-what")
    good = ("A DLQ is a side topic where the consumer parks messages it cannot process, so the "
            "partition keeps moving and nothing is lost. I classify first: timeouts get a few "
            "retries with exponential backoff, but malformed payloads go straight to the DLQ "
            "without retries, with the original topic, partition, offset, the exception and "
            "the trace id attached. If the downstream database is down I pause the consumer "
            "instead of dead-lettering everything. Kafka has no built-in DLQ, so Spring's "
            "recoverer writes it. The DLQ needs an alert and an owner, and we replay into an "
            "idempotent consumer.")
    score = score_answer(card, good)
    assert score.coverage >= 0.75, [point.id for point in score.missed]


def test_dlq_a_one_line_definition_is_partial() -> None:
    card = real_card("dlq-what")
    score = score_answer(card, "A dead letter queue is where a consumer parks the messages it "
                               "cannot process, so they do not block the stream.")
    assert 0 < score.coverage <= 0.25


def test_dlq_an_empty_answer_scores_nothing() -> None:
    assert score_answer(real_card("dlq-what"), "").coverage == 0.0


def test_dlq_a_keyword_dump_scores_at_most_the_cap() -> None:
    card = real_card("dlq-what")
    dump = ("DLQ, dead letter, retry, backoff, exponential backoff, malformed, validation, "
            "straight to DLQ, poison, timeout, 503, pause, circuit breaker, alert, owner, "
            "replay, idempotent, kafka no native DLQ, rabbitmq dead letter exchange, trace id")
    score = score_answer(card, dump)
    assert score.keyword_list and score.coverage <= KEYWORD_LIST_CAP
