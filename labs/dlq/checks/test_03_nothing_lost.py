"""Stage nothing-lost: an offset is committed only after its record was booked or its DLT
write acknowledged; a failed DLT write means no commit and a redelivery; kill -9 at random
points loses nothing and books nothing twice."""

from __future__ import annotations

import random
import tempfile
from dataclasses import asdict
from pathlib import Path

import pytest
from _history import (
    Life,
    describe_life,
    judge,
    report,
)
from _support import (
    CHECKS_DIR,
    MISTAKES,
    READ,
    applied_ids,
    dlt_table,
    ledger,
    match_dlt,
    require_done,
    timeline,
)
from _tools import (
    ScriptedDownstream,
    business_rule,
    healthy,
    invalid,
    undecodable,
    with_label,
)
from confluent_kafka import Producer

from dojo.checks import CheckFailure, table
from dojo.checks.faults import run_in_subprocess, unreachable_bootstrap
from dojo.checks.observers import ProducerTap, committed_offsets, offsets_text, read_jsonl

pytestmark = pytest.mark.stage("nothing-lost")
SEE = READ["nothing-lost"]


def test_every_commit_covers_only_finished_records(lab, ledger_db, clock):
    topics = lab.topics()
    settings = lab.settings(topics)
    config = lab.consumer_config(settings)
    auto = str(config.get("enable.auto.commit", True)).lower() in ("true", "1")
    auto_store = str(config.get("enable.auto.offset.store", True)).lower() in ("true", "1")
    if (auto and auto_store):
        raise CheckFailure(
            "With enable.auto.commit on (the default) and automatic offset storing, the client "
            "commits every record poll() returned, every few seconds, whether it was booked or "
            "not: a crash after such a commit loses the records in between.",
            expected="enable.auto.commit False (commit yourself), or enable.auto.offset.store "
                     "False with store_offsets() after each finished record",
            actual=f"enable.auto.commit={config.get('enable.auto.commit', '(default: true)')}",
            lesson=SEE)
    items = [healthy("acc-1", partition=0), undecodable("poison-u1", partition=0),
             healthy("acc-2", partition=0), invalid("poison-i1", partition=1),
             healthy("acc-3", partition=1), business_rule("poison-b1", partition=2),
             healthy("acc-4", partition=2), healthy("acc-5", partition=0)]
    inputs = lab.produce(topics.source, items)
    violations: list[tuple[str, str, str]] = []
    holder: dict[str, ProducerTap] = {}

    def audit(upto: dict[int, int]) -> None:
        booked = applied_ids(ledger_db)
        acked = {p.value for p in holder["tap"].to(topics.dead_letter)
                 if p.acked_at is not None and p.error is None}
        for i in inputs:
            if i.offset < upto.get(i.partition, -1):
                done = (i.item.event_id in booked) or (i.item.value in acked)
                if not done:
                    writes = [p for p in holder["tap"].to(topics.dead_letter)
                              if p.value == i.item.value]
                    state = ("its DLT write was produced but not yet acknowledged"
                             if writes else "not booked, no DLT write")
                    violations.append((f"p{i.partition} -> {upto[i.partition]}",
                                       i.describe(), state))

    # The broker takes 0.3 s to acknowledge each DLT write, as a loaded one would.
    downstream = ScriptedDownstream(lab.payments, clock)
    tap = ProducerTap(lab.dlt_producer(), clock, hold_acks=0.3)
    holder["tap"] = tap
    run = lab.run(ledger_db, topics, settings, downstream, clock, producer=tap,
                  before_commit=audit)
    require_done(run, inputs, downstream, read=SEE)
    if violations:
        raise CheckFailure(
            "At every commit the check looked at the database and at the acknowledgements your "
            "producer had handed back. Some commits covered records that were neither booked nor "
            "acknowledged by the DLT: a crash right then loses them. Commit only after the DLT's "
            "acknowledgement (flush() returned and the delivery callback reported no error).",
            expected="every record below a committed offset is booked or acknowledged by the DLT",
            actual=f"{len(violations)} commit(s) ran ahead of the acknowledgement",
            evidence=table(violations[:8], ("commit", "record below it", "at that moment")) +
                     "\nwhat happened:\n" + timeline(run, downstream, inputs, limit=14), lesson=SEE)


