"""Stage order-per-key: once a key has a message in the DLT, its later messages are parked
there too while other keys flow; replay brings the key's messages back in their original
order; a head that fails again keeps its followers behind it; the replayer never lets a
key's later record overtake one that stays behind."""

from __future__ import annotations

import tempfile
from collections import Counter
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import pytest
from _support import (
    READ,
    CommitAudit,
    HookedProducer,
    PausedUntil,
    commit_group,
    craft_dead_letters,
    ledger,
    match_dlt,
    require_done,
)
from _tools import ScriptedDownstream, healthy, invalid, undecodable, with_label

from dojo.checks import CheckFailure, NotWritten, call, table
from dojo.checks.observers import ProducerTap
from dojo.checks.partitioning import partition_for

pytestmark = pytest.mark.stage("order-per-key")
SEE = READ["order-per-key"]
KEY = "acc-42"


def replay_all(lab, topics, group, clock, **options):
    """Run the learner's replay job over the DLT, and learn where the source now ends from
    the acknowledgements of what it re-published. Returns its report and what it sent."""
    module = lab.module("replay")
    options.setdefault("rate_per_second", 1000.0)
    sent = ProducerTap(lab.dlt_producer(), clock)
    report = call(module.replay, lab.kafka.consumer_config(), sent,
                  dead_letter_topic=topics.dead_letter, parking_lot_topic=topics.parking_lot,
                  group_id=group, clock=clock, **options)
    lab.learn_ends(topics, sent)
    return report, sent


def park_a_key(lab, engine, clock, *, audit=None, extra=(), followers=2, scripts=None,
               metrics=None, before=()):
    """acc-42's first deposit is declined; one or two more acc-42 payments and other keys
    follow (`before` items first, `extra` items at the end)."""
    topics = lab.topics()
    settings = lab.settings(topics)
    head = with_label(healthy(KEY, 10_000), "declined")
    behind = [healthy(KEY, 8_000, kind="withdrawal"), healthy(KEY, 500)][:followers]
    others = [healthy(f"acc-{n}", 100 + n) for n in range(1, 7)]
    items = [*before, others[0], head, others[1], behind[0], others[2], others[3],
             *behind[1:], others[4], others[5], *extra]
    followers = behind
    inputs = lab.produce(topics.source, items)
    downstream = ScriptedDownstream(lab.payments, clock,
                                    {head.event_id: ["declined"] * 9, **(scripts or {})})
    kwargs = {"producer": audit(topics).producer, "before_commit": audit(topics)} \
        if audit else {}
    run = lab.run(engine, topics, settings, downstream, clock, metrics=metrics, **kwargs)
    require_done(run, inputs, downstream, read=SEE)
    return topics, settings, inputs, head, followers, others


def key_order(engine, events):
    """The order in which the ledger booked these events (ledger ids), and the rows."""
    ids = {e.event_id: [r.id for r in ledger(engine) if r.event_id == e.event_id]
           for e in events}
    return ids


def order_table(events, ids, names):
    return table([(name, e.cents, ", ".join(map(str, ids.get(e.event_id, []))) or "not booked")
                  for name, e in zip(names, events, strict=True)],
                 ("message (in original order)", "cents", "ledger id"))


POISON_KEY = "acc-77"
STUCK_KEY = "acc-55"


