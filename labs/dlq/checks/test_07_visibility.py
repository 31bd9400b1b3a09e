"""Stage visibility: a counter of acknowledged dead-letter writes by exception type, the
DLT's depth and the age of its oldest waiting record read from the broker, and an alert
that fires on any dead letter of this money flow."""

from __future__ import annotations

import time

import pytest
from _support import (
    READ,
    commit_group,
    craft_dead_letters,
    require_done,
)
from _tools import (
    ScriptedDownstream,
    healthy,
    invalid,
    undecodable,
    with_label,
)
from confluent_kafka import Producer

from dojo.checks import CheckFailure, call, table
from dojo.checks.faults import unreachable_bootstrap

pytestmark = pytest.mark.stage("visibility")
SEE = READ["visibility"]


def simple(counts):
    out: dict[str, int] = {}
    for name, n in (counts or {}).items():
        short = str(name).rsplit(".", 1)[-1]
        out[short] = out.get(short, 0) + n
    return out


def test_counter_counts_acknowledged_dead_letters_by_type(lab, ledger_db, clock):
    metrics_module = lab.module("metrics")
    metrics = call(metrics_module.DeadLetterMetrics)
    topics = lab.topics()
    settings = lab.settings(topics)
    first = lab.produce(topics.source, [undecodable("poison-u1", partition=0)])
    broken = Producer(lab.producer_config(**{"bootstrap.servers": unreachable_bootstrap(),
                                             "message.timeout.ms": 300, "log_level": 0}))
    lab.run_until_stopped(ledger_db, topics, settings, ScriptedDownstream(lab.payments, clock),
                          clock, producer=broken, metrics=metrics, timeout=1.2)
    broken.purge()
    before = simple(call(metrics.counts))
    if before:
        raise CheckFailure(
            "Every dead-letter write failed (the DLT's broker was unreachable), yet the counter "
            "counted it. Count a dead letter only after the broker acknowledged it, or the "
            "metric says 'in the DLT' about records that are not there.",
            expected="counts() == {} after only failed writes", actual=f"counts() == {before}",
            lesson=SEE)

    declined = with_label(healthy("poison-d1", 900), "declined")
    stuck = with_label(healthy("poison-t1", 400), "transient-exhausted")
    more = lab.produce(topics.source, [invalid("poison-i1"), healthy("acc-1"),
                                       invalid("poison-i2"), declined, stuck])
    downstream = ScriptedDownstream(lab.payments, clock, {
        declined.event_id: ["declined"] * 9, stuck.event_id: ["unavailable"] * 40})
    run = lab.run(ledger_db, topics, settings, downstream, clock, metrics=metrics)
    require_done(run, first + more, downstream, read=SEE)
    got = simple(call(metrics.counts))
    expected = {"UndecodableEvent": 1, "InvalidEvent": 2, "PaymentDeclined": 1,
                "DownstreamUnavailable": 1}
    if got != expected:
        raise CheckFailure(
            "The counter is the arrival-rate metric an alert watches: one increment per "
            "acknowledged DLT write, tagged with the class name of the exception that sent the "
            "record there (the one in kafka_dlt-exception-fqcn).",
            expected=str(expected), actual=str(got),
            evidence=table(sorted({**{k: 0 for k in expected}, **got}.items()),
                        ("exception type", "counted")), lesson=SEE)


def test_depth_and_oldest_age_come_from_the_broker(lab):
    metrics_module = lab.module("metrics")
    topics = lab.topics()
    config = lab.kafka.consumer_config()
    old = craft_dead_letters(lab, topics, [
        (undecodable("poison-u1", partition=0), "UndecodableEvent", None),
        (invalid("poison-i1", partition=1), "InvalidEvent", None)])
    time.sleep(1.0)
    new = craft_dead_letters(lab, topics, [
        (invalid("poison-i2", partition=0), "InvalidEvent", None),
        (invalid("poison-i3", partition=1), "InvalidEvent", None),
        (undecodable("poison-u2", partition=2), "UndecodableEvent", None)])
    group = lab.kafka.group_id("dlt-replayer")
    fresh = lab.kafka.group_id("dlt-fresh")
    # The replay job has handled the two old records: only the three new ones wait.
    commit_group(lab, group, topics.dead_letter, {c.partition: c.offset + 1 for c in old})
    now = time.time()
    depth = call(metrics_module.dead_letter_depth, config, topics.dead_letter, group)
    all_depth = call(metrics_module.dead_letter_depth, config, topics.dead_letter, fresh)
    age = call(metrics_module.oldest_dead_letter_age_seconds, config, topics.dead_letter,
               group, now=now)
    expected_age = now - min(c.timestamp_ms for c in new) / 1000
    records = table([(f"p{c.partition}@{c.offset}", c.exception,
                      f"{now - c.timestamp_ms / 1000:.1f} s ago",
                      "handled" if c in old else "waiting") for c in old + new],
                    ("DLT record", "exception", "dead-lettered", f"for {group[-14:]}"))
    if not (depth == 3 and all_depth == 5):
        raise CheckFailure(
            "Depth is what waits in the DLT for the job that handles it: per partition, the end "
            "offset minus that group's committed offset (minus the low watermark where it has "
            "committed nothing). Not the total ever written: the end offset alone counts what "
            "was already replayed.",
            expected="3 for the replay group (it handled 2 of 5), 5 for a group with no commits",
            actual=f"{depth!r} and {all_depth!r}", evidence=records, lesson=SEE)
    if not (age is not None and abs(age - expected_age) <= 0.4):
        raise CheckFailure(
            "The age of the oldest message is how long the oldest record the group has not "
            "handled has waited: now minus its timestamp in the DLT. It says whether anyone is "
            "working the DLT; the age of the first record ever written says nothing.",
            expected=f"about {expected_age:.1f} s", actual=repr(age), evidence=records, lesson=SEE)
    commit_group(lab, group, topics.dead_letter, {c.partition: c.offset + 1 for c in new})
    empty_depth = call(metrics_module.dead_letter_depth, config, topics.dead_letter, group)
    empty_age = call(metrics_module.oldest_dead_letter_age_seconds, config,
                     topics.dead_letter, group, now=time.time())
    if not (empty_depth == 0 and empty_age is None):
        raise CheckFailure(
            "Once the group has handled every record nothing waits.",
            expected="depth 0 and age None", actual=f"depth {empty_depth!r}, age {empty_age!r}",
            lesson=SEE)


def test_alert_fires_on_any_dead_letter(lab):
    metrics_module = lab.module("metrics")
    quiet = call(metrics_module.alert_reason, 0, None, {})
    written = call(metrics_module.alert_reason, 0, None, {"InvalidEvent": 1})
    waiting = call(metrics_module.alert_reason, 3, 5400.0, {})
    rows = [("nothing written, nothing waiting", repr(quiet)),
            ("1 new InvalidEvent dead letter", repr(written)),
            ("3 waiting, the oldest for 90 min", repr(waiting))]
    if not (quiet is None and written and "InvalidEvent" in written and waiting and
            "3" in waiting):
        raise CheckFailure(
            "This is a money flow: one dead letter is already an incident. alert_reason() "
            "returns None when all is quiet, and otherwise the sentence for the page, naming "
            "what happened (the exception type of new writes, how many wait).",
            expected="None; a reason naming InvalidEvent; a reason naming the depth 3",
            actual="see below", evidence=table(rows, ("situation", "alert_reason()")), lesson=SEE)
