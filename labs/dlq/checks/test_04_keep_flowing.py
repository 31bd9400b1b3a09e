"""Stage keep-flowing: a poison pill does not hold back the records behind it, a transient
one holds them only for its retry window, lag drains, and an idle consumer does not spin."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest
from _support import (
    READ,
    applied_ids,
    first_delivery,
    match_dlt,
    nominal_backoffs,
    require_done,
    timeline,
)
from _tools import (
    ScriptedDownstream,
    healthy,
    invalid,
    undecodable,
    with_label,
)

from dojo.checks import CheckFailure, table
from dojo.checks.observers import ConsumerTap, show_bytes

pytestmark = pytest.mark.stage("keep-flowing")
SEE = READ["keep-flowing"]


def first_call(downstream, event_id):
    calls = downstream.authorizations(event_id)
    return calls[0].at if calls else None


def test_poison_pill_does_not_hold_back_its_partition(lab, ledger_db, clock):
    topics = lab.topics()
    settings = lab.settings(topics)
    # Behind each pill, records whose keys are close to the pill's: a healthy payment without
    # a key behind the key-less pill (no key is nobody's key, not a shared empty one), and
    # behind the pill with a non-UTF-8 key, another non-UTF-8 key that decodes to the same
    # text with errors="replace", and a key holding a NUL byte (which a text column refuses).
    keyless = replace(healthy("acc-k0", 117, partition=0), key=None)
    near = [replace(healthy("acc-g1", 523, partition=2), key=b"\xfe\xff\x9c-garbage"),
            replace(healthy("acc-g2", 541, partition=2), key=b"acc\x00-29")]
    behind0 = [keyless] + [healthy(f"acc-{n}", 100 + n, partition=0) for n in range(20)]
    behind1 = [healthy(f"acc-{n}", 300 + n, partition=1) for n in range(5)]
    behind2 = near + [healthy(f"acc-{n}", 500 + n, partition=2) for n in range(3)]
    # the pill of partition 0 has no key (a producer that sent garbage sent no key either);
    # the pill of partition 2 has a key that is not UTF-8 text: a key is bytes
    items = [undecodable(None, partition=0), *behind0,
             invalid("poison-i1", partition=1), *behind1,
             undecodable(b"\xff\xfe\x9c-garbage", partition=2), *behind2]
    first1, first2 = 1 + len(behind0), 2 + len(behind0) + len(behind1)
    inputs = lab.produce(topics.source, items)
    downstream = ScriptedDownstream(lab.payments, clock)
    run = lab.run(ledger_db, topics, settings, downstream, clock, timeout=6)
    require_done(run, inputs, downstream, read=SEE, why=(
        "A poison pill sits at the head of partitions 0 (without a key), 1 and 2 (its key "
        "is not UTF-8: a key is bytes, and may be garbage like the value): if the consumer "
        "retries it for ever (or seeks back to it), nothing behind it ever moves and lag "
        "only grows."))

    booked = applied_ids(ledger_db)
    unbooked = [i for i in inputs if i.label == "healthy" and i.item.event_id not in booked]
    odd = [i for i in unbooked if i.item is keyless or i.item in near]
    if odd:
        dlt = lab.read(topics.dead_letter, topics.partitions, fence=True)
        found = match_dlt(inputs, dlt)
        rows = []
        for i in odd:
            n = inputs.index(i)
            r = found.get(n, [None])[0]
            rows.append((i.describe(), "no key" if i.item.key is None else show_bytes(
                i.item.key), "not booked" + (f"; in the DLT as "
                f"{(r.text('kafka_dlt-exception-fqcn') or '?').rsplit('.', 1)[-1]}"
                if r is not None else "")))
        raise CheckFailure(
            "A healthy payment behind a poison pill was not booked, and its key is what sets "
            "it apart: no key at all (behind the key-less pill), or bytes that are not UTF-8 "
            "or hold a NUL. A record without a key has no key to park: it is not parked under "
            "an empty key shared with every other key-less record. A key is bytes: two "
            "different non-UTF-8 keys are two keys (decoded with errors=\"replace\" they "
            "become one), and PostgreSQL text refuses a NUL; keep keys as bytea.",
            expected="each of them booked once",
            actual=f"{len(odd)} not booked: " + ", ".join(i.describe() for i in odd),
            evidence=table(rows, ("input", "key", "")) + "\nwhat happened:\n"
                     + timeline(run, downstream, inputs, limit=14), lesson=SEE)
    heads = [inputs[0], inputs[first1], inputs[first2]]
    again = {h.at: sum(1 for d in run.consumer.delivered if (d.partition, d.offset) ==
                       (h.partition, h.offset)) for h in heads}
    waits = {}
    for head, nxt in ((inputs[0], inputs[1]), (inputs[first1], inputs[first1 + 1]),
                      (inputs[first2], inputs[first2 + 1])):
        seen, moved = first_delivery(run, head), first_call(downstream, nxt.item.event_id)
        if seen is not None and moved is not None:
            waits[head.at] = moved - seen
    if unbooked or not (all(n <= 2 for n in again.values()) and
                        all(w < 0.25 for w in waits.values())):
        raise CheckFailure(
            "The records behind a poison pill must flow on at once: dead-letter the pill, "
            "commit it, take the next record. No waiting, no redelivery loop.",
            expected="every healthy record booked; each pill polled at most twice; the next "
                     "record reached the gateway under 0.25 s after the pill was polled",
            actual=f"{len(unbooked)} healthy records not booked; times each pill was polled: "
                   f"{again}; wait behind each pill: "
                   + ", ".join(f"{k}: {v:.2f} s" for k, v in waits.items()),
            evidence=timeline(run, downstream, inputs, limit=14), lesson=SEE)


def test_transient_pill_holds_its_partition_only_for_its_retry_window(lab, ledger_db, clock):
    topics = lab.topics()
    settings = lab.settings(topics)  # 4 attempts: 0.4 + 0.8 + 1.6 s of backoff (± 20 %)
    stuck = with_label(healthy("poison-t1", 300, partition=0), "transient-exhausted")
    behind = [healthy(f"acc-{n}", 100 + n, partition=0) for n in range(8)]
    inputs = lab.produce(topics.source, [stuck, *behind])
    downstream = ScriptedDownstream(lab.payments, clock, {stuck.event_id: ["timeout"] * 50})
    run = lab.run(ledger_db, topics, settings, downstream, clock)
    require_done(run, inputs, downstream, read=SEE)
    window = sum(nominal_backoffs(settings, settings.retry.max_attempts - 1))
    began, moved = first_call(downstream, stuck.event_id), \
        first_call(downstream, behind[0].event_id)
    held = (moved - began) if began is not None and moved is not None else float("inf")
    limit = window * (1 + settings.retry.jitter) + 0.5
    if not (held <= limit):
        raise CheckFailure(
            "A record that fails transiently holds its partition while it is retried in place, "
            "but only for its bounded retry window; then it goes to the DLT and the partition "
            "moves on.",
            expected=f"the next record reaches the gateway within {limit:.1f} s (clock time) of "
                     f"the pill's first attempt (backoff {window:.1f} s ± jitter)",
            actual=f"it took {held:.1f} s" if held != float("inf") else "it never did",
            evidence=timeline(run, downstream, inputs, limit=14), lesson=SEE)


MAX_IDLE_POLLS_PER_SECOND = 100  # poll(timeout) with a timeout of 10 ms or more


def test_idle_consumer_does_not_spin(lab, ledger_db, clock):
    topics = lab.topics()
    settings = lab.settings(topics)
    inputs = lab.produce(topics.source, [healthy(f"acc-{n}", 100 + n) for n in range(6)])
    downstream = ScriptedDownstream(lab.payments, clock)
    marks: dict[str, float] = {}
    tap = ConsumerTap(lab.source_consumer(settings, topics), clock)

    def watch(committed):
        ends = lab.ends[topics.source]
        if "cpu" not in marks and all(committed.get(p, -1) >= e for p, e in ends.items()):
            marks.update(cpu=time.process_time(), wall=time.monotonic(), polls=len(tap.polls))

    run = lab.run(ledger_db, topics, settings, downstream, clock, consumer=tap, linger=1.0,
                  watch=watch)
    require_done(run, inputs, downstream, read=SEE)
    cpu = time.process_time() - marks["cpu"]
    wall = time.monotonic() - marks["wall"]
    polls = len(tap.polls) - marks["polls"]
    # A poll that waits makes a few calls a second; one that returns at once (poll(0), a nap on
    # the checks' instant clock between polls) makes hundreds, even where each call is cheap.
    if not (cpu / wall < 0.5) or polls / wall > MAX_IDLE_POLLS_PER_SECOND:
        raise CheckFailure(
            "With nothing to consume, the consumer should wait inside poll(timeout), not spin. "
            "For a second of idling the check measured this process's CPU time and counted its "
            "poll() calls.",
            expected=f"well under 50 % of one CPU and at most {MAX_IDLE_POLLS_PER_SECOND} "
                     "poll() calls a second while idle",
            actual=f"{cpu / wall:.0%} of a CPU; {polls} poll() calls in {wall:.1f} s",
            evidence="a loop of poll(0), or of clock.sleep() (instant under the checks' clock) "
                     "between polls, keeps a core busy for nothing", lesson=SEE)