def test_later_messages_of_a_parked_key_wait_in_the_dead_letter_topic(lab, ledger_db, clock):
    # acc-77's first record is not even a valid event: it parks its key all the same
    poison_head = invalid(POISON_KEY)
    poison_follower = healthy(POISON_KEY, 4_321)
    # acc-55's first payment times out on every attempt while ping() answers: dead-lettered
    # after its retries, it parks its key as much as a declined one does
    stuck_head = healthy(STUCK_KEY, 2_500, label="transient-exhausted")
    stuck_follower = healthy(STUCK_KEY, 1_200, kind="withdrawal")
    audits = {}

    def audit(topics):
        if "one" not in audits:
            audits["one"] = CommitAudit(lab, ledger_db, topics, clock)
        return audits["one"]

    metrics = call(lab.module("metrics").DeadLetterMetrics)
    topics, _, inputs, head, followers, others = park_a_key(
        lab, ledger_db, clock, audit=audit, metrics=metrics,
        extra=(poison_head, poison_follower, stuck_head, stuck_follower),
        scripts={stuck_head.event_id: ["timeout", "unavailable"] * 10})
    dlt = lab.read(topics.dead_letter, topics.partitions, fence=True)
    found = match_dlt(inputs, dlt)
    by_item = {id(i.item): n for n, i in enumerate(inputs)}
    booked = {r.event_id for r in ledger(ledger_db)}
    rows = []
    for name, item in [("head (declined)", head), ("follower 1", followers[0]),
                       ("follower 2", followers[1]),
                       (f"{POISON_KEY} head (invalid)", poison_head),
                       (f"{POISON_KEY} follower", poison_follower),
                       (f"{STUCK_KEY} head (timed out)", stuck_head),
                       (f"{STUCK_KEY} follower", stuck_follower)] + \
            [(f"other {o.account}", o) for o in others]:
        n = by_item[id(item)]
        kind = (found[n][0].text("kafka_dlt-exception-fqcn") or "?").rsplit(".", 1)[-1] \
            if n in found else ""
        rows.append((name, inputs[n].at, f"yes ({kind})" if n in found else "no",
                     "yes" if item.event_id in booked else "no"))
    key_ok = all(by_item[id(i)] in found and i.event_id not in booked
                 for i in [head, *followers])
    poison_ok = all(by_item[id(i)] in found and i.event_id not in booked
                    for i in (poison_head, poison_follower))
    stuck_ok = all(by_item[id(i)] in found and i.event_id not in booked
                   for i in (stuck_head, stuck_follower))
    others_ok = all(by_item[id(o)] not in found and o.event_id in booked for o in others)
    parked_as = {n: (found[n][0].text("kafka_dlt-exception-fqcn") or "")
                 for n in (by_item[id(i)] for i in (*followers, poison_follower, stuck_follower))
                 if n in found}
    not_parked_kind = [inputs[n].describe() for n, fq in parked_as.items()
                       if not fq.endswith(".KeyParked")]

    def fate(item):
        where = "dead-lettered" if by_item[id(item)] in found else "not dead-lettered"
        return f"{where}, {'booked' if item.event_id in booked else 'not booked'}"

    if key_ok and others_ok and not poison_ok:
        raise CheckFailure(
            f"{POISON_KEY}'s first record could not be parsed and went to the DLT, and the "
            "payment behind it, of the same key, was booked. Whatever sends a record of a "
            "key to the DLT parks the key: a malformed event is still that account's event, "
            "and a fixed copy of it may come back by replay.",
            expected=f"both {POISON_KEY} records in the DLT, the second as KeyParked; none "
                     "booked",
            actual=f"head (invalid): {fate(poison_head)}; follower: {fate(poison_follower)}",
            evidence=table(rows, ("message", "at", "in DLT", "booked")),
            lesson=SEE)
    if key_ok and others_ok and poison_ok and not stuck_ok:
        raise CheckFailure(
            f"{STUCK_KEY}'s first payment timed out on every attempt (ping() answered: not an "
            "outage) and went to the DLT after its retries, and the withdrawal behind it, of "
            "the same key, was booked. Any dead letter parks its key, whatever the reason: a "
            "transient failure that ran out of attempts leaves a hole in the key's order "
            "just as a decline does, and its replayed copy would land after the withdrawal.",
            expected=f"both {STUCK_KEY} records in the DLT, the second as KeyParked; none "
                     "booked",
            actual=f"head (timed out): {fate(stuck_head)}; follower: {fate(stuck_follower)}",
            evidence=table(rows, ("message", "at", "in DLT", "booked")),
            lesson=SEE)
    if not (key_ok and others_ok):
        raise CheckFailure(
            f"{KEY}'s deposit was dead-lettered; the withdrawal behind it would run against a "
            "balance without that deposit. Park the key: its later messages go to the DLT too "
            "(exception payments.KeyParked) until a replay brings the key back in order. Other "
            "keys are not affected.",
            expected=f"all three {KEY} messages in the DLT, none booked; every other key booked, "
                     "none dead-lettered",
            actual=f"head: {fate(head)}; next: {fate(followers[0])}; last: "
                   f"{fate(followers[1])}; other keys: "
                   + ("; ".join(f"{o.account} {fate(o)}" for o in others
                                if by_item[id(o)] in found or o.event_id not in booked)
                      or "all booked, none dead-lettered"),
            evidence=table(rows, ("message", "at", "in DLT", "booked")),
            lesson=SEE)
    if not_parked_kind:
        raise CheckFailure(
            "A record dead-lettered because its key is parked says so: its "
            "kafka_dlt-exception-fqcn is payments.KeyParked, so replay and the person reading "
            "the DLT tell it from a record that failed on its own.",
            expected="KeyParked on every record parked behind its key",
            actual=f"{len(not_parked_kind)} without it: {', '.join(not_parked_kind)}",
            evidence=table(rows, ("message", "at", "in DLT", "booked")), lesson=SEE)
    in_dlt = Counter((r.text("kafka_dlt-exception-fqcn") or "?").rsplit(".", 1)[-1]
                     for r in dlt)
    counted = Counter({str(k).rsplit(".", 1)[-1]: n for k, n in call(metrics.counts).items()})
    if +counted != +in_dlt:
        raise CheckFailure(
            "The dead-letter counter does not agree with the DLT. A record parked behind its "
            "key is a dead-letter write like any other: count it under its class name "
            "(KeyParked) once the DLT acknowledged it. The alert and the dashboards read the "
            "counter, and a parked key is what someone must look at.",
            expected=str(dict(sorted(in_dlt.items()))),
            actual=f"counts() == {dict(sorted(counted.items()))}",
            evidence=table([(k, in_dlt.get(k, 0), counted.get(k, 0))
                            for k in sorted(set(in_dlt) | set(counted))],
                           ("exception type", "in the DLT", "counted")),
            lesson=READ["visibility"])
    violations = audits["one"].violations
    if violations:
        raise CheckFailure(
            "At every commit the check looked at the ledger and at the DLT's "
            "acknowledgements. A record parked behind its key was committed before the DLT "
            "had acknowledged it: a crash right then loses it, and its key never comes back "
            "in order. Parking is a dead-letter write like any other: commit after the "
            "acknowledgement.",
            expected="every record below a committed offset booked or acknowledged by the DLT",
            actual=f"{len(violations)} commit(s) ran ahead", evidence=audits["one"].table(),
            lesson=SEE)


def test_replay_restores_a_keys_order(lab, ledger_db, clock):
    topics, settings, inputs, head, followers, others = park_a_key(lab, ledger_db, clock)
    late = lab.produce(topics.source, [healthy(KEY, 700)])  # arrives while the key is parked
    inputs += late
    gateway = ScriptedDownstream(lab.payments, clock)  # fixed: nothing is declined now
    run = lab.run(ledger_db, topics, settings, gateway, clock)
    require_done(run, inputs, gateway, read=SEE)
    report, _ = replay_all(lab, topics, lab.kafka.group_id("dlt-replayer"), clock)
    run = lab.run(ledger_db, topics, settings, gateway, clock, timeout=15)
    require_done(run, inputs, gateway, read=SEE, why="The replayed messages came back.")
    events = [head, *followers, late[0].item]
    names = ["deposit 100.00 (was declined)", "withdrawal 80.00", "deposit 5.00",
             "deposit 7.00 (arrived while parked)"]
    ids = key_order(ledger_db, events)
    firsts = [v[0] if len(v) == 1 else None for v in ids.values()]
    in_order = None not in firsts and firsts == sorted(f for f in firsts if f is not None)
    others_once = all(len(v) == 1 for v in key_order(ledger_db, others).values())
    if not (in_order and others_once):
        raise CheckFailure(
            f"After the fix, replay brings {KEY}'s messages back and the consumer books them in "
            "their original order, each once: the head first, then what was parked behind it, "
            "including the one that arrived while the key was parked. Other keys stay booked "
            "once.",
            expected="four ledger rows for the key, ids ascending in the original order",
            actual=f"replay reported {report!r}; ledger ids per message: "
                   f"{[ids[e.event_id] for e in events]}; other keys booked once: {others_once}",
            evidence=order_table(events, ids, names), lesson=SEE)
    after = lab.produce(topics.source, [healthy(KEY, 900)])
    run = lab.run(ledger_db, topics, settings, gateway, clock)
    require_done(run, inputs + after, gateway, read=SEE)
    booked = {r.event_id for r in ledger(ledger_db)}
    if after[0].item.event_id not in booked:
        raise CheckFailure(
            f"Once every parked message of {KEY} was booked, the key is free again: a new "
            "payment is booked straight away, not parked.",
            expected="the new payment booked", actual="it was not (still parked?)", lesson=SEE)


