"""Stage visibility: a counter of acknowledged dead-letter writes by exception type, the
DLT's depth and the age of its oldest waiting record read from the broker, and an alert
that fires on any dead letter of this money flow."""

from __future__ import annotations

import re
import time
from typing import Any

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
    earlier = call(metrics.counts)  # kept as returned: a later counts() must not change it
    before = simple(earlier)
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
    if got and simple(earlier) == got:
        raise CheckFailure(
            "counts() returned its live counter, not a snapshot: the dict it handed out before "
            "the five writes changed with them. The writes since the last look are the "
            "difference of two counts(), which is then zero for every type, so the alert on "
            "new dead letters never fires (and a reader iterating it while the consumer "
            "writes can fail). Return a copy, taken under the lock.",
            expected="the first counts() still {} after the writes; the second "
                     + str(dict(sorted(expected.items()))),
            actual=f"the first counts() now reads {dict(sorted(simple(earlier).items()))}",
            lesson=SEE)
    if got != expected:
        raise CheckFailure(
            "The counter is the arrival-rate metric an alert watches: one increment per "
            "acknowledged DLT write, tagged with the class name of the exception that sent the "
            "record there (the one in kafka_dlt-exception-fqcn).",
            expected=str(expected), actual=str(got),
            evidence=table(sorted({**{k: 0 for k in expected}, **got}.items()),
                        ("exception type", "counted")), lesson=SEE)
    fresh = simple(call(call(metrics_module.DeadLetterMetrics).counts))
    if fresh:
        raise CheckFailure(
            "A DeadLetterMetrics made after another one counted five DLT writes, and handed to "
            "no run(), already reports writes: the instances share one tally (a counter kept "
            "on the class or in the module). Two consumers in one process, or a consumer "
            "restarted in it, then report each other's dead letters. Keep the counter (and "
            "its lock) on the instance, made in __init__.",
            expected="counts() == {} on a new DeadLetterMetrics()",
            actual=f"counts() == {dict(sorted(fresh.items()))}", lesson=SEE)


# (partition, seconds ago, handled by the replay group already?) of each DLT record, written
# in this order: older first within a partition, as a consumer writes them.
# (partition, seconds ago, handled by the replay group). The oldest waiting record is the
# first waiting one of the MIDDLE partition: taking the first partition's, or the last's, or
# the newest record's age gives another number.
AGES = [(0, 2000.3, True), (1, 1500.7, True), (1, 713.4, False), (0, 305.6, False),
        (1, 402.9, False), (2, 51.8, False), (0, 211.3, False), (0, 96.2, False),
        (2, 20.4, False)]


def _age_table(crafted, now, handled):
    return table([(f"p{c.partition}@{c.offset}", c.exception,
                   f"{now - c.timestamp_ms / 1000:.1f} s ago",
                   "handled" if c in handled else "waiting") for c in crafted],
                 ("DLT record", "exception", "dead-lettered", "for the replay group"))


def _whose_age(age, crafted, now, handled):
    """Which DLT record an age belongs to, as a learner would recognise it."""
    if age is None:
        return ""
    for c in crafted:
        if abs((now - c.timestamp_ms / 1000) - age) <= 0.5:
            same = [d for d in crafted if d.partition == c.partition and d not in handled]
            if c in handled:
                return f": that is the age of p{c.partition}@" \
                       f"{c.offset}, which the group has handled already"
            if len(same) > 1 and c is same[-1]:
                return (f": that is the age of p{c.partition}@{c.offset}, the NEWEST waiting "
                        f"record of p{c.partition} (its oldest is p{same[0].partition}@"
                        f"{same[0].offset}): the first waiting record of a partition is its "
                        "oldest")
            return (f": that is the age of p{c.partition}@{c.offset}, the first waiting "
                    f"record of p{c.partition}, but not the oldest across partitions: take "
                    "the minimum timestamp of the partitions' first waiting records")
    return ""