def test_failed_dead_letter_write_is_not_committed(lab, ledger_db, clock):
    topics = lab.topics()
    settings = lab.settings(topics)
    items = [healthy("acc-1", partition=0), undecodable("poison-u1", partition=0),
             healthy("acc-2", partition=0), healthy("acc-3", partition=1),
             healthy("acc-4", partition=2)]
    inputs = lab.produce(topics.source, items)
    poison = inputs[1]
    # The DLT's broker is unreachable: every DLT write fails after 0.3 s.
    broken = Producer(lab.producer_config(**{"bootstrap.servers": unreachable_bootstrap(),
                                             "message.timeout.ms": 300, "log_level": 0}))
    downstream = ScriptedDownstream(lab.payments, clock)
    first, ended, committed = lab.run_until_stopped(ledger_db, topics, settings, downstream,
                                                    clock, producer=broken, timeout=1.5)
    broken.purge()
    if not (committed.get(0, -1) <= poison.offset):
        raise CheckFailure(
            "The DLT write of an undecodable record failed (its broker was unreachable), yet the "
            "record's offset was committed: the record is in neither the ledger nor the DLT, and "
            "Kafka will never deliver it again. It is LOST. When the DLT write is not "
            "acknowledged, do not commit: retry the write (with backoff), or stop and let the "
            "record be redelivered.",
            expected=f"p0 committed at most up to {poison.offset} (the poison's offset)",
            actual=f"committed {offsets_text(committed)} ({ended})",
            evidence=timeline(first, downstream, inputs) if first else "", lesson=MISTAKES)

    downstream = ScriptedDownstream(lab.payments, clock)
    second = lab.run(ledger_db, topics, settings, downstream, clock)
    require_done(second, inputs, downstream, read=SEE, why=(
        "The second run had a working DLT producer and the same group: it should pick up "
        "the record whose DLT write failed."))
    dlt = lab.read(topics.dead_letter, topics.partitions, expect=1)
    booked = applied_ids(ledger_db)
    twice = [i for i in inputs if len(booked.get(i.item.event_id or "", [])) > 1]
    if not (1 in match_dlt(inputs, dlt) and not twice):
        raise CheckFailure(
            "After the DLT came back, the record whose DLT write had failed must reach it "
            "(redelivered, because it was never committed), and nothing is booked twice.",
            expected=f"{poison.describe()} in the DLT; every event booked once",
            actual=f"DLT has {len(dlt)} record(s); booked twice: "
                   f"{', '.join(i.describe() for i in twice) or 'none'}",
            evidence="DLT:\n" + dlt_table(dlt, inputs), lesson=SEE)


# -- kill -9 at random points -----------------------------------------------------------------

KILL_POINTS = ("after-effect", "after-ack", "after-commit", "in-gateway", "timer")
AIM = {"after-effect": "the commit of effect #{n}", "after-ack": "DLT acknowledgement #{n}",
       "after-commit": "offset commit #{n}", "in-gateway": "gateway call #{n}",
       "timer": "a timer at {s:.2f} s"}


def crash_inputs():
    items, scripts = [], {}
    poison = [undecodable("poison-u1"), invalid("poison-i1"), business_rule("poison-b1"),
              undecodable("poison-u2")]
    declined = with_label(healthy("poison-d1", 900), "declined")
    stuck = with_label(healthy("poison-t1", 400), "transient-exhausted")
    flaky = [healthy(f"acc-{n}", 250, label="transient") for n in (2, 5)]
    scripts[declined.event_id] = ["declined"] * 9
    scripts[stuck.event_id] = ["timeout"] * 40
    for f in flaky:
        scripts[f.event_id] = ["unavailable"]  # each life: one failure, then it works
    extra = poison + [declined, stuck] + flaky
    for n in range(24):
        items.append(healthy(f"acc-{n % 8 + 1}", 100 + n))
        if n % 3 == 1 and extra:
            items.append(extra.pop(0))
    return items + extra, scripts