def test_a_head_that_fails_again_keeps_its_followers_behind(lab, ledger_db, clock):
    topics, settings, inputs, head, followers, _ = park_a_key(lab, ledger_db, clock)
    group = lab.kafka.group_id("dlt-replayer")
    replay_all(lab, topics, group, clock)  # too early: the cause is not fixed yet
    still = ScriptedDownstream(lab.payments, clock, {head.event_id: ["declined"] * 9})
    run = lab.run(ledger_db, topics, settings, still, clock, timeout=15)
    require_done(run, inputs, still, read=SEE)
    events = [head, *followers]
    names = ["deposit 100.00 (declined again)", "withdrawal 80.00", "deposit 5.00"]
    ids = key_order(ledger_db, events)
    if any(ids.values()):
        raise CheckFailure(
            f"The replay came too early: {KEY}'s head was declined again and went back to the "
            "DLT. Its followers, replayed right behind it, must not be booked now: they would "
            "overtake it. Only a replayed copy of the key's head may leave the park; the rest "
            "go back to the DLT behind it.",
            expected=f"none of {KEY}'s messages booked", actual="some were",
            evidence=order_table(events, ids, names), lesson=SEE)
    replay_all(lab, topics, group, clock)  # after the fix, the same job carries on
    fixed = ScriptedDownstream(lab.payments, clock)
    run = lab.run(ledger_db, topics, settings, fixed, clock, timeout=15)
    require_done(run, inputs, fixed, read=SEE)
    ids = key_order(ledger_db, events)
    firsts = [v[0] if len(v) == 1 else None for v in ids.values()]
    if None in firsts or firsts != sorted(f for f in firsts if f is not None):
        raise CheckFailure(
            "After the fix and a second replay the key's messages are booked once each, in "
            "their original order.", expected="ledger ids ascending, one per message",
            actual=str([ids[e.event_id] for e in events]),
            evidence=order_table(events, ids, names), lesson=SEE)
    after = lab.produce(topics.source, [healthy(KEY, 1_999)])
    run = lab.run(ledger_db, topics, settings, fixed, clock)
    require_done(run, inputs + after, fixed, read=SEE)
    if after[0].item.event_id not in {r.event_id for r in ledger(ledger_db)}:
        raise CheckFailure(
            f"Every parked message of {KEY} is booked now, yet a new payment of the key was "
            "parked: the key never came free. When the replayed head failed again it was "
            "counted as one more waiting message, though its first DLT copy was counted "
            "already (it stays the head; nothing new waits).",
            expected="the new payment booked straight away",
            actual="it was dead-lettered as parked", lesson=SEE)


def test_a_redelivered_replayed_head_is_counted_once(lab, ledger_db, clock):
    topics, settings, inputs, head, followers, _ = park_a_key(lab, ledger_db, clock,
                                                              followers=1)
    # After the fix, a replay job for declined payments brings back the head alone.
    report, sent = replay_all(lab, topics, lab.kafka.group_id("dlt-declined"), clock,
                              exception_types={"PaymentDeclined"})
    fixed = ScriptedDownstream(lab.payments, clock)
    run = lab.run(ledger_db, topics, settings, fixed, clock, timeout=15)
    require_done(run, inputs, fixed, read=SEE)
    copies = [p for p in sent.to(topics.source)
              if p.value == head.value and p.acked_offset is not None]
    replayed = copies[-1] if copies else None
    booked = {r.event_id for r in ledger(ledger_db)}
    if head.event_id not in booked or replayed is None:
        raise CheckFailure(
            f"A replay of the declined payments brought {KEY}'s head back; it must be booked "
            "(its followers still wait in the DLT).",
            expected="the head booked", actual=f"not booked; replay reported {report!r}",
            lesson=SEE)
    # The consumer crashed after booking the replayed head, before committing it: the same
    # record comes again.
    commit_group(lab, settings.group_id, topics.source,
                 {replayed.acked_partition: replayed.acked_offset})
    run = lab.run(ledger_db, topics, settings, fixed, clock, timeout=15)
    require_done(run, inputs, fixed, read=SEE)
    late = lab.produce(topics.source, [healthy(KEY, 2_468)])
    run = lab.run(ledger_db, topics, settings, fixed, clock, timeout=15)
    require_done(run, inputs + late, fixed, read=SEE)
    booked = {r.event_id for r in ledger(ledger_db)}
    early = [e for e in (*followers, late[0].item) if e.event_id in booked]
    if early:
        raise CheckFailure(
            f"The replayed head of {KEY} was booked, then delivered again (a crash before its "
            "commit). The redelivery counted as a second release: the key came free while "
            f"its follower still waits in the DLT, and a new payment of {KEY} was "
            "booked ahead of it. A release must count once per record: guard it with the "
            "record's source offset, as every update of the parked state is.",
            expected=f"the new payment of {KEY} parked behind the follower, neither booked",
            actual="booked: " + ", ".join("the new payment" if e is late[0].item
                                          else "a follower" for e in early),
            lesson=SEE)


def test_a_replayed_duplicate_still_leaves_the_park(lab, ledger_db, clock):
    """A producer retry sends acc-42's first payment again, after the key was parked: the copy
    is parked behind the head, and on replay it is a duplicate (apply_once returns False) that
    must still count as one fewer waiting, as a head booked just before a crash must."""
    first = healthy(KEY, 1_357)
    topics, settings, inputs, head, followers, _ = park_a_key(
        lab, ledger_db, clock, followers=1, before=(first,), extra=(first,))
    report, _ = replay_all(lab, topics, lab.kafka.group_id("dlt-replayer"), clock)
    fixed = ScriptedDownstream(lab.payments, clock)
    run = lab.run(ledger_db, topics, settings, fixed, clock, timeout=15)
    require_done(run, inputs, fixed, read=SEE)
    late = lab.produce(topics.source, [healthy(KEY, 2_531)])
    run = lab.run(ledger_db, topics, settings, fixed, clock, timeout=15)
    require_done(run, inputs + late, fixed, read=SEE)
    events = [first, head, followers[0], late[0].item]
    names = ["deposit 13.57 (booked before the decline; its copy parked)",
             "deposit 100.00 (was declined)", "withdrawal 80.00",
             "deposit 25.31 (after the replay)"]
    ids = key_order(ledger_db, events)
    if any(len(v) != 1 for v in ids.values()):
        raise CheckFailure(
            f"{KEY}'s first payment was booked, then a copy of it (a producer retry) arrived "
            "after the key was parked and waited in the DLT behind the head. On replay that "
            "copy is a duplicate: apply_once books nothing, yet the record has left the DLT, "
            "so it is one fewer waiting all the same (as is a head booked just before a crash "
            "and delivered again). Counted only when something was booked now, the key never "
            "comes free.",
            expected="every payment of the key booked once, the one after the replay too",
            actual=f"replay reported {report!r}; ledger ids per message: "
                   f"{[ids[e.event_id] for e in events]}",
            evidence=order_table(events, ids, names), lesson=SEE)