def test_depth_and_oldest_age_come_from_the_broker(lab):
    metrics_module = lab.module("metrics")
    topics = lab.topics()
    config = lab.kafka.consumer_config()
    now_ms = int(time.time() * 1000)
    kinds = ("InvalidEvent", "UndecodableEvent", "PaymentDeclined")
    crafted = craft_dead_letters(
        lab, topics, [(invalid(f"poison-i{n}", partition=p), kinds[n % 3], None)
                      for n, (p, _, _) in enumerate(AGES)],
        timestamps=[now_ms - int(ago * 1000) for _, ago, _ in AGES])
    handled = [c for c, (_, _, done) in zip(crafted, AGES, strict=True) if done]
    waiting = [c for c in crafted if c not in handled]
    group = lab.kafka.group_id("dlt-replayer")
    fresh = lab.kafka.group_id("dlt-fresh")
    # The replay job has handled the two oldest records: only the other seven wait.
    commit_group(lab, group, topics.dead_letter, {c.partition: c.offset + 1 for c in handled})
    now = time.time()
    depth = call(metrics_module.dead_letter_depth, config, topics.dead_letter, group)
    all_depth = call(metrics_module.dead_letter_depth, config, topics.dead_letter, fresh)
    age = call(metrics_module.oldest_dead_letter_age_seconds, config, topics.dead_letter,
               group, now=now)
    expected_age = now - min(c.timestamp_ms for c in waiting) / 1000
    records = _age_table(crafted, now, handled)
    if not (depth == len(waiting) and all_depth == len(crafted)):
        raise CheckFailure(
            "Depth is what waits in the DLT for the job that handles it: per partition, the end "
            "offset minus that group's committed offset (minus the low watermark where it has "
            "committed nothing). Not the total ever written: the end offset alone counts what "
            "was already replayed.",
            expected=f"{len(waiting)} for the replay group (it handled {len(handled)} of "
                     f"{len(crafted)}), {len(crafted)} for a group with no commits",
            actual=f"{depth!r} and {all_depth!r}", evidence=records, lesson=SEE)
    if not (isinstance(age, int | float) and abs(age - expected_age) <= 0.5):
        raise CheckFailure(
            "The age of the oldest message is how long the oldest record the group has not "
            "handled has waited: now minus its timestamp in the DLT. It says whether anyone is "
            "working the DLT; the age of the newest record, or of the first ever written, "
            "says nothing about that.",
            expected=f"about {expected_age:.1f} s (p{waiting[0].partition}@"
                     f"{waiting[0].offset})",
            actual=(f"{age:.1f} s" if isinstance(age, int | float) else repr(age))
                   + _whose_age(age, crafted, now, handled),
            evidence=records, lesson=SEE)
    commit_group(lab, group, topics.dead_letter, {c.partition: c.offset + 1 for c in waiting})
    empty_depth = call(metrics_module.dead_letter_depth, config, topics.dead_letter, group)
    empty_age = call(metrics_module.oldest_dead_letter_age_seconds, config,
                     topics.dead_letter, group, now=time.time())
    if not (empty_depth == 0 and empty_age is None):
        raise CheckFailure(
            "Once the group has handled every record nothing waits.",
            expected="depth 0 and age None", actual=f"depth {empty_depth!r}, age {empty_age!r}",
            lesson=SEE)


@pytest.mark.needs_kafka("delete_records")
def test_depth_and_age_start_at_the_low_watermark(lab):
    """Retention (or DeleteRecords) moves a partition's first offset up: a group that has
    committed nothing, or committed an offset below it, waits only from there."""
    from confluent_kafka import TopicPartition

    metrics_module = lab.module("metrics")
    topics = lab.topics()
    config = lab.kafka.consumer_config()
    now_ms = int(time.time() * 1000)
    ages = (3600.4, 1800.2, 900.7, 120.9)
    crafted = craft_dead_letters(
        lab, topics, [(invalid(f"poison-i{n}", partition=1), "InvalidEvent", None)
                      for n in range(len(ages))],
        timestamps=[now_ms - int(ago * 1000) for ago in ages])
    gone = crafted[:2]  # retention deleted the two oldest
    # The replay job had handled the first record when retention deleted the second as well.
    behind = lab.kafka.group_id("dlt-behind")
    commit_group(lab, behind, topics.dead_letter, {1: crafted[0].offset + 1})
    admin = lab.kafka.admin()  # kept alive: a client collected mid-request never answers
    futures = admin.delete_records([TopicPartition(topics.dead_letter, 1, gone[-1].offset + 1)])
    for future in futures.values():
        future.result(timeout=15)
    del admin
    _wait_for_low_watermark(config, topics.dead_letter, 1, gone[-1].offset + 1)
    group = lab.kafka.group_id("dlt-fresh")
    now = time.time()
    depth = call(metrics_module.dead_letter_depth, config, topics.dead_letter, group)
    age = call(metrics_module.oldest_dead_letter_age_seconds, config, topics.dead_letter,
               group, now=now)
    expected_age = now - crafted[2].timestamp_ms / 1000
    records = table([(f"p{c.partition}@{c.offset}", f"{now - c.timestamp_ms / 1000:.1f} s ago",
                      "deleted (below the low watermark)" if c in gone else "waiting")
                     for c in crafted], ("DLT record", "dead-lettered", ""))
    if not (depth == 2 and isinstance(age, int | float) and abs(age - expected_age) <= 0.5):
        raise CheckFailure(
            "Retention deleted the two oldest records of p1 (its low watermark is now "
            f"{gone[-1].offset + 1}). For a group that has committed nothing, what waits starts "
            "at the low watermark, not at offset zero: records that no longer exist are not "
            "waiting, and cannot be the oldest.",
            expected=f"depth 2 and an age of about {expected_age:.1f} s",
            actual=f"depth {depth!r}, age "
                   + (f"{age:.1f} s" if isinstance(age, int | float) else repr(age)),
            evidence=records, lesson=SEE)
    now = time.time()
    behind_depth = call(metrics_module.dead_letter_depth, config, topics.dead_letter, behind)
    behind_age = call(metrics_module.oldest_dead_letter_age_seconds, config, topics.dead_letter,
                      behind, now=now)
    expected_age = now - crafted[2].timestamp_ms / 1000
    if not (behind_depth == 2 and isinstance(behind_age, int | float)
            and abs(behind_age - expected_age) <= 0.5):
        raise CheckFailure(
            f"The replay group had committed offset {crafted[0].offset + 1} on p1 when "
            f"retention moved the low watermark up to {gone[-1].offset + 1}. Where the "
            "committed offset lies below the low watermark, what waits starts at the low "
            "watermark: the record between them no longer exists, it waits for no one.",
            expected=f"depth 2 and an age of about {expected_age:.1f} s (p1@"
                     f"{crafted[2].offset}, the first record still there)",
            actual=f"depth {behind_depth!r}, age "
                   + (f"{behind_age:.1f} s" if isinstance(behind_age, int | float)
                      else repr(behind_age)),
            evidence=records + f"\nthe replay group's committed offset on p1: "
                     f"{crafted[0].offset + 1}; low watermark {gone[-1].offset + 1}; end "
                     f"offset {crafted[-1].offset + 1}",
            fix="start each partition at max(committed offset, low watermark), not at the "
                "committed offset alone" if behind_depth == 3 else None,
            lesson=SEE)


