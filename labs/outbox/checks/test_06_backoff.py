"""Stage backoff: a row that keeps failing waits exponentially longer between attempts, and
the rows behind it keep flowing."""

from __future__ import annotations

from typing import Any

import pytest
from _support import (
    MISTAKES,
    READ,
    insert_event,
    outbox_rows,
    require_table,
)
from sqlalchemy import text

from dojo.checks import CheckFailure, call, table

pytestmark = pytest.mark.stage("backoff")
SEE = READ["backoff"]

ROW_COLUMNS = ("id", "published_at", "attempt_count", "retry_in", "lease_left", "last_error")
BASE, MAXIMUM = 1.0, 60.0
# The producer refuses records over 100 kB; the poison row's payload is 200 kB, so sending
# it fails every time, for real, inside librdkafka (MSG_SIZE_TOO_LARGE).
SMALL_MESSAGES = {"message.max.bytes": 100_000}


def poison(engine: Any, attempt_count: int = 0) -> str:
    return insert_event(engine, payload={"blob": "x" * 200_000}, created_ago=60.0,
                        attempt_count=attempt_count)


def relay_pass(relay: Any, engine: Any, producer: Any, topic: str, batch_size: int = 10) -> int:
    return call(relay.relay_once, engine, producer, topic, batch_size=batch_size,
                lease_seconds=30, ack_timeout_seconds=10, backoff_base_seconds=BASE,
                backoff_max_seconds=MAXIMUM)


def row(engine: Any, event_id: str) -> dict[str, Any]:
    [found] = outbox_rows(engine, "id = CAST(:id AS uuid)", id=event_id)
    return found


def fast_forward(engine: Any, event_id: str) -> None:
    """Pretend the backoff has elapsed: move next_attempt_at (and any lease) into the past."""
    with engine.begin() as conn:
        conn.execute(text(
            "UPDATE outbox_event SET next_attempt_at = clock_timestamp() - interval '1 ms', "
            "lease_until = CASE WHEN lease_until IS NULL THEN NULL "
            "ELSE clock_timestamp() - interval '1 ms' END WHERE id = CAST(:id AS uuid)"),
            {"id": event_id})


def require_recorded_failure(engine: Any, event_id: str, attempt: int,
                             history: list[dict[str, Any]]) -> float:
    now = row(engine, event_id)
    history.append({"attempt": now["attempt_count"], "retry_in": now["retry_in"],
                    "published_at": now["published_at"], "last_error": now["last_error"]})
    if now["published_at"] is not None:
        raise CheckFailure(
            "The row whose payload is too large to send was marked published.",
            expected="published_at NULL (it was never acknowledged)",
            actual=f"published_at {now['published_at']} — did producer_config change "
                   "message.max.bytes? Keep the base settings.",
            lesson=MISTAKES)
    if not (now["attempt_count"] == attempt and now["last_error"] and
            now["retry_in"] is not None and now["retry_in"] > 0):
        raise CheckFailure(
            f"After failed attempt {attempt}, the row must say when to try again: "
            "next_attempt_at in the future (and the claim must skip it until then), with "
            "the error in last_error. Without next_attempt_at the relay retries it on every "
            "poll, hammering the broker with a record that cannot succeed.",
            expected=f"attempt_count {attempt}, last_error set, next_attempt_at in the future",
            actual=f"attempt_count {now['attempt_count']}, last_error "
                   f"{(now['last_error'] or '')[:60]!r}, next attempt in {now['retry_in']} s",
            evidence=table(history, ("attempt", "retry_in", "published_at", "last_error")),
            lesson=SEE)
    return float(now["retry_in"])