def test_a_key_read_outside_its_partition_comes_back(lab, ledger_db, clock):
    """acc-42's producer placed its records in another partition than murmur2 gives the key,
    after other records; replay sends them to the key's partition, at lower offsets."""
    topics = lab.topics()
    settings = lab.settings(topics)
    home = partition_for(KEY.encode(), topics.partitions)
    placed = (home + 1) % topics.partitions
    head = with_label(healthy(KEY, 10_000, partition=placed), "declined")
    follower = healthy(KEY, 8_000, kind="withdrawal", partition=placed)
    fillers = [healthy(f"acc-{n}", 300 + n, partition=placed) for n in range(1, 6)]
    inputs = lab.produce(topics.source, [*fillers, head, follower])
    downstream = ScriptedDownstream(lab.payments, clock, {head.event_id: ["declined"] * 9})
    run = lab.run(ledger_db, topics, settings, downstream, clock)
    require_done(run, inputs, downstream, read=SEE)
    report, sent = replay_all(lab, topics, lab.kafka.group_id("dlt-replayer"), clock)
    fixed = ScriptedDownstream(lab.payments, clock)
    run = lab.run(ledger_db, topics, settings, fixed, clock, timeout=15)
    require_done(run, inputs, fixed, read=SEE)
    late = lab.produce(topics.source, [healthy(KEY, 1_733)])
    run = lab.run(ledger_db, topics, settings, fixed, clock, timeout=15)
    require_done(run, inputs + late, fixed, read=SEE)
    events = [head, follower, late[0].item]
    names = [f"deposit 100.00 (read at p{placed}@{inputs[-2].offset}, declined)",
             f"withdrawal 80.00 (read at p{placed}@{inputs[-1].offset})",
             "deposit 17.33 (after the replay)"]
    ids = key_order(ledger_db, events)
    firsts = [v[0] if len(v) == 1 else None for v in ids.values()]
    if None in firsts or firsts != sorted(f for f in firsts if f is not None):
        copies = [f"p{p.acked_partition}@{p.acked_offset}" for p in sent.to(topics.source)
                  if p.acked_offset is not None]
        raise CheckFailure(
            f"{KEY}'s records were read from p{placed}, where their producer had placed them "
            f"(offsets {inputs[-2].offset} and {inputs[-1].offset}); replay sent them to the "
            f"key's own partition p{home}, at {', '.join(copies) or 'offsets unknown'}. The "
            "key never left the park: an offset is a position in one partition, and one of "
            f"p{home} is not later or earlier than one of p{placed}. Guard the parked state "
            "with the offset per partition.",
            expected="the deposit, the withdrawal, then the later deposit booked once each",
            actual=f"replay reported {report!r}; ledger ids per message: "
                   f"{[ids[e.event_id] for e in events]}",
            evidence=order_table(events, ids, names), lesson=SEE)


def test_a_head_whose_dead_letter_write_failed_keeps_its_own_failure(lab, ledger_db, clock):
    """The DLT broker is unreachable while acc-42's declined deposit is dead-lettered; the
    consumer stops with it unfinished. The next life writes it with its own exception."""
    from confluent_kafka import Producer

    from dojo.checks.faults import unreachable_bootstrap

    topics = lab.topics()
    settings = lab.settings(topics)
    head = with_label(healthy(KEY, 10_000), "declined")
    follower = healthy(KEY, 8_000, kind="withdrawal")
    inputs = lab.produce(topics.source, [head, follower])
    downstream = ScriptedDownstream(lab.payments, clock, {head.event_id: ["declined"] * 9})
    broken = Producer(lab.producer_config(**{"bootstrap.servers": unreachable_bootstrap(),
                                             "message.timeout.ms": 300, "log_level": 0}))
    lab.run_until_stopped(ledger_db, topics, settings, downstream, clock, producer=broken,
                          timeout=1.1)
    broken.purge()
    run = lab.run(ledger_db, topics, settings, downstream, clock)  # the DLT is back
    require_done(run, inputs, downstream, read=SEE)
    dlt = lab.read(topics.dead_letter, topics.partitions, fence=True)
    found = match_dlt(inputs, dlt)
    rows = [(name, i.describe(), r.text("kafka_dlt-exception-fqcn"), r.text("x-dlt-attempts"))
            for name, n, i in (("head (declined)", 0, inputs[0]), ("follower", 1, inputs[1]))
            for r in found.get(n, [])]
    heads = [r.text("kafka_dlt-exception-fqcn") or "" for r in found.get(0, [])]
    if not heads or any(not h.endswith(".PaymentDeclined") for h in heads):
        raise CheckFailure(
            f"{KEY}'s declined deposit could not be written to the DLT (its broker was "
            "unreachable) and the consumer stopped with it unfinished. The next life "
            "dead-lettered it " + (f"as {', '.join(sorted(set(heads)))}" if heads else
                                   "not at all")
            + ": the key had been parked before the DLT acknowledged the head, and its "
            "redelivery was taken for a record parked behind its own key. Its cause "
            "(PaymentDeclined, attempts 1) is gone, and a replay filtered by that type "
            "never finds it. Park the key after the DLT acknowledged the head (and before "
            "the commit), or recognise the head when it comes again.",
            expected=f"{KEY}'s deposit in the DLT as payments.PaymentDeclined, the withdrawal "
                     "behind it as KeyParked",
            actual="the deposit " + (f"as {', '.join(heads)}" if heads else "not in the DLT"),
            evidence=table(rows, ("message", "input", "kafka_dlt-exception-fqcn",
                                  "x-dlt-attempts")), lesson=SEE)


CHECKS_DIR = Path(__file__).resolve().parent