def _wait_for_low_watermark(config: dict[str, Any], topic: str, partition: int,
                            low: int) -> None:
    """Until the broker itself reports the new low watermark: right after DeleteRecords an
    Apache broker can answer a first request with NOT_LEADER_FOR_PARTITION (retriable), and
    that is the broker settling, not the learner's code."""
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    probe = Consumer({**config, "group.id": f"dojo-probe-{time.monotonic_ns()}",
                      "enable.auto.commit": False})
    try:
        deadline = time.monotonic() + 15
        while True:
            try:
                first, _end = probe.get_watermark_offsets(TopicPartition(topic, partition),
                                                          timeout=5)
                if first >= low:
                    return
            except KafkaException:
                pass
            if time.monotonic() > deadline:
                return  # the learner's code sees what the broker says, as it would anyway
            time.sleep(0.1)
    finally:
        probe.close()


def test_alert_fires_on_any_dead_letter(lab):
    metrics_module = lab.module("metrics")
    cases = [("nothing written, nothing waiting", (0, None, {}), None),
             ("no new writes (zero counts), nothing waiting",
              (0, None, {"InvalidEvent": 0, "PaymentDeclined": 0}), None),
             ("2 new InvalidEvent dead letters", (0, None, {"InvalidEvent": 2}),
              "InvalidEvent"),
             # a difference of two counts(): the types that had no new write read 0
             ("3 new PaymentDeclined, 0 KeyParked, 0 UndecodableEvent",
              (0, None, {"KeyParked": 0, "PaymentDeclined": 3, "UndecodableEvent": 0}),
              "PaymentDeclined"),
             ("13 waiting, the oldest for 41.6 s, no new writes", (13, 41.6, {}), "13"),
             # both at once: the page says both (the new type, and how many wait)
             ("2 new PaymentDeclined while 37 wait, the oldest for 5.3 s",
              (37, 5.3, {"PaymentDeclined": 2}), ("PaymentDeclined", "37")),
             ("13 waiting, the oldest for 90 min", (13, 5400.0, {}), "13")]
    rows, wrong, phantom = [], [], []
    for situation, args, want in cases:
        got = call(metrics_module.alert_reason, *args)
        wants = () if want is None else (want,) if isinstance(want, str) else want
        ok = got is None if want is None else \
            (isinstance(got, str) and all(re.search(rf"\b{w}\b", got) for w in wants))
        zero = [name for name, n in args[2].items() if n == 0]
        named = [name for name in zero
                 if isinstance(got, str) and re.search(rf"\b{name}\b", got)]
        rows.append((situation, "None" if want is None else
                     f"a page naming {' and '.join(wants)}",
                     repr(got), "" if ok and not named else "WRONG"))
        if not ok:
            wrong.append(situation)
        elif named:
            phantom.append(f"{situation}: names {', '.join(named)}")
    if phantom and not wrong:
        raise CheckFailure(
            "The page names exception types that had no new dead letter: in "
            "new_writes_by_type a count of 0 means none was written since the last look. "
            "Whoever is paged goes looking for dead letters that do not exist.",
            expected="a page naming only the types with a count above 0",
            actual="; ".join(phantom),
            evidence=table(rows, ("situation", "expected", "alert_reason()", "")), lesson=SEE)
    if wrong:
        raise CheckFailure(
            "This is a money flow: one dead letter is already an incident. alert_reason() "
            "returns None when all is quiet (no new writes, or only zero counts, and nothing "
            "waiting) and otherwise the sentence for the page, naming what happened: the "
            "exception types of new writes, how many records wait (however young the oldest), "
            "both when both are true.",
            expected="a page exactly when something was written or waits",
            actual="wrong for: " + "; ".join(wrong),
            evidence=table(rows, ("situation", "expected", "alert_reason()", "")), lesson=SEE)
