"""Stage measure: the numbers an on-call engineer watches, and the batch size trade-off."""

from __future__ import annotations

import pytest
from _support import (
    READ,
    insert_event,
    insert_many,
    require_table,
)
from sqlalchemy import text

from dojo.checks import CheckFailure, call

pytestmark = pytest.mark.stage("measure")
SEE = READ["measure"]


def test_pending_count_counts_unpublished_rows(outbox, learner):
    require_table(outbox, "outbox_event", "measure")
    metrics = learner.module("metrics")
    empty = call(metrics.pending_count, outbox)
    if empty != 0:
        raise CheckFailure("An empty outbox has nothing pending.", expected="0",
                           actual=f"{empty!r}", lesson=SEE)
    insert_many(outbox, 20, published=True, created_ago=100, published_ago=50)
    ids = [insert_event(outbox, created_ago=10.0 - i) for i in range(7)]
    with outbox.begin() as conn:  # two leased by a relay, two backing off: still pending
        conn.execute(text("UPDATE outbox_event SET lease_until = clock_timestamp() + "
                          "interval '30 s', attempt_count = 1 "
                          "WHERE id = ANY(CAST(:ids AS uuid[]))"),
                     {"ids": ids[:2]})
        conn.execute(text("UPDATE outbox_event SET next_attempt_at = clock_timestamp() + "
                          "interval '1 min', attempt_count = 3, last_error = 'timeout' "
                          "WHERE id = ANY(CAST(:ids AS uuid[]))"), {"ids": ids[2:4]})
    pending = call(metrics.pending_count, outbox)
    if pending != 7:
        raise CheckFailure(
            "outbox_pending_count is every unpublished row — leased, backing off or waiting. "
            "It is the gauge that shows a relay falling behind.",
            expected="7 (20 published rows do not count)", actual=f"{pending!r}",
            lesson=SEE)


def test_oldest_pending_age(outbox, learner):
    require_table(outbox, "outbox_event", "measure")
    metrics = learner.module("metrics")
    empty = call(metrics.oldest_pending_age_seconds, outbox)
    insert_event(outbox, created_ago=500, published_ago=400)
    insert_event(outbox, created_ago=42)
    insert_event(outbox, created_ago=10)
    age = call(metrics.oldest_pending_age_seconds, outbox)
    if not (empty is None and age is not None and 41 <= age <= 44):
        raise CheckFailure(
            "The oldest pending age is now − created_at of the oldest unpublished row: it grows "
            "while the relay is stuck even when no new events arrive (the pending count may not).",
            expected="None on an empty outbox; then ≈ 42 s (the published row from 500 s ago "
                     "does not count)", actual=f"{empty!r}, then {age!r}",
            lesson=SEE)


def seed_ages(engine) -> None:
    """100 events published a minute ago with publish ages 1…100 s, 10 published two hours ago
    with an age of 5000 s, and unpublished rows that must not count."""
    with engine.begin() as conn:
        conn.execute(text(
            "INSERT INTO outbox_event (id, aggregate_type, aggregate_id, event_type, "
            "aggregate_version, payload, headers, created_at, published_at) "
            "SELECT gen_random_uuid(), 'order', gen_random_uuid(), 'order.placed.v1', 1, "
            "'{}'::jsonb, '{}'::jsonb, clock_timestamp() - make_interval(secs => 60 + g), "
            "clock_timestamp() - interval '60 s' FROM generate_series(1, 100) g"))
        conn.execute(text(
            "INSERT INTO outbox_event (id, aggregate_type, aggregate_id, event_type, "
            "aggregate_version, payload, headers, created_at, published_at) "
            "SELECT gen_random_uuid(), 'order', gen_random_uuid(), 'order.placed.v1', 1, "
            "'{}'::jsonb, '{}'::jsonb, clock_timestamp() - interval '12200 s', "
            "clock_timestamp() - interval '7200 s' FROM generate_series(1, 10)"))
    for _ in range(3):
        insert_event(engine, created_ago=3000)


def test_publish_age_quantiles(outbox, learner):
    require_table(outbox, "outbox_event", "measure")
    metrics = learner.module("metrics")
    none = call(metrics.publish_age_seconds, outbox, 0.5)
    seed_ages(outbox)
    p50 = call(metrics.publish_age_seconds, outbox, 0.5)
    p95 = call(metrics.publish_age_seconds, outbox, 0.95)
    wide = call(metrics.publish_age_seconds, outbox, 0.95, window_seconds=10_000)
    ok = (none is None and p50 is not None and p95 is not None and 49 <= p50 <= 52
          and 94 <= p95 <= 96.5 and wide is not None and wide >= 4000)
    if not ok:
        raise CheckFailure(
            "Publish age is published_at − created_at of each event published in the window: "
            "how long an event waited in the outbox. Its p95 is the delivery SLO (alert when it "
            "passes, say, 30 s). It is not now − created_at, and unpublished rows have no publish "
            "age yet (the pending gauges cover them).",
            expected="None with nothing published; p50 ≈ 50 s and p95 ≈ 95 s over the last 15 "
                     "min (ages 1…100 s); p95 ≥ 4000 s with window_seconds=10000 (the 5000 s "
                     "events from two hours ago join)",
            actual=f"{none!r}; p50 {p50!r}, p95 {p95!r}; wide window p95 {wide!r}",
            lesson=SEE)


def test_benchmark_compares_batch_sizes(outbox, learner, kafka, relay_producer):
    require_table(outbox, "outbox_event", "measure")
    bench = learner.module("bench")
    topic = kafka.topic(1, hint="bench")
    results = call(bench.run_benchmark, outbox, relay_producer(), topic, batch_sizes=(1, 100),
                   rate_per_second=200, seconds=0.4, drain_seconds=5)
    report = bench.format_results(results)
    with outbox.connect() as conn:
        truth = conn.execute(text(
            "SELECT percentile_cont(0.95) WITHIN GROUP (ORDER BY extract(epoch FROM "
            "published_at - created_at)) FROM outbox_event")).scalar_one()
    last = results[-1]
    consistent = truth is not None and last.p95_seconds is not None and \
        abs(float(truth) - last.p95_seconds) <= max(0.005, 0.05 * float(truth))
    if not ([r.batch_size for r in results] == [1, 100] and
            all(r.published == r.placed > 0 and r.pending_left == 0 for r in results) and
            consistent and "batch 1" in report and "batch 100" in report):
        raise CheckFailure(
            "The benchmark (python bench.py) runs the relay at batch size 1 and 100 under the "
            "same load. Every order placed must be published, and its p95 must agree with "
            "the database.",
            expected="both runs: published = placed, nothing pending; p95 ≈ the p95 the check "
                     f"computes from the rows ({truth})",
            actual=f"\n{report}", lesson=SEE)