def test_a_key_parked_by_another_process_comes_back(lab, ledger_database, clock):
    """The key is parked by one consumer process and its replayed head handled by another (a
    restart, a rebalance): what identifies the head must mean the same in every process."""
    from dojo.checks.faults import run_in_subprocess

    engine = ledger_database.engine
    topics = lab.topics()
    settings = lab.settings(topics)
    head = with_label(healthy(KEY, 10_000), "declined")
    follower = healthy(KEY, 8_000, kind="withdrawal")
    inputs = lab.produce(topics.source, [head, follower])
    with tempfile.TemporaryDirectory(prefix="dojo-dlq-park-") as tmp:
        spec = {"db_url": ledger_database.url,
                "consumer_base": lab.kafka.consumer_config(settings.group_id),
                "producer_base": lab.kafka.producer_config(),
                "partitions": topics.partitions, "settings": {**asdict(settings)},
                "scripts": {head.event_id: ["declined"] * 9},
                "ends": lab.ends[topics.source], "kill": {"mode": "none"},
                "log": str(Path(tmp) / "life.jsonl"), "timeout": 20.0, "life_seconds": 40.0}
        result = run_in_subprocess(f"{CHECKS_DIR / '_crash.py'}:consumer_lives", [spec],
                                   path=[lab.learner.dir, CHECKS_DIR], timeout=90)
    outcome = (result.value or [{}])[0]
    if outcome.get("stub"):
        raise NotWritten(*outcome["stub"])
    report, _ = replay_all(lab, topics, lab.kafka.group_id("dlt-replayer"), clock)
    fixed = ScriptedDownstream(lab.payments, clock)
    run = lab.run(engine, topics, settings, fixed, clock, timeout=15)
    require_done(run, inputs, fixed, read=SEE)
    events = [head, follower]
    ids = key_order(engine, events)
    if any(len(v) != 1 for v in ids.values()):
        dlt = lab.read(topics.dead_letter, topics.partitions, fence=True)
        raise CheckFailure(
            f"{KEY} was parked by a consumer in one process; after the fix and a replay, a "
            "consumer in another process did not take the replayed head for the head, so "
            f"nothing of {KEY} came back. What the parked-keys table keeps to recognise the "
            "head must be the same in every process: a digest of the value's bytes "
            "(hashlib), or its source position, not Python's hash(), which each process "
            "seeds anew (PYTHONHASHSEED).",
            expected="the deposit, then the withdrawal, booked once each",
            actual=f"replay reported {report!r}; ledger ids per message: "
                   f"{[ids[e.event_id] for e in events]}",
            evidence="DLT:\n" + table([(f"p{r.partition}@{r.offset}",
                                        r.text("kafka_dlt-exception-fqcn"),
                                        r.text("x-replay-count") or "")
                                       for r in dlt], ("record", "exception", "replay count"))
                     + "\nlife in the other process: "
                     + ((outcome.get("error") or "").strip()[-400:] or "ended cleanly"),
            lesson=SEE)


def _label(c: Any) -> str:
    key = c.item.key or b""
    name = key.decode("ascii") if key.isascii() else repr(key)
    return f"{name} {c.item.cents}"


