"""Stage order-per-key: once a key has a message in the DLT, its later messages are parked
there too while other keys flow; replay brings the key's messages back in their original
order; a head that fails again keeps its followers behind it; the replayer never lets a
key's later record overtake one that stays behind."""

from __future__ import annotations

import pytest
from _support import (
    READ,
    craft_dead_letters,
    ledger,
    match_dlt,
    require_done,
)
from _tools import ScriptedDownstream, healthy, with_label

from dojo.checks import CheckFailure, call, table

pytestmark = pytest.mark.stage("order-per-key")
SEE = READ["order-per-key"]
KEY = "acc-42"


def replay_all(lab, topics, group, clock):
    module = lab.module("replay")
    return call(module.replay, lab.kafka.consumer_config(), lab.dlt_producer(),
                dead_letter_topic=topics.dead_letter, parking_lot_topic=topics.parking_lot,
                group_id=group, clock=clock, rate_per_second=1000.0)


def park_a_key(lab, engine, clock):
    """acc-42's first deposit is declined; two more acc-42 payments and other keys follow."""
    topics = lab.topics()
    settings = lab.settings(topics)
    head = with_label(healthy(KEY, 10_000), "declined")
    followers = [healthy(KEY, 8_000, kind="withdrawal"), healthy(KEY, 500)]
    others = [healthy(f"acc-{n}", 100 + n) for n in range(1, 7)]
    items = [others[0], head, others[1], followers[0], others[2], others[3], followers[1],
             others[4], others[5]]
    inputs = lab.produce(topics.source, items)
    downstream = ScriptedDownstream(lab.payments, clock, {head.event_id: ["declined"] * 9})
    run = lab.run(engine, topics, settings, downstream, clock)
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


def test_later_messages_of_a_parked_key_wait_in_the_dead_letter_topic(lab, ledger_db, clock):
    topics, _, inputs, head, followers, others = park_a_key(lab, ledger_db, clock)
    dlt = lab.read(topics.dead_letter, topics.partitions, expect=3)
    found = match_dlt(inputs, dlt)
    by_item = {id(i.item): n for n, i in enumerate(inputs)}
    booked = {r.event_id for r in ledger(ledger_db)}
    rows = []
    for name, item in [("head (declined)", head), ("follower 1", followers[0]),
                       ("follower 2", followers[1])] + [(f"other {o.account}", o)
                                                         for o in others]:
        n = by_item[id(item)]
        rows.append((name, inputs[n].at, "yes" if n in found else "no",
                     "yes" if item.event_id in booked else "no"))
    key_ok = all(by_item[id(i)] in found and i.event_id not in booked
                 for i in [head, *followers])
    others_ok = all(by_item[id(o)] not in found and o.event_id in booked for o in others)
    if not (key_ok and others_ok):
        raise CheckFailure(
            f"{KEY}'s deposit was dead-lettered; the withdrawal behind it would run against a "
            "balance without that deposit. Park the key: its later messages go to the DLT too "
            "(exception payments.KeyParked) until a replay brings the key back in order. Other "
            "keys are not affected.",
            expected=f"all three {KEY} messages in the DLT, none booked; every other key booked, "
                     "none dead-lettered",
            actual="see below", evidence=table(rows, ("message", "at", "in DLT", "booked")),
            lesson=SEE)


def test_replay_restores_a_keys_order(lab, ledger_db, clock):
    topics, settings, inputs, head, followers, others = park_a_key(lab, ledger_db, clock)
    late = lab.produce(topics.source, [healthy(KEY, 700)])  # arrives while the key is parked
    inputs += late
    gateway = ScriptedDownstream(lab.payments, clock)  # fixed: nothing is declined now
    run = lab.run(ledger_db, topics, settings, gateway, clock)
    require_done(run, inputs, gateway, read=SEE)
    report = replay_all(lab, topics, lab.kafka.group_id("dlt-replayer"), clock)
    lab.refresh_ends(topics)
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
    lab.refresh_ends(topics)
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
    lab.refresh_ends(topics)
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


def test_replay_keeps_a_keys_records_behind_its_head(lab, clock):
    topics = lab.topics()
    specs = [
        (healthy("acc-k", 101), "InvalidEvent", None),  # filtered out: stays behind
        (healthy("acc-k", 102), "KeyParked", None),
        (healthy("acc-l", 201), "DownstreamUnavailable", None),  # replayed
        (healthy("acc-k", 103), "KeyParked", None),
        (healthy("acc-l", 202), "KeyParked", None),
        (healthy("acc-m", 301), "DownstreamUnavailable", 3),  # at the cap: parking lot
        (healthy("acc-m", 302), "KeyParked", None),
    ]
    dead = craft_dead_letters(lab, topics, specs)
    module = lab.module("replay")
    report = call(module.replay, lab.kafka.consumer_config(), lab.dlt_producer(),
                  dead_letter_topic=topics.dead_letter, parking_lot_topic=topics.parking_lot,
                  group_id=lab.kafka.group_id("dlt-replayer"), clock=clock,
                  rate_per_second=1000.0, max_replays=3,
                  exception_types={"DownstreamUnavailable", "KeyParked"})
    back = lab.read(topics.source, topics.partitions, expect=2)
    order = [next((c for c in dead if c.item.value == r.value), None) for r in back]
    sent = [f"{(c.item.key or b'').decode()} {c.item.cents}" for c in order if c is not None]
    if sent != ["acc-l 201", "acc-l 202"]:
        raise CheckFailure(
            "A key's later record must not be replayed while an earlier record of the same key "
            "stays behind: acc-k's head is filtered out (InvalidEvent), acc-m's head is at the "
            "replay cap and goes to the parking lot. Their KeyParked followers would otherwise be "
            "booked before them. Decide per key, in DLT order: once a record of a key is not "
            "re-published, none of that key's later records is in this run.",
            expected="only acc-l 201 then acc-l 202 re-published",
            actual=f"re-published: {sent}; report {report!r}",
            evidence=table([(f"p{c.partition}@{c.offset}", (c.item.key or b"").decode(),
                             c.item.cents,
                          c.exception, c.replays if c.replays is not None else "none")
                         for c in dead], ("DLT record", "key", "cents", "exception", "replays")),
            lesson=SEE)