def test_kill_nine_at_random_points_loses_nothing(lab, ledger_db, database, clock,
                                                  record_property):
    topics = lab.topics()
    settings = lab.settings(topics, attempts=3, initial=0.05, cap=0.2)
    items, scripts = crash_inputs()
    inputs = lab.produce(topics.source, items)
    seed = random.randrange(10_000)
    rng = random.Random(seed)
    # The kill after an effect's commit comes first, while there is work left (it is what
    # exposes a second booking); the timer comes last; the others in a random order.
    middle = [m for m in KILL_POINTS if m not in ("after-effect", "timer")]
    rng.shuffle(middle)
    plan = ["after-effect", *middle, "timer"]
    base_consumer = lab.kafka.consumer_config(settings.group_id)
    lab.consumer_config(settings)  # fails early, in this process, if it drops base settings
    lives: list[Life] = []
    with tempfile.TemporaryDirectory(prefix="dojo-dlq-crash-") as tmp:
        for number, mode in enumerate(plan, start=1):
            kill = {"mode": mode, "n": rng.randint(1, 3) if mode in ("after-effect",
                                                                  "after-ack")
                    else rng.randint(2, 6), "seconds": rng.uniform(0.1, 0.5)}
            log_path = str(Path(tmp) / f"life{number}.jsonl")
            spec = {"db_url": database.url, "consumer_base": base_consumer,
                    "producer_base": lab.kafka.producer_config(), "partitions": 3,
                    "settings": {**asdict(settings)}, "scripts": scripts,
                    "ends": lab.ends[topics.source], "kill": kill, "log": log_path,
                    "timeout": 8.0}
            result = run_in_subprocess(f"{CHECKS_DIR / '_crash.py'}:consumer_life", spec,
                                       path=[lab.learner.dir, CHECKS_DIR], timeout=20)
            ended, polled, acks, commits = describe_life(read_jsonl(log_path), result)
            aim = AIM[mode].format(n=kill["n"], s=kill["seconds"])
            lives.append(Life(number, aim, ended, polled, acks, commits,
                              committed_offsets(base_consumer, settings.group_id,
                                                topics.source, 3)))
    downstream = ScriptedDownstream(lab.payments, clock, scripts)
    final = lab.run(ledger_db, topics, settings, downstream, clock, timeout=15)
    lives.append(Life(len(lives) + 1, "none: a clean run to the end",
                      f"{final.outcome} (in the checker's process)",
                      len(final.consumer.delivered),
                      sum(1 for p in final.producer.produced if p.acked_at and not p.error),
                      len(final.consumer.commits), final.committed))
    poison = sum(1 for i in inputs if i.label not in ("healthy", "transient"))
    dlt = lab.read(topics.dead_letter, topics.partitions, expect=poison)
    verdict = judge(inputs, ledger(ledger_db), dlt, lives)
    story = report(verdict, lives, seed)
    record_property("dojo_summary", verdict.counts())
    if not verdict.ok:
        raise CheckFailure(
            "The check ran your consumer in child processes and killed each with SIGKILL at a "
            "different point, then let a last one finish. From the ledger, the DLT and the "
            "committed offsets it judged every input: booked exactly once, or in the DLT.",
            expected="LOST 0 and DUPLICATED 0 (a duplicate DLT record is fine; a second booking "
                     "is not: make the effect idempotent, stage idempotent-effect)",
            actual=verdict.counts(), evidence=story, lesson=SEE)
    require_done(final, inputs, downstream, read=SEE, why="The last, clean run did not finish.")