def test_replay_keeps_a_keys_records_behind_its_head(lab, clock):
    topics = lab.topics()
    ff, fe = replace(healthy("acc-ff", 601), key=b"\xff"), replace(healthy("acc-fe", 501),
                                                                     key=b"\xfe")
    specs = [
        (healthy("acc-k", 101), "InvalidEvent", None),  # filtered out: stays behind
        (healthy("acc-k", 102), "KeyParked", None),
        (healthy("acc-l", 201), "DownstreamUnavailable", None),  # replayed
        (healthy("acc-k", 103), "KeyParked", None),
        (healthy("acc-l", 202), "KeyParked", None),
        (healthy("acc-m", 301), "DownstreamUnavailable", 3),  # at the cap: parking lot
        (healthy("acc-m", 302), "KeyParked", None),
        (healthy("acc-m", 303), "InvalidEvent", None),  # outside the filters, behind a park
        # two keys that are not UTF-8: b"\xff" stays behind, b"\xfe" is another key
        (ff, "InvalidEvent", None),
        (fe, "DownstreamUnavailable", None),
    ]
    dead = craft_dead_letters(lab, topics, specs)
    # acc-n's head has no origin headers: parked, and its follower behind it
    dead += craft_dead_letters(lab, topics, [(healthy("acc-n", 401), "DownstreamUnavailable",
                                              None)], origin=False)
    dead += craft_dead_letters(lab, topics, [(healthy("acc-n", 402), "KeyParked", None)])
    # acc-q's head is at the cap; its follower sits in another DLT partition (a DLT written by
    # another tool may put a key's records anywhere) and reaches the replay only once the head
    # went to the parking lot (that partition paused until then): it is the key's later
    # record, so it follows the head, though no partition of the DLT holds both
    head_q = partition_for(b"acc-q", topics.partitions)
    elsewhere = (head_q + 1) % topics.partitions
    dead += craft_dead_letters(lab, topics, [
        (healthy("acc-q", 701), "DownstreamUnavailable", 3),
        (healthy("acc-q", 702), "DownstreamUnavailable", None)],
        dlt_partitions=[None, elsewhere])
    group = lab.kafka.group_id("dlt-replayer")
    with PausedUntil(group, topics.dead_letter, elsewhere) as pause:
        def before(_: int) -> None:
            if hook.sending == dead[-2].item.value:
                pause.release()

        hook = HookedProducer(lab.dlt_producer(), clock, before)
        module = lab.module("replay")
        report = call(module.replay, lab.kafka.consumer_config(), hook,
                      dead_letter_topic=topics.dead_letter, parking_lot_topic=topics.parking_lot,
                      group_id=group, clock=clock, rate_per_second=1000.0, max_replays=3,
                      exception_types={"DownstreamUnavailable", "KeyParked"})
    back = lab.read(topics.source, topics.partitions, fence=True)
    order = [next((c for c in dead if c.item.value == r.value), None) for r in back]
    sent = [_label(c) for c in order if c is not None]
    evidence = table([(f"p{c.partition}@{c.offset}", _label(c).rsplit(" ", 1)[0],
                       c.item.cents, c.exception,
                       c.replays if c.replays is not None else "none")
                      for c in dead], ("DLT record", "key", "cents", "exception", "replays"),
                     limit=len(dead))
    wanted = ["acc-l 201", "acc-l 202", "b'\\xfe' 501"]
    in_order = [x for x in sent if x.startswith("acc-l")] == ["acc-l 201", "acc-l 202"]
    if sorted(sent) != sorted(wanted) or not in_order:
        overtook = [x for x in sent if x not in wanted]
        raise CheckFailure(
            "A key's later record must not be replayed while an earlier record of the same key "
            "stays behind: acc-k's head is filtered out (InvalidEvent), acc-m's and acc-q's "
            "heads are at the replay cap and acc-n's has no origin headers, all three go to "
            "the parking lot. Their followers would otherwise be booked before them. Decide "
            "per key (its bytes, whatever they are: b'\\xff' and b'\\xfe' are two keys), in "
            "the order the run reads the records, across the DLT's partitions (acc-q 702 sits "
            "in another partition than its head and reached the replay after it): once a "
            "record of a key is not re-published, none of that key's later records is "
            "re-published in this run.",
            expected="acc-l 201 then acc-l 202 re-published, and b'\\xfe' 501; nothing else",
            actual=f"re-published: {sent}; report {report!r}"
                   + ("" if pause.released_by_trigger else
                      f"; acc-q's head never reached the parking lot (p{elsewhere} resumed "
                      "after 1.5 s)"),
            evidence=evidence,
            fix="hold a key back behind a head parked for a missing origin too, not only at "
                "the cap" if overtook == ["acc-n 402"] else
                "hold a key back for the whole run, whichever DLT partition its later records "
                "sit in (one set of held-back keys per run, not one per partition)"
                if overtook == ["acc-q 702"] and pause.released_by_trigger else
                "key the held-back set by the key's bytes, not a decoded text"
                if "b'\\xfe' 501" not in sent and not overtook else None,
            lesson=SEE)
    # a head that went to the parking lot, where a person decides: its followers go there
    # behind it, whatever the filters say of them (skipped and committed, they would stay in
    # no flow at all). (The parking lot may have more partitions than the source; a park may
    # use any of them: the order is compared where a key's records share a partition.)
    lot = lab.read(topics.parking_lot,
                   max(topics.partitions, lab.partition_counts([topics.parking_lot])[
                       topics.parking_lot]), fence=True)
    lot = sorted(lot, key=lambda r: (r.partition, r.offset))
    lot_order = [next((c for c in dead if c.item.value == r.value), None) for r in lot]
    parked = [_label(c) for c in lot_order if c is not None]
    parked_at = {_label(c): r.partition for c, r in zip(lot_order, lot, strict=True)
                 if c is not None}
    want_lot = {"acc-m": ["acc-m 301", "acc-m 302", "acc-m 303"],
                "acc-n": ["acc-n 401", "acc-n 402"], "acc-q": ["acc-q 701", "acc-q 702"]}
    wrong = [key for key, want in want_lot.items()
             if [x for x in parked if x.startswith(key)] != want
             and (sorted(x for x in parked if x.startswith(key)) != want
                  or len({parked_at[x] for x in want}) == 1)]
    if wrong:
        missing = [x for key in wrong for x in want_lot[key] if x not in parked]
        raise CheckFailure(
            "A head that went to the parking lot (acc-m's and acc-q's at the replay cap, "
            "acc-n's without its origin headers) waits there for a person to decide. The "
            "records behind it go there behind it, in order, whatever the filters say of "
            "them (acc-m 303 is an InvalidEvent, outside this job's types): the person then "
            "has the key's records together. Skipped and committed, a follower stays in no "
            "flow at all: this job never reads it again, and nothing says it waits behind a "
            "parked head.",
            expected="the parking lot holds " + ", then ".join(
                x for key in wrong for x in want_lot[key]),
            actual=f"parking lot: {parked or 'nothing'}; report {report!r}",
            evidence=evidence,
            fix="a record behind a key held back by a park is parked too, before the filters "
                "decide; one behind a key filtered out is skipped like it"
                if missing and all(x.endswith(("302", "303", "402", "702")) for x in missing)
                else None,
            lesson=SEE)
    stray = [x for x in parked if not x.startswith(tuple(want_lot))]
    if stray:
        raise CheckFailure(
            "A record behind a head that was filtered out went to the parking lot. acc-k's "
            "head is outside this job's types: it is skipped, left in the DLT for another job, "
            "and its followers are skipped with it (held back, in the DLT behind it). Only a "
            "record behind a parked head follows it to the parking lot.",
            expected="nothing of acc-k in the parking lot",
            actual=f"parking lot: {parked}; report {report!r}",
            evidence=evidence,
            fix="hold a key back with the head's own decision: behind a skipped head skip, "
                "behind a parked head park",
            lesson=SEE)
    # the report: 3 re-published (acc-l 201, 202, b'\xfe' 501), 7 parked (acc-m 301-303,
    # acc-n 401-402, acc-q 701-702), 4 skipped (acc-k 101-103, b'\xff' 601)
    counts = tuple(getattr(report, name, None) for name in ("replayed", "parked", "skipped"))
    if counts != (3, 7, 4):
        raise CheckFailure(
            "The replay sent every record where it belonged, but its report counts otherwise. "
            "A record that went to the parking lot is parked, whatever sent it there: the cap, "
            "a missing origin, or a parked head of its key (acc-m 302 and 303, acc-n 402, "
            "acc-q 702). "
            "Skipped is only what the filters, or a key held back behind a skipped head, left "
            "out (acc-k's three records, b'\\xff' 601).",
            expected="ReplayReport(replayed=3, parked=7, skipped=4)",
            actual=f"{report!r}",
            evidence=evidence,
            fix="count a follower parked behind its key's head as parked, not skipped"
                if counts == (3, 3, 8) else None,
            lesson=SEE)


class _Crash(BaseException):
    """The check's stand-in for kill -9 at a chosen point: a BaseException, so no `except
    Exception` of the consumer catches it, and nothing after that point runs."""


class CrashAfterCommit:
    """The learner's consumer, stopped dead right after the offset commit that covers one
    record returned (the commit reached the broker; what run() meant to do next never
    happens)."""

    def __init__(self, consumer: Any, partition: int, offset: int) -> None:
        self._consumer, self.partition, self.offset = consumer, partition, offset
        self.crashed = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._consumer, name)

    def commit(self, *args: Any, **kwargs: Any) -> Any:
        result = self._consumer.commit(*args, **kwargs)
        message = kwargs.get("message", args[0] if args and not isinstance(args[0], list)
                             else None)
        offsets = kwargs.get("offsets", args[0] if args and isinstance(args[0], list) else None)
        upto = {message.partition(): message.offset() + 1} if message is not None else \
            {tp.partition: tp.offset for tp in offsets or []}
        if upto.get(self.partition, -1) > self.offset:
            self.crashed = True
            raise _Crash
        return result


