"""Spot-the-mistake cards: a "fix" that restates or endorses the mistake, or an essential's
rival claim, contradicts the point, while a strong answer that names the same claim
critically ("X is the classic mistake", "not X but Y", "if you X, …") keeps it.

The answers are written for these tests (not taken from the calibration set); each pair was
used to check the card's misconceptions when they were written (round 5 of issue 13)."""

from __future__ import annotations

import pytest

from dojo.content import Card, content_root, load_catalog
from dojo.quiz.scoring import Verdict, score_answer

CATALOG = load_catalog(content_root())


def real_card(card_id: str) -> Card:
    if not CATALOG.has_card(card_id):
        pytest.skip(f"card {card_id} is not written yet")
    return CATALOG.card(card_id)


# card, point, an answer that says the opposite, a strong answer naming it critically
CASES = [
    ("dlq-spot-outage", "pause-consumption",
     "The mistake is dead-lettering an outage: the 503 hits every message, so the DLQ fills "
     "with healthy deposits and the replay afterwards breaks ordering and double-applies. The "
     "right move is a few retries with backoff and then keep the consumer running so lag "
     "never builds, with a circuit breaker around the provider.",
     "The mistake is dead-lettering an outage: the 503 hits every message, so the DLQ fills "
     "with healthy deposits and the replay afterwards breaks ordering and double-applies. "
     "Keeping the consumer running through the outage is the classic mistake. Instead, open a "
     "circuit breaker on the failure rate and pause the listener container, not keep "
     "consuming; the topic buffers the backlog as lag."),
    ("dlq-spot-catch-log", "propagate-to-handler",
     "It catches every exception and only logs it, so the deposit is lost. The fix is to "
     "catch Exception more broadly and alert on the log line.",
     "It swallows everything: catch, log, return. Since it returns normally, the offset is "
     "committed, never retried, and the deposit is lost. If you keep catching and logging, "
     "you lose money silently. Instead, rethrow to the DefaultErrorHandler with backoff; mark "
     "permanent exceptions not retryable and let a recoverer publish to the DLT."),
    ("money-service-spot-call-in-transaction", "two-transactions",
     "The HTTP call to the provider runs inside the transaction, so it holds a pooled "
     "connection and the row lock for seconds and the pool runs dry. The fix: two short "
     "transactions, first debit and record PENDING and commit, then call the provider inside "
     "the same transaction as the credit.",
     "They call placeOrder inside the one transaction that debits and credits, holding the "
     "lock and a connection for seconds; the pool exhausts and everything fails. A rollback "
     "can't undo the provider's fill. Instead of calling it inside the same transaction, use "
     "two transactions: debit plus PENDING, commit, call with a timeout and idempotency key, "
     "then a second transaction credits."),
    ("where-to-look-first-spot-bigger-pool", "shorten-transactions",
     "They enlarged the pool instead of finding who holds connections. 100 per pod on twice "
     "the pods is 2000 against max_connections of 100, and the database thrashes. Fix: find "
     "the holder with a thread dump and pg_stat_activity. Shortening the transactions won't "
     "help, the queries are what they are.",
     "They enlarged the pool instead of finding who holds the connections: with the same "
     "cause, more requests just hold connections while they wait. 100 per pod on twice the "
     "pods is about 2000 connections against max_connections of 100, so the queue moves into "
     "the database. Fix: find the holder first with a thread dump and pg_stat_activity; then "
     "shorten the transactions, since a longer pool timeout doesn't help, and move the remote "
     "call out."),
    ("outbox-spot-mark-first", "send-ack-then-mark",
     "Marking first avoids duplicates. produce() just puts the record in a buffer, so without "
     "the callback nobody knows whether the broker got it. The right order is to mark the row "
     "published, then produce, and skip the callback for speed.",
     "Marking first trades duplicates for loss: if the process crashes after the mark, the "
     "event is lost for good, and the row marked published is never picked up again. "
     "produce() only buffers the record; without the callback nobody knows whether the broker "
     "acknowledged. Mark then send is the mistake. The right order: send, wait for the ack "
     "with acks=all, then mark; a crash then causes a duplicate, which is fine because "
     "consumers deduplicate on the event id."),
    ("idem-spot-separate-tx", "one-transaction",
     "Committing the offset first means a crash afterwards loses the message for good. Saving "
     "the marker first means a failing effect is skipped on redelivery. The right way is two "
     "transactions, one for the marker and one for the effect, with the offset committed at "
     "the end.",
     "Committing the offset first means a crash afterwards loses the message for good. "
     "Saving the marker first means a failing effect is skipped on redelivery, and a marker "
     "saved after the effect means a crash in between applies it twice. The fix is not two "
     "transactions but one: the marker insert and the effect in one database transaction, "
     "and commit the offset only after that transaction committed."),
    ("idem-spot-catch-duplicate", "aborts-transaction",
     "In PostgreSQL the failed insert aborts only that statement, so recordOrder would run. "
     "On a duplicate it goes on and counts the order twice. Fix: INSERT ... ON CONFLICT DO "
     "NOTHING and check the row count.",
     "Unlike Oracle, where a failed statement aborts only that statement, PostgreSQL aborts "
     "the whole transaction: current transaction is aborted, commands ignored. So "
     "recordOrder fails. And it processes duplicates anyway, counting the order twice. Use "
     "ON CONFLICT DO NOTHING, check the row count and return when it is zero."),
    ("circuit-breaker-spot-exchange", "fix-pending-outside",
     "The provider call sits inside the transaction, so it holds a connection and the "
     "account's row lock for as long as the provider takes. The retry repeats a "
     "non-idempotent execute without a key. A timeout means the outcome is unknown. Fix: an "
     "idempotency key reused on every retry, reconcile PENDING exchanges, and keep the "
     "provider call inside the same transaction so it stays atomic.",
     "The provider call sits inside the transaction, so it holds a connection and the "
     "account's row lock for as long as the provider takes. The retry repeats a "
     "non-idempotent execute without a key. A timeout means the outcome is unknown. Fix: a "
     "short transaction debits and writes the exchange as PENDING and commits, then we call "
     "the provider outside the transaction, never in the same transaction; the idempotency "
     "key is reused on every retry, and on a timeout reconciliation completes or "
     "compensates."),
]


@pytest.mark.parametrize(("card_id", "point", "wrong", "strong"), CASES,
                         ids=[case[0] for case in CASES])
def test_a_wrong_fix_is_caught_and_a_critical_strong_answer_is_not(
        card_id: str, point: str, wrong: str, strong: str) -> None:
    card = real_card(card_id)
    caught = score_answer(card, wrong)
    assert caught.result(point).verdict is Verdict.CONTRADICTED
    kept = score_answer(card, strong)
    assert not kept.contradicted, [(r.point.id, r.because) for r in kept.contradicted]
