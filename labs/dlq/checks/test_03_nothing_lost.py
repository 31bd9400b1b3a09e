"""Stage nothing-lost: an offset is committed only after its record was booked or its DLT
write acknowledged; a failed DLT write means no commit and a redelivery; kill -9 at random
points loses nothing and books nothing twice."""

from __future__ import annotations

import dataclasses
import random
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest
from _history import (
    Life,
    committed_at_start,
    describe_life,
    judge,
    report,
)
from _support import (
    CHECKS_DIR,
    MISTAKES,
    READ,
    CommitAudit,
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
from confluent_kafka import KafkaError, Message, Producer

from dojo.checks import CheckFailure, NotWritten
from dojo.checks.faults import run_in_subprocess, unreachable_bootstrap
from dojo.checks.observers import ProducerTap, committed_offsets, offsets_text, read_jsonl

pytestmark = pytest.mark.stage("nothing-lost")
SEE = READ["nothing-lost"]


class CommitModes:
    """The learner's consumer, counting commit() calls that only queue the commit
    (confluent-kafka's default is asynchronous=True)."""

    def __init__(self, consumer: Any) -> None:
        self._consumer = consumer
        self.calls = self.asynchronous = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._consumer, name)

    def commit(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        if kwargs.get("asynchronous", True):
            self.asynchronous += 1
        return self._consumer.commit(*args, **kwargs)


class RefusingBroker:
    """A DLT producer whose broker refuses every record for `topic` in the delivery report,
    at once (as a broker does for a record above the topic's max.message.bytes): the report
    is served by the next poll() or flush(), and flush() then returns 0. Records for other
    topics go to the real producer."""

    def __init__(self, producer: Any, topic: str) -> None:
        self._producer = producer
        self._topic = topic
        self._reports: list[tuple[Any, Any]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._producer, name)

    def __len__(self) -> int:
        return len(self._reports) + len(self._producer)

    def produce(self, *args: Any, **kwargs: Any) -> Any:
        names = ("topic", "value", "key", "partition")
        given = {**dict(zip(names, args, strict=False)),
                 **{k: kwargs[k] for k in names if k in kwargs}}
        if given.get("topic") != self._topic:
            return self._producer.produce(*args, **kwargs)
        error = KafkaError(KafkaError.MSG_SIZE_TOO_LARGE)
        partition = given.get("partition")
        refusal = Message(topic=self._topic, partition=-1 if partition is None else partition,
                         offset=-1001, key=given.get("key"), value=given.get("value"),
                         headers=kwargs.get("headers"), error=error)
        self._reports.append((kwargs.get("on_delivery") or kwargs.get("callback"), refusal))
        return None

    def _serve(self) -> int:
        reports, self._reports = self._reports, []
        for callback, refusal in reports:
            if callback is not None:
                callback(refusal.error(), refusal)
        return len(reports)

    def poll(self, timeout: float | None = None) -> int:
        return self._serve() + self._producer.poll(0)

    def flush(self, timeout: float | None = None) -> int:
        self._serve()
        return self._producer.flush() if timeout is None else self._producer.flush(timeout)


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
    # The broker takes 0.3 s to acknowledge each DLT write, as a loaded one would.
    downstream = ScriptedDownstream(lab.payments, clock)
    audit = CommitAudit(lab, ledger_db, topics, clock, hold_acks=0.3)
    calls = CommitModes(lab.source_consumer(settings, topics))
    run = lab.run(ledger_db, topics, settings, downstream, clock, producer=audit.producer,
                  before_commit=audit, consumer=calls)
    require_done(run, inputs, downstream, read=SEE)
    if calls.asynchronous:
        raise CheckFailure(
            "consumer.commit() was called without asynchronous=False: it only queued the "
            "commit and returned before the broker had the offset. A kill right after it "
            "redelivers what the consumer thought finished, a close can drop the last one, "
            "and a commit the broker refuses fails silently instead of in your code. Commit "
            "with consumer.commit(message=msg, asynchronous=False).",
            expected="every commit() synchronous (asynchronous=False)",
            actual=f"{calls.asynchronous} of {calls.calls} commit() call(s) asynchronous",
            lesson=SEE)
    violations = audit.violations
    if violations:
        raise CheckFailure(
            "At every commit the check looked at the database and at the acknowledgements your "
            "producer had handed back. Some commits covered records that were neither booked nor "
            "acknowledged by the DLT: a crash right then loses them. Commit only after the DLT's "
            "acknowledgement (flush() returned and the delivery callback reported no error).",
            expected="every record below a committed offset is booked or acknowledged by the DLT",
            actual=f"{len(violations)} commit(s) ran ahead of the acknowledgement",
            evidence=audit.table() + "\nwhat happened:\n"
                     + timeline(run, downstream, inputs, limit=14), lesson=SEE)


def test_failed_dead_letter_write_is_not_committed(lab, ledger_db, clock):
    topics = lab.topics()
    settings = lab.settings(topics)
    # The poison is 3 KB of bytes: the second broken producer below refuses it as too large.
    poison_item = undecodable("poison-u1", partition=0, size=3000)
    items = [healthy("acc-1", partition=0), poison_item,
             healthy("acc-2", partition=0), healthy("acc-3", partition=1),
             healthy("acc-4", partition=2)]
    inputs = lab.produce(topics.source, items)
    poison = inputs[1]
    downstream = ScriptedDownstream(lab.payments, clock)

    # 0. The DLT's broker does not answer within settings.dead_letter_timeout_seconds: flush()
    #    returns with the record still queued and no delivery report at all (it comes, an
    #    error, only after message.timeout.ms). No report is no acknowledgement.
    silent = ProducerTap(Producer(lab.producer_config(
        **{"bootstrap.servers": unreachable_bootstrap(), "message.timeout.ms": 1700,
           "log_level": 0})), clock)
    quick = dataclasses.replace(settings, dead_letter_timeout_seconds=0.3)

    def waited_out() -> bool:  # the first write's timeout has passed: it failed or it lied
        writes = silent.to(topics.dead_letter)
        return bool(writes) and clock.monotonic() - writes[0].at >= 0.3

    zeroth, ended, committed = lab.run_until_stopped(
        ledger_db, topics, quick, downstream, clock, producer=silent, timeout=3.0,
        stop_when=waited_out)
    reported = [p for p in silent.to(topics.dead_letter) if p.acked_at is not None]
    silent.purge()
    if not (committed.get(0, -1) <= poison.offset):
        raise CheckFailure(
            "The DLT's broker did not answer: flush(timeout) returned after "
            "settings.dead_letter_timeout_seconds (0.3 s here) with the record still queued "
            "and no delivery report at all, yet the record's offset was committed. If the "
            "queued record later expires, it is in neither the ledger nor the DLT: LOST. The "
            "DLT acknowledged only when the delivery callback ran with no error; no callback "
            "within the timeout is a failed write.",
            expected=f"p0 committed at most up to {poison.offset} (the poison's offset)",
            actual=f"committed {offsets_text(committed)} ({ended}); "
                   f"{len(silent.to(topics.dead_letter))} DLT write(s), "
                   f"{len(reported)} with a delivery report when the commit came",
            evidence=timeline(zeroth, downstream, inputs) if zeroth else "", lesson=MISTAKES)

    # 1. The DLT's broker is unreachable: each write's delivery report says it timed out.
    unreachable = ProducerTap(Producer(lab.producer_config(
        **{"bootstrap.servers": unreachable_bootstrap(), "message.timeout.ms": 300,
           "log_level": 0})), clock)
    first, ended, committed = lab.run_until_stopped(ledger_db, topics, settings, downstream,
                                                    clock, producer=unreachable, timeout=1.5)
    unreachable.purge()
    failed = [p for p in unreachable.to(topics.dead_letter) if p.error]
    if not (committed.get(0, -1) <= poison.offset):
        said = f"; its delivery report said: {failed[0].error}" if failed else ""
        raise CheckFailure(
            "The DLT write of an undecodable record failed (its broker was unreachable), yet the "
            "record's offset was committed: the record is in neither the ledger nor the DLT, and "
            "Kafka will never deliver it again. It is LOST. A write succeeded only when its "
            "delivery callback reported no error (flush() returning zero says only that nothing "
            "is queued any more); when it failed, do not commit: write again with backoff, or "
            "stop and let the record be redelivered.",
            expected=f"p0 committed at most up to {poison.offset} (the poison's offset)",
            actual=f"committed {offsets_text(committed)} ({ended}); "
                   f"{len(unreachable.to(topics.dead_letter))} DLT write(s), "
                   f"{len(failed)} reported failed" + said,
            evidence=timeline(first, downstream, inputs) if first else "", lesson=MISTAKES)

    # 1b. The DLT's broker answers at once and refuses every write in its delivery report
    #    (MSG_SIZE_TOO_LARGE: the topic's max.message.bytes is below the record's size, a
    #    refusal no delivery.timeout.ms waits out). flush() returns 0 right away: nothing is
    #    queued any more, and nothing arrived either.
    refused = ProducerTap(RefusingBroker(lab.dlt_producer(), topics.dead_letter), clock)
    wanted = 20
    refusal, ended, committed = lab.run_until_stopped(
        ledger_db, topics, settings, downstream, clock, producer=refused, timeout=3.0,
        stop_when=lambda: len(refused.to(topics.dead_letter)) >= wanted)
    writes = refused.to(topics.dead_letter)
    reported = [p for p in writes if p.error]
    if not (committed.get(0, -1) <= poison.offset) and len(writes) > 1:
        raise CheckFailure(
            f"The DLT's broker refused the poison {len(writes)} times in a row, each time "
            "at once in the delivery report (MSG_SIZE_TOO_LARGE: the topic accepts smaller "
            "records), and the consumer then committed past it: the record is in neither the "
            "ledger nor the DLT. It is LOST. A DLT that keeps failing stops the partition, "
            "which is what an alert on lag is for; it never justifies moving on without the "
            "record.",
            expected=f"p0 committed at most up to {poison.offset} after any number of refused "
                     "writes",
            actual=f"committed {offsets_text(committed)} ({ended}); {len(writes)} DLT "
                   f"write(s), {len(reported)} refused in their delivery report",
            evidence=timeline(refusal, downstream, inputs) if refusal else "",
            lesson=MISTAKES)
    if not (committed.get(0, -1) <= poison.offset):
        raise CheckFailure(
            "The DLT's broker answered the poison's write at once with a refusal in the "
            "delivery report (MSG_SIZE_TOO_LARGE: the topic accepts smaller records), so "
            "flush() returned 0 right away, and the record's offset was committed after that "
            "one write: it is in neither the ledger nor the DLT. It is LOST. flush() returning "
            "0 says only that nothing is queued any more, a refused record included; the "
            "write succeeded only when its delivery callback reported no error.",
            expected=f"p0 committed at most up to {poison.offset} (the poison's offset)",
            actual=f"committed {offsets_text(committed)} ({ended}); {len(writes)} DLT "
                   f"write(s), {len(reported)} refused in their delivery report",
            evidence=timeline(refusal, downstream, inputs) if refusal else "",
            lesson=MISTAKES,
            fix="read the error the delivery callback (on_delivery) hands you and raise "
                "unless it is None, whatever flush() returned" if writes and reported
                else None)

    # 2. The DLT keeps refusing the record (larger than the producer's message.max.bytes):
    #    no number of refusals in a row makes the consumer give up on it: 500 of them (far
    #    past any round limit, and over ten minutes of backoff on the clock) take about a
    #    second of real time, since a refusal is immediate and the clock skips every wait.
    refusing = ProducerTap(Producer(lab.producer_config(**{"message.max.bytes": 1000})),
                           clock)
    wanted = 500
    second, ended, committed = lab.run_until_stopped(
        ledger_db, topics, settings, downstream, clock, producer=refusing, timeout=8.0,
        stop_when=lambda: len(refusing.to(topics.dead_letter)) >= wanted)
    tries = len(refusing.to(topics.dead_letter))
    if ended.startswith("run() raised"):  # (giving up and committing: LOST, below)
        raise CheckFailure(
            "produce() refused the poison's DLT write by raising (KafkaException "
            "MSG_SIZE_TOO_LARGE: it is larger than the producer's message.max.bytes), and the "
            f"consumer died on it after {tries} attempt(s). A DLT write failed when "
            "produce() raised anything, a BufferError or a KafkaException alike, as when the "
            "delivery callback reported an error: back off and write again, however many "
            "times it takes, until it succeeds or should_stop() says stop.",
            expected=f"at least {wanted} DLT writes of the poison, run() running until "
                     "should_stop()",
            actual=f"{tries} DLT write(s); {ended}",
            evidence=timeline(second, downstream, inputs, limit=16) if second else "",
            lesson=SEE)
    if not (committed.get(0, -1) <= poison.offset):
        raise CheckFailure(
            f"The DLT refused the record {tries} times in a row (it is larger than the "
            "producer's message.max.bytes), and the consumer then committed past it: the "
            "record is in neither the ledger nor the DLT. It is LOST. A DLT that keeps failing "
            "stops the partition, which is what an alert on lag is for; it never justifies "
            "moving on without the record.",
            expected=f"p0 committed at most up to {poison.offset} after any number of failed "
                     "writes",
            actual=f"committed {offsets_text(committed)} ({ended})",
            evidence=timeline(second, downstream, inputs, limit=16) if second else "",
            lesson=MISTAKES)

    downstream = ScriptedDownstream(lab.payments, clock)
    third = lab.run(ledger_db, topics, settings, downstream, clock)
    require_done(third, inputs, downstream, read=SEE, why=(
        "The last run had a working DLT producer and the same group: it should pick up "
        "the record whose DLT writes had failed."))
    dlt = lab.read(topics.dead_letter, topics.partitions, fence=True)
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


def test_a_stop_between_retries_leaves_the_record_uncommitted(lab, ledger_db, clock):
    topics = lab.topics()
    settings = lab.settings(topics)  # 4 attempts
    flaky = healthy("acc-1", 4321, label="transient", partition=0)
    items = [healthy("acc-2", 1111, partition=1), flaky, healthy("acc-3", 2222, partition=0)]
    inputs = lab.produce(topics.source, items)
    stop: dict[str, Any] = {"now": False, "at": None}

    def on_call(call):
        if call.event_id == flaky.event_id and not stop["now"] and \
                len(downstream.authorizations(flaky.event_id)) >= 2:
            stop["now"] = True  # shutting down during its second attempt, before a wait
            stop["at"] = clock.monotonic()

    downstream = ScriptedDownstream(lab.payments, clock, {flaky.event_id: ["timeout"] * 3},
                                    on_call=on_call)
    run = lab.run(ledger_db, topics, settings, downstream, clock, timeout=6,
                  stop_when=lambda: stop["now"])
    held = inputs[1]
    dlt = lab.read(topics.dead_letter, topics.partitions, fence=True)
    in_dlt = 1 in match_dlt(inputs, dlt)
    committed = run.committed.get(held.partition, -1)
    if in_dlt or committed > held.offset:
        raise CheckFailure(
            f"should_stop() said stop while {held.describe()} waited for its third attempt "
            "(two transient failures, two retries left). An unfinished record stays "
            "uncommitted: the next consumer gets it again and finishes its retries. Sending it "
            "to the DLT instead dead-letters a healthy payment because of a deploy."
            if in_dlt else
            f"should_stop() said stop while {held.describe()} waited for its third attempt, "
            "and its offset was committed though it was neither booked nor dead-lettered: it "
            "is LOST.",
            expected=f"{held.describe()} not in the DLT and p{held.partition} committed at "
                     f"most up to {held.offset}",
            actual=("it is in the DLT; " if in_dlt else "") +
                   f"p{held.partition} committed up to {max(committed, 0)}",
            evidence="what happened (clock time):\n" + timeline(run, downstream, inputs,
                                                                 limit=14), lesson=SEE)
    slept = [s for at, s in clock.sleeps
             if stop["at"] is not None and at >= stop["at"] and s > 0]
    if slept:
        raise CheckFailure(
            f"should_stop() turned true during {held.describe()}'s second attempt; when the "
            f"attempt failed, the consumer slept {slept[0]:.2f} s (clock.sleep) before it "
            "returned. A stop (a deploy, a rebalance) then waits out a whole backoff, up to "
            "max_backoff, and the shutdown or the partition's new owner waits with it. Ask "
            "should_stop() before every wait, not after it.",
            expected="no clock.sleep() once should_stop() says stop",
            actual=f"{len(slept)} sleep(s) after it: "
                   + ", ".join(f"{s:.2f} s" for s in slept[:5]),
            evidence="what happened (clock time):\n" + timeline(run, downstream, inputs,
                                                                limit=14),
            fix="call should_stop() right before clock.sleep() and return, leaving the record "
                "uncommitted, when it says stop", lesson=SEE)
    again = ScriptedDownstream(lab.payments, clock)
    after = lab.run(ledger_db, topics, settings, again, clock)
    require_done(after, inputs, again, read=SEE, why=(
        "The next run should pick the record up where the stopped one left it."))
    booked = applied_ids(ledger_db)
    if len(booked.get(flaky.event_id or "", [])) != 1:
        raise CheckFailure(
            "The record a stop left unfinished is booked by the next run, once.",
            expected=f"{held.describe()} booked once",
            actual=f"{len(booked.get(flaky.event_id or '', []))} ledger rows",
            evidence=timeline(after, again, inputs, limit=12), lesson=SEE)


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


def test_kill_nine_at_random_points_loses_nothing(lab, ledger_db, ledger_database, clock,
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
        specs, aims = [], []
        for number, mode in enumerate(plan, start=1):
            kill = {"mode": mode, "n": rng.randint(1, 3) if mode in ("after-effect",
                                                                  "after-ack")
                    else rng.randint(2, 6), "seconds": rng.uniform(0.1, 0.5)}
            specs.append({"db_url": ledger_database.url, "consumer_base": base_consumer,
                          "producer_base": lab.kafka.producer_config(), "partitions": 3,
                          "settings": {**asdict(settings)}, "scripts": scripts,
                          "ends": lab.ends[topics.source], "kill": kill,
                          "log": str(Path(tmp) / f"life{number}.jsonl"), "timeout": 8.0,
                          "life_seconds": 20.0})
            aims.append(AIM[mode].format(n=kill["n"], s=kill["seconds"]))
        result = run_in_subprocess(f"{CHECKS_DIR / '_crash.py'}:consumer_lives", specs,
                                   path=[lab.learner.dir, CHECKS_DIR], timeout=90)
        if result.value is None:
            raise CheckFailure(
                "The check could not start your consumer in a child process.",
                expected="consumer.py and payments.py import and run in a fresh process",
                actual=(result.error or result.stderr or "no output").strip().splitlines()[-1],
                evidence=(result.error or result.stderr or "")[-1500:], lesson=SEE)
        logs = [read_jsonl(spec["log"]) for spec in specs]
        for number, (_spec, outcome) in enumerate(zip(specs, result.value, strict=False),
                                                 start=1):
            if outcome.get("stub"):
                raise NotWritten(*outcome["stub"])
            ended, polled, acks, commits = describe_life(logs[number - 1], outcome)
            after = committed_at_start(logs[number]) if number < len(logs) else None
            lives.append(Life(number, aims[number - 1], ended, polled, acks, commits,
                              after if after is not None else committed_offsets(
                                  base_consumer, settings.group_id, topics.source, 3)))
    downstream = ScriptedDownstream(lab.payments, clock, scripts)
    final = lab.run(ledger_db, topics, settings, downstream, clock, timeout=15)
    lives.append(Life(len(lives) + 1, "none: a clean run to the end",
                      f"{final.outcome} (in the checker's process)",
                      len(final.consumer.delivered),
                      sum(1 for p in final.producer.produced if p.acked_at and not p.error),
                      len(final.consumer.commits), final.committed))
    dlt = lab.read(topics.dead_letter, topics.partitions, fence=True)
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