def test_a_crash_after_the_heads_commit_keeps_its_key_parked(lab, ledger_db, clock):
    topics = lab.topics()
    settings = lab.settings(topics)
    head = with_label(healthy(KEY, 10_000), "declined")
    follower = healthy(KEY, 8_000, kind="withdrawal")
    inputs = lab.produce(topics.source, [head, follower])
    downstream = ScriptedDownstream(lab.payments, clock, {head.event_id: ["declined"] * 9})
    crash = CrashAfterCommit(lab.source_consumer(settings, topics), inputs[0].partition,
                             inputs[0].offset)
    try:
        lab.run(ledger_db, topics, settings, downstream, clock, consumer=crash)
    except _Crash:
        pass
    run = lab.run(ledger_db, topics, settings, downstream, clock)  # the next life
    require_done(run, inputs, downstream, read=SEE)
    dlt = lab.read(topics.dead_letter, topics.partitions, fence=True)
    found = match_dlt(inputs, dlt)
    booked = {r.event_id for r in ledger(ledger_db)}
    kind = (found[1][0].text("kafka_dlt-exception-fqcn") or "?").rsplit(".", 1)[-1] \
        if 1 in found else ""
    if follower.event_id in booked or not kind.endswith("KeyParked"):
        raise CheckFailure(
            f"The consumer was stopped dead (as kill -9 would) right after the offset commit "
            f"of {KEY}'s declined deposit returned{'' if crash.crashed else ' (it never came)'}"
            ". The next life " + ("booked the withdrawal behind it" if follower.event_id in
                                  booked else "did not park the withdrawal behind it")
            + ": the key was not parked yet when the head's offset was committed. The commit "
            "says the record is finished, so everything the dead letter changes (the parked "
            "key) must be durable before it: park the key, then commit.",
            expected=f"after the crash, {KEY}'s withdrawal in the DLT as KeyParked, not booked",
            actual=f"withdrawal: {'booked' if follower.event_id in booked else 'not booked'}, "
                   + (f"in the DLT as {kind}" if kind else "not in the DLT"),
            evidence=table([(i.describe(), "yes" if n in found else "no",
                             "yes" if i.item.event_id in booked else "no")
                            for n, i in enumerate(inputs)], ("message", "in DLT", "booked")),
            lesson=SEE)


class CrashAfterFirstCommit:
    """The learner's consumer for one life that is stopped dead right after its first offset
    commit returned (the commit reached the broker; nothing run() meant to do after it
    happens). A commit attempted after the crash (a consumer that caught it) raises again
    and reaches nothing."""

    def __init__(self, consumer: Any) -> None:
        self._consumer = consumer
        self.finished: tuple[int, int, bytes] | None = None  # (partition, offset, value)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._consumer, name)

    def commit(self, *args: Any, **kwargs: Any) -> Any:
        if self.finished is not None:
            raise _Crash
        self._consumer.commit(*args, **kwargs)
        message = kwargs.get("message", args[0] if args and not isinstance(args[0], list)
                             else None)
        if message is not None:
            self.finished = (message.partition(), message.offset(), message.value() or b"")
        else:
            offsets = kwargs.get("offsets", args[0] if args else None) or []
            self.finished = (offsets[0].partition, offsets[0].offset - 1, b"") if offsets \
                else (-1, -1, b"")
        raise _Crash


def lives_crashing_after_every_commit(lab, engine, topics, settings, downstream, clock,
                                      names, story, max_lives=10):
    """Run the consumer life after life, each stopped dead right after its first offset
    commit, until a life finds everything committed: every commit point of every record is
    a crash point. `story` collects one line per life (what its last commit finished)."""
    for _ in range(max_lives):
        crash = CrashAfterFirstCommit(lab.source_consumer(settings, topics))
        try:
            run = lab.run(engine, topics, settings, downstream, clock, consumer=crash,
                          timeout=15)
        except _Crash:
            p, o, value = crash.finished or (-1, -1, b"")
            story.append((len(story) + 1, f"p{p}@{o}", names.get(value, "?")))
            continue
        require_done(run, lab.inputs[topics.source], downstream, read=SEE)
        return
    raise CheckFailure(
        f"The consumer was stopped dead right after each offset commit and started again, "
        f"{max_lives} times, and still had records to commit: each life should finish one "
        "record and commit it.", expected="one record per life, then a life with nothing left",
        actual=f"{max_lives} lives", evidence=table(story[-12:], ("life", "committed",
                                                                  "record")), lesson=SEE)