def test_failing_row_backs_off_exponentially(outbox, learner, kafka, relay_producer):
    require_table(outbox, "outbox_event", "backoff")
    relay = learner.module("relay")
    topic = kafka.topic(1, hint="backoff")
    producer = relay_producer(**SMALL_MESSAGES)
    bad = poison(outbox)
    good = [insert_event(outbox, created_ago=30.0 - i) for i in range(3)]
    history: list[dict[str, Any]] = []
    relay_pass(relay, outbox, producer, topic)
    delays = [require_recorded_failure(outbox, bad, 1, history)]
    for _ in range(2):  # polls right away: the poison row is not due yet
        good.append(insert_event(outbox))
        relay_pass(relay, outbox, producer, topic)
        require_recorded_failure(outbox, bad, 1, history)
    stuck = outbox_rows(outbox, "published_at IS NULL AND id <> CAST(:id AS uuid)", id=bad)
    if stuck:
        raise CheckFailure(
            "The good rows must be published while the poison row fails.",
            expected="every other row published", actual=f"{len(stuck)} still unpublished",
            evidence=table(outbox_rows(outbox), ROW_COLUMNS), lesson=SEE)
    for attempt in range(2, 6):
        fast_forward(outbox, bad)
        relay_pass(relay, outbox, producer, topic)
        delays.append(require_recorded_failure(outbox, bad, attempt, history))
    flat = [(i + 1, round(a, 2), round(b, 2)) for i, (a, b) in enumerate(zip(delays, delays[1:],
                                                                            strict=False))
            if b < 1.2 * a and b < 0.8 * MAXIMUM]
    if not (0.5 * BASE <= delays[0] <= 2.5 * BASE and not flat):
        raise CheckFailure(
            "The delay before the next attempt must start near backoff_base_seconds and grow "
            "exponentially (×2 per failure, jitter within ±25% is fine). A fixed delay keeps "
            "hitting a broken dependency at the same rate for ever.",
            expected=f"first delay ≈ {BASE:.0f} s, then each at least 1.2× the one before "
                     "(1, 2, 4, 8, 16 s)",
            actual=f"delays {[round(d, 2) for d in delays]} s"
                   + (f"; not growing after attempts {[f[0] for f in flat]}" if flat else ""),
            evidence=table(history, ("attempt", "retry_in", "published_at", "last_error")),
            lesson=SEE)


def test_backoff_is_capped(outbox, learner, kafka, relay_producer):
    require_table(outbox, "outbox_event", "backoff")
    relay = learner.module("relay")
    topic = kafka.topic(1, hint="cap")
    bad = poison(outbox, attempt_count=40)  # a row that has failed for days
    relay_pass(relay, outbox, relay_producer(**SMALL_MESSAGES), topic)
    delay = require_recorded_failure(outbox, bad, 41, [])
    if not (0.5 * MAXIMUM <= delay <= 1.25 * MAXIMUM):
        raise CheckFailure(
            "After many failures the delay must stop growing at backoff_max_seconds, or a row "
            "would wait for years (2^40 seconds) after an outage that lasted an hour.",
            expected=f"next attempt in about {MAXIMUM:.0f} s (backoff_max_seconds)",
            actual=f"next attempt in {delay:.0f} s", lesson=SEE)


def test_failing_row_does_not_block_the_others(outbox, learner, kafka, relay_producer):
    require_table(outbox, "outbox_event", "backoff")
    relay = learner.module("relay")
    topic = kafka.topic(1, hint="hol")
    producer = relay_producer(**SMALL_MESSAGES)
    bad = poison(outbox)
    good = [insert_event(outbox, created_ago=30.0 - i) for i in range(4)]
    for _ in range(5):
        relay_pass(relay, outbox, producer, topic, batch_size=1)
    rows = outbox_rows(outbox)
    stuck = [r for r in rows if r["id"] in good and r["published_at"] is None]
    if stuck:
        raise CheckFailure(
            "With batch_size=1 the poison row is the oldest, so a relay without backoff claims it "
            "on every poll and nothing behind it ever leaves: head-of-line blocking.",
            expected="5 passes: 1 failure, then the 4 good rows published",
            actual=f"{len(stuck)} of 4 good rows still unpublished; the poison row was tried "
                   f"{row(outbox, bad)['attempt_count']} time(s)",
            evidence=table(rows, ROW_COLUMNS), lesson=SEE)