def test_a_crash_after_any_commit_keeps_the_parked_count(lab, ledger_db, clock):
    """Every life of the consumer is stopped dead right after its first offset commit
    returned: after the head's, a KeyParked follower's, a replayed head's, a replayed
    follower's. Whatever a record changes in the parked state is durable before its commit,
    so the key is neither freed early nor kept parked behind a head that was booked."""
    topics = lab.topics()
    settings = lab.settings(topics)
    head = with_label(healthy(KEY, 10_000), "declined")
    follower = healthy(KEY, 8_000, kind="withdrawal")
    other = healthy("acc-3", 321)
    lab.produce(topics.source, [head, other, follower])
    names = {head.value: f"{KEY} deposit 100.00 (declined)", other.value: "acc-3 deposit 3.21",
             follower.value: f"{KEY} withdrawal 80.00"}
    story: list[tuple[Any, ...]] = []
    declining = ScriptedDownstream(lab.payments, clock, {head.event_id: ["declined"] * 9})
    lives_crashing_after_every_commit(lab, ledger_db, topics, settings, declining, clock,
                                      names, story)
    # The cause is fixed; a job for the declined payments brings the head back alone.
    fixed = ScriptedDownstream(lab.payments, clock)
    replay_all(lab, topics, lab.kafka.group_id("dlt-declined"), clock,
               exception_types={"PaymentDeclined"})
    lives_crashing_after_every_commit(lab, ledger_db, topics, settings, fixed, clock,
                                      names, story)
    late = healthy(KEY, 1_234)
    names[late.value] = f"{KEY} deposit 12.34 (while the withdrawal waits)"
    lab.produce(topics.source, [late])
    lives_crashing_after_every_commit(lab, ledger_db, topics, settings, fixed, clock,
                                      names, story)
    booked = {r.event_id for r in ledger(ledger_db)}
    lives = table(story, ("life", "its commit (then killed)", "record"), limit=16)
    if late.event_id in booked or follower.event_id in booked:
        raise CheckFailure(
            f"Each consumer life was stopped dead right after its first offset commit. "
            f"{KEY}'s declined deposit parked the key and the withdrawal behind it was "
            "parked as KeyParked; after the fix a replay brought back the deposit alone, and "
            f"it was booked. The withdrawal still waits in the DLT, yet "
            + ("a new deposit of the key was booked: the key came free early"
               if late.event_id in booked else "the withdrawal was booked")
            + ". A crash between a record's commit and its update of the parked key loses "
            "the update: count a parked follower (and release a booked head) before the "
            "offset commit, in the booking's transaction or before it.",
            expected=f"the new deposit of {KEY} parked behind the withdrawal, neither booked",
            actual="booked: " + ", ".join(n for e, n in ((late, "the new deposit"),
                                                         (follower, "the withdrawal"))
                                           if e.event_id in booked),
            evidence="the lives, each killed after its commit:\n" + lives, lesson=SEE)
    # The rest comes back: a job that starts after the head's DLT record.
    dlt = lab.read(topics.dead_letter, topics.partitions, fence=True)
    heads = [r for r in dlt if r.value == head.value]
    if not heads:
        raise CheckFailure(f"{KEY}'s declined deposit is not in the DLT.",
                           expected="it in the DLT", actual="missing", lesson=SEE)
    rest = lab.kafka.group_id("dlt-rest")
    commit_group(lab, rest, topics.dead_letter, {heads[0].partition: heads[0].offset + 1})
    report, _ = replay_all(lab, topics, rest, clock)
    lives_crashing_after_every_commit(lab, ledger_db, topics, settings, fixed, clock,
                                      names, story)
    final = healthy(KEY, 2_345)
    names[final.value] = f"{KEY} deposit 23.45 (after everything came back)"
    lab.produce(topics.source, [final])
    lives_crashing_after_every_commit(lab, ledger_db, topics, settings, fixed, clock,
                                      names, story)
    events = [head, follower, late, final]
    ids = key_order(ledger_db, events)
    firsts = [v[0] if len(v) == 1 else None for v in ids.values()]
    if None in firsts or firsts != sorted(f for f in firsts if f is not None):
        raise CheckFailure(
            f"Each consumer life was stopped dead right after its first offset commit. "
            f"{KEY}'s replayed head was booked and committed; then the records parked behind "
            "it were replayed, and they must be booked in order, the key free afterwards. "
            + ("The withdrawal was not booked: it was parked again, behind a head that had "
               "been booked already. The key's count went down after the head's commit, and "
               "the crash between the two lost it. Release the key in the booking's "
               "transaction (or before the commit)."
               if follower.event_id not in {r.event_id for r in ledger(ledger_db)} else ""),
            expected="the deposit, the withdrawal, the deposit made while it waited and the "
                     "last deposit booked once each, in that order",
            actual=f"replay of the rest reported {report!r}; ledger ids per message: "
                   f"{[ids[e.event_id] for e in events]}",
            evidence=order_table(events, ids, ["deposit 100.00 (was declined)",
                                               "withdrawal 80.00", "deposit 12.34",
                                               "deposit 23.45"])
                     + "\nthe lives, each killed after its commit:\n"
                     + table(story, ("life", "its commit (then killed)", "record"), limit=24),
            lesson=SEE)


def test_a_parked_record_is_dead_lettered_as_keyparked(lab, ledger_db, clock):
    """Behind acc-42's declined deposit come bytes that are not even JSON, with the key, and a
    withdrawal: both are parked behind the head, as payments.KeyParked, never tried."""
    topics = lab.topics()
    settings = lab.settings(topics)
    head = with_label(healthy(KEY, 10_000), "declined")
    garbage = undecodable(KEY)
    follower = healthy(KEY, 8_000, kind="withdrawal")
    inputs = lab.produce(topics.source, [head, garbage, follower])
    downstream = ScriptedDownstream(lab.payments, clock, {head.event_id: ["declined"] * 9})
    run = lab.run(ledger_db, topics, settings, downstream, clock)
    require_done(run, inputs, downstream, read=SEE)
    dlt = lab.read(topics.dead_letter, topics.partitions, fence=True)
    found = match_dlt(inputs, dlt)
    rows = [(name, i.describe(), r.text("kafka_dlt-exception-fqcn"), r.text("x-dlt-attempts"))
            for name, n, i in (("head (declined)", 0, inputs[0]),
                               ("not JSON", 1, inputs[1]), ("withdrawal", 2, inputs[2]))
            for r in found.get(n, [])]
    evidence = table(rows, ("message", "input", "kafka_dlt-exception-fqcn", "x-dlt-attempts"))
    parked = [(name, n, found[n][0]) for name, n in (("the record that is not JSON", 1),
                                                     ("the withdrawal", 2)) if n in found]
    if len(parked) < 2:
        raise CheckFailure(
            f"{KEY}'s deposit was declined and parked the key; the two records of the key "
            "behind it must reach the DLT too.",
            expected="both in the DLT", actual=f"{len(parked)} of 2 in the DLT",
            evidence=evidence, lesson=SEE)
    for name, _, r in parked:
        fq = r.text("kafka_dlt-exception-fqcn") or ""
        if fq.rsplit(".", 1)[-1] != "KeyParked":
            raise CheckFailure(
                f"{KEY} was parked behind its declined deposit; {name} came next and was "
                f"dead-lettered as {fq or 'no exception'}, its own failure, not as parked. "
                "Look the key up before anything else, parsing included: a record of a "
                "parked key is parked whatever it holds. Taken for a new head, it replaces "
                "the head the key waits for, and the replayed deposit is not recognised "
                "any more.",
                expected=f"{name} in the DLT as payments.KeyParked", actual=fq or "missing",
                evidence=evidence, lesson=SEE)
        if fq != "payments.KeyParked":
            raise CheckFailure(
                f"{name[0].upper() + name[1:]} of the parked key {KEY} was dead-lettered as "
                f"{fq}: a class of your own with that name. The README's exception is "
                "payments.KeyParked; a replay or an alert that filters on "
                "kafka_dlt-exception-fqcn, and a Java tool, look for that name.",
                expected="kafka_dlt-exception-fqcn = payments.KeyParked", actual=fq,
                evidence=evidence, fix="raise (or name) payments.KeyParked, imported from "
                "payments, instead of a class of your own", lesson=SEE)
        attempts = r.text("x-dlt-attempts")
        if attempts != "0":
            raise CheckFailure(
                f"{name[0].upper() + name[1:]} of the parked key {KEY} was dead-lettered with "
                f"x-dlt-attempts "
                f"{attempts!r}. It was never tried: it was parked behind its key's head. "
                "The header counts the attempts made, and a person reading the DLT tells a "
                "parked record from one that failed by it.",
                expected="x-dlt-attempts = 0 (decimal text)", actual=repr(attempts),
                evidence=evidence, lesson=SEE)
