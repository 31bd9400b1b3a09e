"""Stage replay: DLT records go back to their original topic under the replayer's own
consumer group (a second run sends nothing), stripped of the old failure headers with their
business headers and an incremented x-replay-count; past the cap they go to the parking
lot; replay is rate-limited, filterable by exception type and time, and commits only after
the acknowledgement."""

from __future__ import annotations

import math
import re
import time
from dataclasses import replace
from typing import Any

import pytest
from _support import (
    READ,
    CommitCalls,
    Crafted,
    FailOnce,
    HookedProducer,
    craft_dead_letters,
)
from _tools import Item, healthy

from dojo.checks import CheckFailure, call, table
from dojo.checks.clock import InstantClock
from dojo.checks.observers import (
    ProducerTap,
    committed_offsets,
    headers_table,
    offsets_text,
    show_bytes,
)
from dojo.checks.partitioning import partition_for

pytestmark = pytest.mark.stage("replay")
SEE = READ["replay"]
FAILURE_PREFIXES = ("kafka_dlt-", "x-dlt-")
SLACK = 0.02  # seconds a single gap between two paced sends may fall short (see below)


def _item(key: str | None, cents: int) -> Item:
    """A payment of account `key`; without a key when `key` is None (partition 1)."""
    item = healthy(key or "acc-nokey", cents)
    if key is not None:
        return item
    return Item(item.label, None, item.value, item.headers, item.event_id, item.account,
                item.cents, 1)


def replay(lab, topics, group, clock, *, producer=None, config=None, **options):
    module = lab.module("replay")
    options.setdefault("rate_per_second", 1000.0)
    return call(module.replay, {**lab.kafka.consumer_config(), **(config or {})},
                producer if producer is not None else lab.dlt_producer(),
                dead_letter_topic=topics.dead_letter, parking_lot_topic=topics.parking_lot,
                group_id=group, clock=clock, **options)


def mixed(lab, topics, replays=(None, 1, None, None, 1, None)):
    kinds = ("InvalidEvent", "DownstreamUnavailable", "PaymentDeclined")
    specs = [(healthy(f"acc-{n}", 100 + n), kinds[n % 3], r) for n, r in enumerate(replays)]
    return craft_dead_letters(lab, topics, specs)


KEYLESS_PER_PARTITION = 3


def test_replayed_records_are_clean_and_counted(lab, clock):
    topics = lab.topics()
    dead = mixed(lab, topics)
    # The original of acc-p was placed in another partition than its key's (explicitly, by
    # its producer), and KEYLESS records have no key: each goes back to its original
    # partition. They come from every partition, so no single partition (a sticky
    # partitioner's) is right for all, and a random choice is right for all once in 3^9.
    # The key-less ones sit in the DLT partition after their original's: only
    # kafka_dlt-original-partition says where they came from, not the DLT partition.
    placed_key = b"acc-p"
    placed = (partition_for(placed_key, topics.partitions) + 1) % topics.partitions
    specs: list[tuple[Item, str, int | None]] = [
        (healthy("acc-p", 777, partition=placed), "DownstreamTimeout", None)]
    for n in range(KEYLESS_PER_PARTITION * topics.partitions):
        item = healthy("acc-x", 880 + n)
        specs.append((Item(item.label, None, item.value, item.headers, item.event_id,
                           item.account, item.cents, n % topics.partitions),
                      "DownstreamTimeout", 2 if n % 2 else None))
    # An empty key is a key (murmur2 of no bytes), not a missing one: it goes to its key's
    # partition, not back to its original's, where its producer had placed it.
    empty = healthy("acc-e", 990)
    specs.append((replace(empty, key=b"", partition=(partition_for(b"", topics.partitions) + 1)
                          % topics.partitions), "DownstreamTimeout", None))
    shifted = [None if item.key is not None or item.partition is None
               else (item.partition + 1) % topics.partitions for item, _, _ in specs]
    dead += craft_dead_letters(lab, topics, specs, dlt_partitions=shifted)
    group = lab.kafka.group_id("dlt-replayer")
    report = replay(lab, topics, group, clock)
    back = lab.read(topics.source, topics.partitions, fence=True)
    by_value = {r.value: r for r in back}
    problems, shown = [], None
    misplaced: list[str] = []  # records without a key, not back in their original partition
    to_dlt_partition = 0  # … sent to the partition they sat in in the DLT
    for c in dead:
        r = by_value.get(c.item.value)
        name = ("(empty key)" if c.item.key == b"" else c.item.key.decode()) \
            if c.item.key is not None else "(no key)"
        if r is None:
            problems.append(f"{name}: not re-published to {topics.source}")
            continue
        wrong = []
        if r.key != c.item.key:
            wrong.append(f"key {show_bytes(r.key, 20)} (was {show_bytes(c.item.key, 20)})")
        want = partition_for(c.item.key, topics.partitions) if c.item.key is not None \
            else c.item.partition
        if c.item.key is None and r.partition != want:
            misplaced.append(f"p{want}->p{r.partition}")
            to_dlt_partition += r.partition == c.partition
        elif r.partition != want:
            why = (f"its key's partition is {want} (murmur2); p{r.partition} is "
                   "kafka_dlt-original-partition, where its producer had placed it"
                   if c.item.key is not None and r.partition == c.partition else
                   f"its key's partition is {want} (murmur2)" if c.item.key is not None else
                   f"without a key it goes back to kafka_dlt-original-partition, {want}")
            wrong.append(f"partition {r.partition}: {why}")
        stale = list(dict.fromkeys(n for n in r.names() if n.startswith(FAILURE_PREFIXES)))
        if stale:
            wrong.append("old failure headers kept: " + ", ".join(stale[:3])
                         + (f" and {len(stale) - 3} more" if len(stale) > 3 else ""))
        sent = [(k, v) for k, v in c.item.headers]
        kept = [(k, v) for k, v in r.headers if k != "x-replay-count"]
        lost = [k for k in dict.fromkeys(k for k, _ in sent)
                if [v for n, v in sent if n == k] != [v for n, v in kept if n == k]]
        if lost:
            wrong.append(f"business header(s) lost or changed: {', '.join(lost)}")
        counts = [v for k, v in r.headers if k == "x-replay-count"]
        want_count = str((c.replays or 0) + 1).encode()
        if counts != [want_count]:
            wrong.append(f"x-replay-count {counts} (should be one header, "
                         f"{want_count.decode()})")
        if wrong:
            problems.append(f"{name}: " + "; ".join(wrong))
            shown = shown or r
    keyless = sum(1 for c in dead if c.item.key is None)
    on_dlt = bool(misplaced) and to_dlt_partition == len(misplaced)
    if misplaced:
        problems.insert(0, f"{len(misplaced)} of the {keyless} records without a key (from "
                           f"every partition) not back in their kafka_dlt-original-partition"
                           + (", each sent to the partition it sat in in the DLT, the one "
                              "after its original's here" if on_dlt else ""))
    if problems:
        raise CheckFailure(
            "A replayed record is the original again: the same key and value, in its key's "
            "partition (murmur2, as the original producer chose it; without a key, back to "
            "kafka_dlt-original-partition), every header it came with (traceparent, "
            "event-type and any x- header of the business, in order, repeats kept), none of "
            "the failure headers of its last trip (kafka_dlt-*, x-dlt-*), and x-replay-count "
            "one higher than on the DLT record (absent counts as zero).",
            expected=f"{len(dead)} clean records in {topics.source}",
            actual="\n    - " + "\n    - ".join(problems[:4])
                   + (f"\n    … and {len(problems) - 4} more" if len(problems) > 4 else ""),
            evidence="\n".join(
                ([headers_table(shown.headers)] if shown is not None else [])
                + (["records without a key, original partition -> where they went: "
                    + ", ".join(misplaced)] if misplaced else [])),
            fix="take a key-less record's partition from kafka_dlt-original-partition, not "
                "from the DLT record (msg.partition()): a DLT need not keep the partition"
                if on_dlt and len(problems) == 1 else
                "send a record without a key with partition= its kafka_dlt-original-partition "
                "(4-byte big-endian int): without a key, the partitioner picks any partition"
                if misplaced and len(problems) == 1 else None,
            lesson=SEE)
    if getattr(report, "replayed", None) != len(dead):
        raise CheckFailure(
            "replay() reports what it did.", expected=f"ReplayReport(replayed={len(dead)}, …)",
            actual=repr(report), lesson=SEE)


def test_a_second_run_sends_nothing_twice(lab, clock):
    topics = lab.topics()
    dead = mixed(lab, topics)
    group = lab.kafka.group_id("dlt-replayer")
    replay(lab, topics, group, clock)
    first = lab.read(topics.source, topics.partitions, fence=True)
    committed = committed_offsets(lab.kafka.consumer_config(), group, topics.dead_letter,
                                  topics.partitions)
    began = time.monotonic()
    second = replay(lab, topics, group, clock, timeout_seconds=RERUN_TIMEOUT_S)
    took = time.monotonic() - began
    after = lab.read(topics.source, topics.partitions, fence=True)
    ends: dict[int, int] = {}
    for c in dead:
        ends[c.partition] = max(ends.get(c.partition, 0), c.offset + 1)
    if not (len(after) == len(first) == len(dead)):
        raise CheckFailure(
            "Reading a DLT removes nothing from it. The replayer must know where it stopped: "
            "its own consumer group (group_id), with the offset of every record it handled "
            "committed. Run twice, it then sends nothing twice.",
            expected=f"{len(dead)} records in {topics.source} after two runs, and the group "
                     f"committed at the DLT's end {offsets_text(ends)}",
            actual=f"{len(first)} after the first run, {len(after)} after the second; the "
                   f"group's committed offsets after the first: {offsets_text(committed)}; "
                   f"second report: {second!r}",
            lesson=SEE)
    if took >= RERUN_TIMEOUT_S - 0.5:
        raise CheckFailure(
            f"The second run had nothing to do (the group's committed offsets were at the DLT's "
            f"end, {offsets_text(ends)}, in every partition), yet it ran {took:.1f} s, until its "
            f"timeout_seconds ({RERUN_TIMEOUT_S:g}) was up. A partition whose committed offset "
            "is at its end offset when the run starts is done before it begins: a run with "
            "nothing left returns at once (a scheduled replay job would otherwise sit out its "
            "whole timeout every time).",
            expected="the second run back at once, sending nothing",
            actual=f"{took:.1f} s; report {second!r}",
            fix="count a partition as done when its starting offset (committed, or the low "
                "watermark) is already at its end offset, and stop when every partition is done",
            lesson=SEE)


# README: a run returns once every partition is at its end; a second run has none left
RERUN_TIMEOUT_S = 4.0


def test_replay_parks_what_keeps_coming_back(lab, clock):
    topics = lab.topics()
    specs = [(healthy("acc-1", 101), "InvalidEvent", 2), (healthy("acc-2", 102),
                                                         "InvalidEvent", 3),
             (healthy("acc-3", 103), "PaymentDeclined", 5), (healthy("acc-4", 104),
                                                            "PaymentDeclined", None)]
    dead = craft_dead_letters(lab, topics, specs)
    # written by hand (or by a broken tool): no kafka_dlt-original-* headers
    orphan = craft_dead_letters(lab, topics, [(healthy("acc-5", 105), "InvalidEvent", None)],
                                origin=False)
    report = replay(lab, topics, lab.kafka.group_id("dlt-replayer"), clock, max_replays=3)
    back = {r.value for r in lab.read(topics.source, topics.partitions, fence=True)}
    # the parking lot may have more partitions than the source (parked: any partition)
    parked = lab.read(topics.parking_lot,
                      max(topics.partitions, lab.partition_counts([topics.parking_lot])[
                          topics.parking_lot]), fence=True)
    parked_by_value = {r.value: r for r in parked}
    rows: list[tuple[Any, ...]] = []
    over_cap: list[Crafted] = []
    no_origin: list[Crafted] = []
    for c in dead + orphan:
        lost_origin = c in orphan
        over = (c.replays or 0) >= 3
        where = ("source" if c.item.value in back else "") + \
            ("parking lot" if c.item.value in parked_by_value else "")
        want = "parking lot" if over or lost_origin else "source"
        rows.append(((c.item.key or b"").decode(), c.replays if c.replays is not None else "none",
                     "missing" if lost_origin else "present", want, where or "nowhere"))
        wrong = where != want
        if not wrong and want == "parking lot":
            p = parked_by_value[c.item.value]
            if p.text("kafka_dlt-exception-fqcn") is None or \
                    p.text("x-replay-count") != (str(c.replays) if c.replays is not None
                                                 else None):
                rows[-1] = (*rows[-1][:4], "parking lot, but without its evidence")
                wrong = True
        if wrong:
            (no_origin if lost_origin else over_cap).append(c)
    columns = ("key", "x-replay-count", "original topic", "should go to", "went to")
    if over_cap:
        raise CheckFailure(
            "A message that has been replayed max_replays times and is back again will not be "
            "fixed by one more replay: it goes to the parking lot (as it is, failure headers and "
            "replay count kept as evidence), where only a person decides. Without the cap, "
            "replay and DLT feed each other for ever.",
            expected="replay count < 3: back to the source; ≥ 3: parking lot",
            actual=f"{len(over_cap)} of {len(dead)} went elsewhere; report {report!r}",
            evidence=table(rows, columns), lesson=SEE)
    if no_origin:
        went = rows[-1][4]
        raise CheckFailure(
            "A DLT record without kafka_dlt-original-topic cannot be sent back: nobody knows "
            "where it came from, and a guess (the DLT's name without its suffix, a default "
            "topic) may feed another service's topic. It goes to the parking lot as it is, "
            "for a person to decide.",
            expected="the record without origin headers in the parking lot, nothing else "
                     "done with it",
            actual=f"it went to: {went}; report {report!r}",
            evidence=table(rows, columns), lesson=SEE)
    # every record went where it belongs: the report counts them so
    want_parked = sum(1 for c in dead if (c.replays or 0) >= 3) + len(orphan)
    want_counts = (len(dead) + len(orphan) - want_parked, want_parked, 0)
    counts = tuple(getattr(report, name, None) for name in ("replayed", "parked", "skipped"))
    if counts != want_counts:
        raise CheckFailure(
            "Every record went where it belongs (back to the source, or to the parking lot at "
            "the cap or without its origin), but the report counts otherwise. A park is "
            "counted as parked, whatever sent it there (the cap, or a missing origin); a "
            "re-publish as replayed; skipped is only what the filters left out.",
            expected="ReplayReport(replayed={}, parked={}, skipped={})".format(*want_counts),
            actual=repr(report), evidence=table(rows, columns), lesson=SEE)


def test_replay_filters_by_exception_type_and_time(lab, clock):
    topics = lab.topics()
    # DLT timestamps on a grid of 1/8 s (0.375 s past a second here): t / 1000 and
    # failed_after * 1000 are then exact in floating point, so the records on the window's
    # edges are on them whichever way the replay compares, and a cut to whole seconds shows.
    start_ms = (int(time.time()) - 30) * 1000 + 375
    specs = [  # (key, exception, DLT timestamp ms, what it is)
        ("acc-1", "DownstreamUnavailable", start_ms - 600_000, "10 min before the window"),
        ("acc-2", "InvalidEvent", start_ms - 600_000, "10 min before the window"),
        ("acc-3", "DownstreamUnavailable", start_ms, "at failed_after exactly"),
        ("acc-4", "InvalidEvent", start_ms + 1_000, "inside the window"),
        ("acc-5", "DownstreamUnavailable", start_ms + 1_000, "inside the window"),
        # a class of a nested module: its name is what follows the last dot
        ("acc-8", "sqlalchemy.exc.OperationalError", start_ms + 1_125, "inside the window"),
        # a class whose name only ends with a wanted one: another class, not wanted
        ("acc-11", "payments.gateway.PartnerDownstreamUnavailable", start_ms + 1_000,
         "inside the window"),
        ("acc-6", "DownstreamUnavailable", start_ms + 2_000, "at failed_before exactly"),
        ("acc-7", "DownstreamUnavailable", start_ms + 3_000, "after the window"),
        # two key-less records of one partition, the first outside the window: no key has no
        # order to keep, so the skipped one holds nothing back
        (None, "DownstreamUnavailable", start_ms - 600_000, "no key, 10 min before the window"),
        (None, "DownstreamUnavailable", start_ms + 1_250, "no key, inside the window"),
        # outside the filters, though at the cap (x-replay-count 3) or without an original
        # topic: the filters decide first, so these are skipped, never parked
        ("acc-9", "PaymentDeclined", start_ms + 1_000, "inside the window, at the cap"),
        ("acc-10", "DownstreamUnavailable", start_ms - 600_000,
         "10 min before the window, no original topic"),
        # written by a tool that names no exception class: no class name is not a wanted one
        ("acc-12", "DownstreamUnavailable", start_ms + 1_000,
         "inside the window, no exception class header")]
    wanted_types = {"DownstreamUnavailable", "OperationalError"}
    capped, orphaned, nameless = len(specs) - 3, len(specs) - 2, len(specs) - 1
    dead = craft_dead_letters(lab, topics, [(_item(k, 101 + n), e, 3 if n == capped else None)
                                            for n, (k, e, _, _) in enumerate(specs[:-2])],
                              timestamps=[t for _, _, t, _ in specs[:-2]])
    dead += craft_dead_letters(lab, topics, [(_item(specs[orphaned][0], 101 + orphaned),
                                              specs[orphaned][1], None)],
                               timestamps=[specs[orphaned][2]], origin=False)
    dead += craft_dead_letters(lab, topics, [(_item(specs[nameless][0], 101 + nameless),
                                              specs[nameless][1], None)],
                               timestamps=[specs[nameless][2]],
                               drop_headers=("kafka_dlt-exception-fqcn",))
    # An empty collection of types wants none of them (None is the one that means all): a
    # job whose type list came out empty must replay nothing. Every commit() of the jobs is
    # recorded (the replay module, imported inside the `with`, keeps the counting consumer
    # class it imported: one CommitCalls for them all).
    commits = CommitCalls()
    with commits:
        report = replay(lab, topics, lab.kafka.group_id("dlt-replayer-none"), clock,
                        exception_types=[], max_replays=3)
    first_job = list(commits.offsets)
    sent = lab.read(topics.source, topics.partitions, fence=True)
    if sent and {r.value for r in sent} == {dead[nameless].item.value}:
        _nameless_replayed(f"replay(exception_types=[]) (report {report!r})")
    if sent:
        raise CheckFailure(
            "replay(exception_types=[]) re-published records: an empty list of types wants "
            "no class name, so every record is outside the filter (None, not an empty list, "
            "means no type filter).",
            expected="nothing re-published, every record skipped",
            actual=f"{len(sent)} of {len(dead)} re-published; report {report!r}",
            evidence=table([(r.key_text, r.partition, r.offset) for r in sent],
                           ("key", "partition", "offset")), lesson=SEE)
    since, until = start_ms / 1000, (start_ms + 2_000) / 1000
    group = lab.kafka.group_id("dlt-replayer")
    with commits:
        report = replay(lab, topics, group, clock, exception_types=wanted_types,
                        failed_after=since, failed_before=until, max_replays=3)
    second_job = commits.offsets[len(first_job):]
    back = {r.value for r in lab.read(topics.source, topics.partitions, fence=True)}
    rows, wrong = [], []
    for n, (c, (_, _, _, when)) in enumerate(zip(dead, specs, strict=True)):
        name = c.exception.rsplit(".", 1)[-1] if n != nameless else "(no header)"
        want = name in wanted_types and since <= c.timestamp_ms / 1000 < until
        got = c.item.value in back
        rows.append(((c.item.key or b"(none)").decode(),
                     c.exception if n != nameless else "(no header)", when,
                     "yes" if want else "no", "yes" if got else "no"))
        if want != got:
            wrong.append(when if "." not in c.exception else f"{c.exception} {when}")
    if wrong == [specs[nameless][3]]:
        _nameless_replayed(f"replay(exception_types={sorted(wanted_types)!r}, …) (report "
                           f"{report!r})")
    if wrong:
        edge = [w for w in wrong if "exactly" in w]
        nested = [w for w in wrong if "." in w.split(" ")[0]]
        keyless = [w for w in wrong if w == "no key, inside the window"]
        if keyless and wrong == keyless:
            raise CheckFailure(
                "Two DLT records without a key sit in one partition: the first is outside the "
                "time window (skipped), the second inside it, yet the second was not "
                "re-published. A record without a key has no key's order to keep: skipping "
                "(or parking) one holds back no other key-less record; only a record of the "
                "same key stays behind the one that was not re-published.",
                expected="the key-less record inside the window replayed",
                actual=f"not replayed; report {report!r}",
                evidence=table(rows, ("key", "exception", "dead-lettered", "replay?",
                                      "replayed")), lesson=SEE)
        raise CheckFailure(
            "After a fix for one cause (the gateway outage of a given minute, say), only the "
            "records of that cause and that time are replayed: filter on the exception class "
            "name (kafka_dlt-exception-fqcn after its last dot: sqlalchemy.exc.OperationalError "
            "is OperationalError) and on when the record was dead-lettered (its DLT timestamp "
            "in ms / 1000), in the half-open window failed_after ≤ t < failed_before, so "
            "adjacent windows [t0, t1), [t1, t2) replay each record once.",
            expected="only the DownstreamUnavailable and OperationalError records from "
                     "failed_after (included) to failed_before (excluded) replayed",
            actual=f"{len(wrong)} records on the wrong side"
                   + (f", on the window's edge: {', '.join(edge)}" if edge else "")
                   + (f", of a nested module: {', '.join(nested)}" if nested else "")
                   + f"; report {report!r}",
            evidence=f"exception_types={sorted(wanted_types)!r}, failed_after={since!r}, "
                     f"failed_before={until!r}\n" + table(
                         rows, ("key", "exception", "dead-lettered", "replay?", "replayed")),
            lesson=SEE)
    _nothing_parked(lab, topics, dead, specs, report)
    _no_commit_goes_back(lab, topics, group, report, (first_job, second_job))
    # The same job again: the first run's committed offsets say how far it got, skipped
    # records included, so the second finds nothing to send.
    again = replay(lab, topics, group, clock, exception_types=wanted_types,
                   failed_after=since, failed_before=until)
    counts: dict[bytes | None, int] = {}
    for r in lab.read(topics.source, topics.partitions, fence=True):
        counts[r.value] = counts.get(r.value, 0) + 1
    twice = [c for c in dead if counts.get(c.item.value, 0) > 1]
    if twice:
        committed = committed_offsets(lab.kafka.consumer_config(), group, topics.dead_letter,
                                      topics.partitions)
        raise CheckFailure(
            "The filtered job, run a second time with the same group and filters, re-published "
            "records the first run had re-published already. Run twice, a job sends nothing "
            "twice: after a run, its group's committed offset of every partition is past every "
            "record the run re-published (skipped ones around them do not pull it back).",
            expected="the second run re-publishes nothing",
            actual=f"sent twice: {', '.join(f'p{c.partition}@{c.offset}' for c in twice)}; "
                   f"committed after the two runs {offsets_text(committed)}; first report "
                   f"{report!r}, second {again!r}",
            lesson=SEE)


def _nameless_replayed(job: str) -> None:
    raise CheckFailure(
        "A DLT record without a kafka_dlt-exception-fqcn header (written by a tool that names "
        "no exception class) was re-published by a job filtered on exception types. It has no "
        "class name, so it is not one of exception_types: the type filter skips it. Only "
        "exception_types=None (no type filter) lets it through.",
        expected="the record without an exception class skipped",
        actual=f"re-published by {job}",
        fix="treat a missing exception class as a name outside the filter (None is not in "
            "exception_types)",
        lesson=SEE)


def _nothing_parked(lab, topics, dead: list[Crafted], specs: list[Any], report: Any) -> None:
    """README: the filters decide first; a record outside them is skipped, even at the cap or
    without an original topic: no job of the filter check parks anything."""
    parked = lab.read(topics.parking_lot,
                      max(topics.partitions, lab.partition_counts([topics.parking_lot])[
                          topics.parking_lot]), fence=True)
    if not parked:
        return
    what = {c.item.value: when for c, (_, _, _, when) in zip(dead, specs, strict=True)}
    names = {c.item.value: (c.item.key or b"(none)").decode() for c in dead}
    raise CheckFailure(
        "A record outside the filters went to the parking lot. The decision takes its rules in "
        "order, the first that applies decides: outside the filters (exception type, time "
        "window), skip it; then at the cap or without an original topic, park it; else "
        "re-publish it. A job filtered to one cause must leave every other record alone, "
        "also one at the cap or without its origin: parking it takes it out of the DLT's "
        "jobs for other causes, and a person is asked to decide on a record nobody meant to "
        "replay.",
        expected="nothing in the parking lot (both jobs skip the records at the cap or "
                 "without an original topic: their filters leave them out)",
        actual=f"{len(parked)} record(s) parked: "
               + ", ".join(f"{names.get(r.value, '?')} ({what.get(r.value, 'not the check’s')})"
                           for r in parked[:4])
               + f"; report of the filtered job {report!r}",
        fix="apply the filters first (skip), then the cap and the missing origin (park)",
        lesson=SEE)


def _no_commit_goes_back(lab, topics, group, report,
                         jobs: tuple[list[tuple[int, int]], ...]) -> None:
    """Each job's commits, partition by partition, in call order: never lower than one before
    (README: a committed offset never goes back), skipped records' commits included."""
    for number, offsets in enumerate(jobs, start=1):
        high: dict[int, int] = {}
        for partition, offset in offsets:
            if offset < high.get(partition, -1):
                committed = committed_offsets(lab.kafka.consumer_config(), group,
                                              topics.dead_letter, topics.partitions)
                in_order = ", ".join(str(o) for q, o in offsets if q == partition)
                raise CheckFailure(
                    f"A replay job with filters committed offset {high[partition]} of "
                    f"DLT partition {partition}, later {offset}: its committed offset went "
                    "back. A committed offset covers every record below it; moved back, it "
                    "hands the records in between to the next run again, which re-publishes "
                    "them twice. "
                    "Whether you commit a skipped record's offset is yours, but commit in "
                    "the order you handle the records, each before the next send: never a "
                    "lower offset after a higher one, such as skipped ones collected and "
                    "committed at the end.",
                    expected=f"the commits of p{partition} never lower than one before",
                    actual=f"commits of p{partition}, in order: {in_order}; committed now "
                           f"{offsets_text(committed)}; "
                           + ("the job with exception_types=[]" if number == 1 else
                              f"report {report!r}"),
                    fix="commit each record's offset when you handle it (a skipped one too, "
                        "or none), not a batch of skipped offsets after the loop",
                    lesson=SEE)
            high[partition] = max(offset, high.get(partition, -1))


class StillClock(InstantClock):
    """The checks' clock without the real time: its monotonic() moves only when slept or
    advanced. Spacing made by waiting in real time (time.sleep, a busy loop) then does not
    show on it, while clock.sleep() spaces the sends as before, however slow the machine."""

    def __init__(self) -> None:
        super().__init__()
        self._origin = time.monotonic()

    def monotonic(self) -> float:
        return self._origin + self.skipped


class SteppedStillClock(StillClock):
    """A StillClock whose wall time (now(), and the datetime it gives) can step, as NTP or a
    DST mistake steps a machine's clock; monotonic() never does."""

    def __init__(self) -> None:
        super().__init__()
        self.wall_offset = 0.0

    def __call__(self) -> Any:
        from datetime import timedelta

        return super().__call__() + timedelta(seconds=self.wall_offset)

    def now(self) -> float:
        return super().now() + self.wall_offset


class FirstAckLate(ProducerTap):
    """A producer tap whose first acknowledgement takes `seconds` on the clock (a broker
    that stalls once, then answers at once), or, with `real`, reaches the caller `seconds` of
    real time late (the caller is blocked in flush() or poll() meanwhile); `real_at` holds
    the real time of every produce()."""

    def __init__(self, producer: Any, clock: Any, seconds: float, real: bool = False) -> None:
        super().__init__(producer, clock)
        self._late, self._real, self._stalled = seconds, real, False
        self.real_at: list[float] = []

    def produce(self, *args: Any, **kwargs: Any) -> Any:
        self.real_at.append(time.monotonic())
        callback = kwargs.pop("on_delivery", None) or kwargs.pop("callback", None)

        def report(err: Any, msg: Any) -> None:
            if not self._stalled:
                self._stalled = True
                if self._real:
                    time.sleep(self._late)
                else:
                    self._clock.advance(self._late)
            if callback is not None:
                callback(err, msg)

        return super().produce(*args, on_delivery=report, **kwargs)


FIRST_ACK_SECONDS = 2.0
# The wall clock steps an hour back as the third record is sent, and forward again as the
# fifth is: pacing read on clock.now() then sleeps an hour before the fourth send (a stall)
# and sends the sixth at once (a burst); clock.monotonic() does not move with either.
WALL_STEPS = {2: -3600.0, 4: +3600.0}
# README: a send waits at most one interval after the previous send's acknowledgement. On
# the still clock only the first acknowledgement takes time (FIRST_ACK_SECONDS), so send n
# comes at most that ack's clock time + 1 / rate after send n - 1 (LATE_GAP_SLACK for a
# sleep cut in slices), and the whole run at most STALL_SLACK_S longer than the sum.
STALL_SLACK_S = 1.0
LATE_GAP_SLACK = 0.05
# The acknowledgement of send REAL_LATE_ACK (0-based; not the first, which is late on the
# clock) reaches the replay REAL_LATE_ACK_S of real time late and at once on the clock: a
# replay that measures the time since the previous send in real time (time.monotonic())
# but sleeps with clock.sleep() skips the sleep before the next send, which then leaves at
# once on the clock.
REAL_LATE_ACK = 1
REAL_LATE_ACK_S = 0.45


class WallStepsAtSends(FirstAckLate):
    """FirstAckLate that steps the clock's wall time by WALL_STEPS[n] as send n leaves, and
    hands the report of send REAL_LATE_ACK to the caller REAL_LATE_ACK_S of real time late
    (the caller is blocked in flush() or poll() meanwhile; the clock does not move)."""

    def produce(self, *args: Any, **kwargs: Any) -> Any:
        number = len(self.produced)
        step = WALL_STEPS.get(number)
        if step is not None:
            self._clock.wall_offset += step
        if number == REAL_LATE_ACK:
            callback = kwargs.pop("on_delivery", None) or kwargs.pop("callback", None)

            def late(err: Any, msg: Any) -> None:
                time.sleep(REAL_LATE_ACK_S)
                if callback is not None:
                    callback(err, msg)

            kwargs["on_delivery"] = late
        return super().produce(*args, **kwargs)


def test_replay_is_rate_limited(lab):
    topics = lab.topics()
    # Nine records in DLT partition 0, read in order; every third (PaymentDeclined) is
    # outside the type filter: a skip is no send and takes no place in the pacing. One more
    # in each other partition: the limit is the run's, not a partition's.
    kinds = ("InvalidEvent", "DownstreamUnavailable", "PaymentDeclined")
    everything = craft_dead_letters(lab, topics, [
        (healthy(f"acc-{n}", 100 + n, partition=0), kinds[n % 3], None)
        for n in range(RATE_RECORDS)] + [
        (healthy(f"acc-{p}0", 200 + p, partition=p), "InvalidEvent", None)
        for p in range(1, topics.partitions)])
    dead = [c for c in everything if c.exception != "PaymentDeclined"]
    # not a whole number, nor close to one: a rate cut to int (2) is too slow by far, one
    # rounded (3) too fast by more than SLACK
    rate = 2.7
    # The sends are timed on a clock that moves only when slept (or advanced): the spacing
    # must come from clock.sleep(), not from time that passed (the checks' usual clock
    # follows real time too, so a replay that waits in real time would look paced on it).
    clock = SteppedStillClock()
    # The first acknowledgement takes 2 s on the clock: a schedule kept from the start would
    # then send the next records in a burst to catch up. The wall clock steps back and
    # forward meanwhile (WALL_STEPS).
    sends = WallStepsAtSends(lab.dlt_producer(), clock, FIRST_ACK_SECONDS)
    began = clock.monotonic()
    # (Tansu's default fetch wait: the other partitions' records then reach the replay where
    # the diagnoses below expect them, a per-partition pacer's burst not after the late ack)
    replay(lab, topics, lab.kafka.group_id("dlt-replayer"), clock, producer=sends,
           config={"fetch.wait.max.ms": 500},
           rate_per_second=rate, exception_types={"InvalidEvent", "DownstreamUnavailable"})
    took = clock.monotonic() - began
    times = [p.at for p in sends.to(topics.source)]
    if len(times) < 2:
        raise CheckFailure(
            f"Replay re-published {len(times)} of the {len(dead)} records its type filter "
            f"wants ({', '.join(sorted({c.exception for c in dead}))}, read from "
            f"kafka_dlt-exception-fqcn), at {rate} per second: there was no pace to measure.",
            expected=f"{len(dead)} records re-published", actual=f"{len(times)}",
            lesson=SEE)
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    interval = 1 / rate
    # A send is timed where produce() is called, a moment after the replay read the clock to
    # pace it; on a loaded machine that moment can be some milliseconds, which shortens the
    # next gap by as much (the reference's own sends showed 6 ms). SLACK absorbs that; a
    # burst (gaps near zero) or a faster rate (the total below) is still far outside it.
    close = [(n, g) for n, g in enumerate(gaps, start=2) if g < interval - SLACK]
    # the send after the acknowledgement that came late in real time only
    after_real_ack = REAL_LATE_ACK + 2
    # the sends were spaced, but in real time rather than on the clock (the gap after the
    # late acknowledgement is spaced in real time by the check itself: it does not tell)
    real = [b - a for a, b in zip(sends.real_at, sends.real_at[1:], strict=False)]
    elsewhere = [(n, g) for n, g in close if n != after_real_ack]
    in_real_time = bool(elsewhere) and \
        all(real[n - 2] >= interval - SLACK for n, _ in elsewhere)
    # measured in real time, slept on the clock: only the gap after the late ack is short
    measured_real = bool(close) and not elsewhere
    floor = (len(dead) - 1) * interval - 0.01
    # what each send may wait on the clock after the previous send: its acknowledgement's
    # clock time (only the first takes any) + one interval
    allowed = [interval + (FIRST_ACK_SECONDS if n == 2 else 0.0) + LATE_GAP_SLACK
               for n in range(2, len(times) + 1)]
    ceiling = (len(dead) - 1) * interval + FIRST_ACK_SECONDS + STALL_SLACK_S
    # gaps (numbered by the later send, from 2) right after a wall step: send n+1 is the
    # first paced after the step at send n (0-based), so its gap is gaps[n]
    after_step = {n + 2: (step, gaps[n]) for n, step in WALL_STEPS.items() if n < len(gaps)}
    on_wall = [(n, step, g) for n, (step, g) in after_step.items()
               if (step < 0 and g > ceiling) or (step > 0 and g < interval - SLACK)]
    # Paced on the wall: the step back stalls it (the sure sign), or the step forward makes
    # the only short gap. A burst elsewhere too is another mistake (the message below).
    if not any(step < 0 for _, step, _ in on_wall) and \
            any(g < interval - SLACK for n, g in enumerate(gaps, start=2) if n not in after_step):
        on_wall = []
    slow = [(n, g) for n, g in enumerate(gaps, start=2) if g > allowed[n - 2]]
    # a slow gap with a skipped record between its two sends, in the DLT's order
    sent_values = [p.value for p in sends.to(topics.source)]
    # (in partition 0, where the skips are: the order of two partitions is the replay's own)
    place: dict[bytes | None, int] = {c.item.value: n for n, c in enumerate(everything)
                                      if c.partition == 0}
    over_skip = [n for n, _ in slow if n - 1 < len(sent_values)
                 and sent_values[n - 2] in place and sent_values[n - 1] in place
                 and any(place.get(sent_values[n - 2], -1) < k < place.get(sent_values[n - 1], -1)
                         for k, c in enumerate(everything) if c not in dead)]
    # the gaps the rate alone sets (not after the slow acknowledgements, nor a wall step)
    paced = [g for n, g in enumerate(gaps, start=2)
             if n not in (2, after_real_ack) and n not in after_step]
    whole = sorted({w for w in (math.floor(rate), math.ceil(rate)) if w > 0
                    and paced and all(abs(g - 1 / w) < SLACK / 2 for g in paced)})
    cut = (f" The sends came {1 / whole[0]:.3f} s apart, 1 / {whole[0]}: the rate was made a "
           f"whole number ({rate} per second is {interval:.3f} s apart). rate_per_second is "
           "a float; so is the interval.") if whole else ""
    evidence = table([(n, f"t+{t - times[0]:.3f}s", f"{g:.3f} s" if g is not None else "",
                       "TOO SOON" if g is not None and g < interval - SLACK else
                       "TOO LATE" if g is not None and g > allowed[n - 2] else "")
                      for n, (t, g) in enumerate(zip(times, [None, *gaps], strict=True),
                                                 start=1)],
                     ("send", "at (clock)", "after the previous", ""))
    if on_wall:
        raise CheckFailure(
            "Replay paced its sends on the wall clock. The wall clock (clock.now()) steps "
            "when NTP corrects it or a host's zone is set wrong: here it stepped an hour back "
            "as the third record left and an hour forward as the fifth did, and the gap "
            "after each step followed the wall, not the time that passed: a stall after a "
            "step back (the replay slept the hour away), a burst after a step forward. A "
            "rate limit is a duration: measure it with clock.monotonic(), which never steps.",
            expected=f"sends {interval:.3f} s apart on clock.monotonic(), whatever the wall "
                     "clock does",
            actual="; ".join(f"after the {'back' if step < 0 else 'forward'} step: send {n} "
                             f"{g:.3f} s after send {n - 1}" for n, step, g in on_wall),
            evidence=evidence,
            fix="pace on clock.monotonic() (next_send, now), not clock.now()",
            lesson=SEE)
    if took > ceiling or slow:
        raise CheckFailure(
            f"Replay took {took:.1f} s on the clock for {len(dead)} sends at {rate} per second "
            f"(the first acknowledgement took {FIRST_ACK_SECONDS:.0f} s on the clock, the "
            "others none): it waited longer than the rate needs. A send waits at most "
            "1 / rate_per_second after the previous send's acknowledgement, no more." + cut
            + (" Each gap that came too late spans a record the type filter skipped: a skip is "
               "no send, and takes no place in the pacing." if over_skip and not cut else ""),
            expected=f"each send at most {interval:.3f} s after the previous one's "
                     f"acknowledgement; at most {ceiling:.1f} s on the clock in all",
            actual=f"{took:.1f} s"
                   + (": " + ", ".join(f"send {n} {g:.3f} s after send {n - 1}"
                                       for n, g in slow[:3]) if slow else ""),
            evidence=evidence,
            fix=CUT_FIX if cut else
            "pace only the sends: sleep before a re-publish, not before every record read"
            if over_skip and len(over_skip) == len(slow) else None,
            lesson=SEE)
    if close or len(times) < len(dead) or took < floor:
        raise CheckFailure(
            "Replay is a write to production: at most rate_per_second records per second, so a "
            "backlog of thousands does not flood the consumer (or the gateway behind it). "
            "Space the sends: each re-publish at least 1 / rate_per_second after the previous "
            "one on the clock (clock.sleep() for the rest); no burst at the start, as a token "
            "bucket that starts full would allow."
            + (f" The first acknowledgement took {FIRST_ACK_SECONDS:.0f} s on the clock; the "
               "sends after it came in a burst, making up for the stall (as a schedule that "
               "keeps its start, next += interval, or a token bucket that filled meanwhile "
               "does): pace each send from the previous one."
               if close and close[0][0] > 2 and not in_real_time and not measured_real
               and not cut
               else "")
            + (f" The acknowledgement of send {after_real_ack - 1} reached the replay "
               f"{REAL_LATE_ACK_S:.2f} s late in real time and at once on the clock; send "
               f"{after_real_ack} then left at once on the clock: the replay measured the "
               "time since the previous send in real time (time.monotonic()) and slept only "
               "the rest, with clock.sleep(). Measure on the clock you sleep on: "
               "clock.monotonic()."
               if measured_real else "")
            + (" The sends were spaced in real time (a wait that clock.sleep() did not "
               "make): the clock, which only moves when slept here, did not see it."
               if in_real_time else "")
            + (cut if not in_real_time and not measured_real else ""),
            expected=f"{len(dead)} records at {rate} per second: sends at least "
                     f"{interval:.3f} s apart on the clock",
            actual=f"{len(close)} of {len(gaps)} gaps shorter on the clock"
                   + (" (" + ", ".join(f"{real[n - 2]:.3f} s" for n, _ in close)
                      + " of real time)" if in_real_time else "") if close else
                   f"{len(times)} sends in {took:.2f} s", evidence=evidence,
            fix="wait with clock.sleep() between sends, not time.sleep() (or any wait in real "
                "time): the clock you are handed is the one the rate is measured on"
                if in_real_time else
                "read the time since the previous send with clock.monotonic(), the clock "
                "clock.sleep() moves, not time.monotonic()"
                if measured_real else
                CUT_FIX if cut else None,
            lesson=SEE)


RATE_RECORDS = 9
CUT_FIX = "interval = 1 / rate_per_second, in floats: never int() or round() the rate"


def test_replay_timeout_is_real_time(lab, clock):
    """Nine records at 1.3 per second take over six seconds of the clock's time and, since
    the checks' clock skips every sleep, about a second of real time: a 4.7 s timeout in
    real time leaves the run whole."""
    topics = lab.topics()
    dead = mixed(lab, topics, replays=(None,) * 9)
    sends = ProducerTap(lab.dlt_producer(), clock)
    began, clock_began = time.monotonic(), clock.monotonic()
    report = replay(lab, topics, lab.kafka.group_id("dlt-replayer"), clock, producer=sends,
                    rate_per_second=1.3, timeout_seconds=4.7)
    real, on_clock = time.monotonic() - began, clock.monotonic() - clock_began
    sent = len(sends.to(topics.source))
    if sent < len(dead) and real < 4.7:
        # A deadline read on the clock ends the run once the clock is past 4.7 s, or would
        # be after the next paced send's wait: only then is the clock the likely cause.
        on_the_clock = on_clock + 1 / 1.3 >= 4.7
        raise CheckFailure(
            f"Replay returned after {sent} of {len(dead)} records, {real:.1f} s into a run "
            "whose timeout_seconds is 4.7."
            + (" The rate limit's sleeps (1.3 records per second) had moved the clock "
               f"{on_clock:.1f} s on, to the timeout or past it: the deadline was read on the "
               "clock. timeout_seconds bounds a run in real time; the clock you are handed is "
               "for the pacing, and the checks' clock skips every sleep." if on_the_clock else
               f" Neither the real time nor the clock ({on_clock:.1f} s on, 1.3 records per "
               "second) had reached the timeout, so no deadline ended it: the run stopped "
               "short of the end offsets it read at the start (look at where it decides that "
               "a partition is done)."),
            expected=f"all {len(dead)} re-published", actual=f"{sent}; report {report!r}",
            fix="measure the deadline with time.monotonic(), not clock.monotonic()"
                if on_the_clock else None,
            lesson=SEE)


# Five jobs over one DLT (four records in partition 0, read in order, and two in each other
# partition), each through a producer that fails a write: (what the failed write is,
# max_replays, the topic whose first write fails, whether its delivery report never comes
# rather than reporting an error, whether every retry of it fails too, the ack_timeout_seconds
# handed to replay). The first job's first re-publish fails once, whichever partition it comes
# from (a retry of it is acknowledged); the second job (cap 1: the second record of p0,
# replayed once, is at it) fails to park that record, once; the third job's first re-publish
# gets no delivery report within the run: flush() and poll() wait their whole timeout for it,
# as a real client's do, and one without a timeout waits until the job's hang_seconds (see
# _hang_seconds), when the broker's own timeout reports it failed; the fourth job's first
# re-publish fails, and so does every retry of it (a replay that retries and then gives up on
# the record, skipping it, must stop there instead); the fifth job's park gets no delivery
# report either: every wait for an acknowledgement is bounded, a park's too. The silent jobs
# cost their ack_timeout_seconds of real time, so theirs is short.
FAIL_ONCE_JOBS = (("re-publish to the source", 3, "source", False, False, 2.0),
                  ("park in the parking lot", 1, "parking_lot", False, False, 2.0),
                  ("silent re-publish to the source", 3, "source", True, False, 1.5),
                  ("re-publish to the source", 3, "source", False, True, 2.0),
                  ("silent park in the parking lot", 1, "parking_lot", True, False, 1.5))
JOB_TIMEOUT_S = 10.0
# README: a run returns within a second of its timeout_seconds, plus the ack_timeout_seconds
# of a write in flight then; SLACK_LATE_S for a loaded machine (and close())
RETURN_WITHIN_S = 1.0
SLACK_LATE_S = 1.25
# README: a write without its report within ack_timeout_seconds has failed. The retry of a
# silent write, or the run's end, comes at most this long after those seconds are up (a
# loaded machine, close()); a second wait of the same length (1.5 s here) is well past it.
SILENT_SLACK_S = 0.9


def _hang_seconds(ack_timeout: float) -> float:
    """When a silent write's report comes at last (the broker's own timeout): later than any
    replay that bounds its waits can still be running."""
    return JOB_TIMEOUT_S + ack_timeout + RETURN_WITHIN_S + SLACK_LATE_S + 2.0


OTHER_PARTITIONS_EACH = 2


def _write_of(sends: ProducerTap, value: bytes, topic: str) -> str:
    """What became of the write of `value` bound for `topic` (a write elsewhere is not it)."""
    writes = [p for p in sends.produced if p.value == value and p.topic == topic]
    if not writes:
        elsewhere = [p.topic for p in sends.produced if p.value == value]
        return f"not sent (sent to {elsewhere[0]})" if elsewhere else "not sent"
    if any(p.acked_at is not None and p.error is None for p in writes):
        return "acknowledged"
    failed = [p.error for p in writes if p.error is not None]
    if not failed:
        return "no delivery report"
    code = re.search(r"code=(\w+)", failed[0])
    return f"failed: {code.group(1) if code else failed[0][:40]}"


def test_replay_commits_only_after_the_ack(lab, clock):
    topics = lab.topics()
    kinds = ("InvalidEvent", "DownstreamUnavailable", "PaymentDeclined", "InvalidEvent")
    dead = craft_dead_letters(lab, topics, [
        (healthy(f"acc-{n}", 100 + n, partition=0), kind, 1 if n == 1 else None)
        for n, kind in enumerate(kinds)] + [
        (healthy(f"acc-{p}{n}", 200 + 10 * p + n, partition=p), "InvalidEvent", None)
        for p in range(1, topics.partitions) for n in range(OTHER_PARTITIONS_EACH)])
    by_value = {c.item.value: c for c in dead}
    sink = lab.kafka.topic(1, hint="unacknowledged")
    with CommitCalls() as commits:  # the replay's consumer is built inside it
        for bound, max_replays, fail_topic, silent, every_time, ack in FAIL_ONCE_JOBS:
            group = lab.kafka.group_id("dlt-replayer")
            hang = _hang_seconds(ack)
            router = FailOnce(lab.dlt_producer(), sink, fail_topic=getattr(topics, fail_topic),
                              silent=silent, every_time=every_time, hang_seconds=hang)
            sends = ProducerTap(router, clock)
            first_commit = len(commits.offsets)  # this job's commits come after
            began = time.monotonic()
            report: Any = None
            try:
                report = replay(lab, topics, group, clock, producer=sends,
                                max_replays=max_replays, ack_timeout_seconds=ack,
                                timeout_seconds=JOB_TIMEOUT_S)
                outcome = f"replay returned {report!r}"
            except CheckFailure:
                raise  # a stub: not written yet
            except Exception as exc:  # a failed write may raise: that is fine
                outcome = f"replay raised {type(exc).__name__}"
            took = time.monotonic() - began
            committed = committed_offsets(lab.kafka.consumer_config(), group,
                                          topics.dead_letter, topics.partitions)

            def bound_for(c: Crafted, cap: int = max_replays) -> str:
                return topics.parking_lot if (c.replays or 0) >= cap else topics.source

            writes = {(c.partition, c.offset): _write_of(sends, c.item.value, bound_for(c))
                      for c in dead}
            below = {(c.partition, c.offset): c.offset < committed.get(c.partition, -1)
                     for c in dead}
            rows = [(f"p{c.partition}@{c.offset}", "parking lot" if bound_for(c) ==
                     topics.parking_lot else "source", writes[(c.partition, c.offset)],
                     "yes" if below[(c.partition, c.offset)] else "no") for c in dead]
            columns = ("DLT record", "bound for", "its write", "below the committed offset")
            at = router.failed
            if at is None or at >= len(sends.produced):
                continue  # no write failed: the records were not sent (another check says so)
            failed_write = sends.produced[at]
            failed = by_value.get(failed_write.value or b"")
            unacked = [c for c in dead if below[(c.partition, c.offset)]
                       and writes[(c.partition, c.offset)] != "acknowledged"]
            park = "park" in bound
            # the next send came after the failure was reported (went on), or before it
            # was (did not wait for the delivery report)
            first_after = router.after_failure[:1]
            went_on, unwaited = first_after == [True], first_after == [False]
            if silent:  # no report ever came: whether the next send waited for it says nothing
                went_on = unwaited = False
            # a commit covering the failed record before its report reached the caller: it
            # did not wait, whether or not the report happened to come before the next send
            covering = [t for (p, o), t in zip(commits.offsets[first_commit:],
                                               commits.at[first_commit:], strict=True)
                        if failed is not None and p == failed.partition and o > failed.offset]
            if covering and (router.reported_at is None or covering[0] < router.reported_at):
                went_on, unwaited = False, not silent

            def again(p: Any, failed_write: Any = failed_write) -> bool:  # a retry of it
                return p.value == failed_write.value and p.topic == failed_write.topic

            # Only what was sent between the failure and the first acknowledged retry of it
            # matters: once a retry is acknowledged the run goes on as if nothing had failed.
            retry_at = next((n for n in range(at + 1, len(sends.produced))
                             if again(sends.produced[n]) and sends.produced[n].acked_at is not None
                             and sends.produced[n].error is None), None)
            later = [p for p in sends.produced[at + 1:retry_at] if not again(p)]
            parked_instead = [p for p in later if p.value == failed_write.value]
            name = (f"p{failed.partition}@{failed.offset}" if failed is not None
                    else "the record")
            retries = sum(1 for p in sends.produced[at + 1:] if again(p))
            failed_how = ("failed, and so did every retry of it" if every_time
                          else "failed once")
            if unacked:
                raise CheckFailure(
                    f"A write of the replay {failed_how} (a {bound} the broker never "
                    "acknowledged, while it acknowledged every other write), yet the job's "
                    "committed DLT offset covers the record: no later run of this job replays it. "
                    "Commit a DLT offset only after the write it caused was acknowledged, and "
                    "after a failed write stop the run (raise, or return) with nothing after it "
                    "committed: a committed offset covers every record below it, so committing "
                    "the next record's covers the failed one too."
                    + (" The failed write was a park: the parking lot never had the record. A "
                       "park is a write like a re-publish: wait for its acknowledgement too."
                       if park else "")
                    + (f" {name} went to {parked_instead[0].topic} instead: a record is parked "
                       "only at the cap or without its origin, never because the broker refused "
                       "its re-publish once." if parked_instead else "")
                    + (f" It was retried {retries} time(s), and no retry was acknowledged: a "
                       "record whose write never succeeded is neither skipped nor parked. When "
                       "the retries fail too, the run ends there, the record uncommitted, and "
                       "the next run starts at it." if every_time and retries else "")
                    + (f" No delivery report came for it at all, within the ack_timeout_seconds "
                       f"of this run ({ack:g} s) or after: a write without its "
                       "report in time failed too." if silent else ""),
                    expected=f"the group's committed offset of p{failed.partition if failed else 0}"
                             f" at most {failed.offset if failed else '…'} (the record whose "
                             "write failed), or none",
                    actual=f"{outcome}; committed {offsets_text(committed)}: covers "
                           + ", ".join(f"p{c.partition}@{c.offset} "
                                       f"({writes[(c.partition, c.offset)]})" for c in unacked),
                    evidence=table(rows, columns),
                    # the jobs before, whose failed write reported an error, passed: this
                    # replay waits for reports and heeds an error, not their absence
                    fix="treat a write whose delivery report has not come within "
                        "ack_timeout_seconds as failed: flush() returning is no "
                        "acknowledgement; only a callback that ran with no error is"
                        if silent and failed in unacked and not parked_instead else
                        "when a re-publish fails, raise (or return the report) with the record "
                        "uncommitted; do not park it: the next run replays it"
                        if parked_instead and failed in unacked else
                        "when the retry of a failed write fails too, stop the run there (raise, "
                        "or return the report) with the record uncommitted: never skip it"
                        if every_time and retries and failed in unacked else
                        "stop at the failed write (raise, or return the report) instead of going "
                        "on to the next record: its commit covers the failed one"
                        if went_on and failed in unacked else
                        "wait for each write's delivery report (flush(ack_timeout_seconds), or "
                        "poll() until its callback ran) and commit only when it reported no "
                        "error"
                        if unwaited and failed in unacked else None,
                    lesson=SEE)
            backwards = [(partition, high, offset) for n, (partition, offset)
                         in enumerate(commits.offsets[first_commit:])
                         for high in [max((o for p, o in commits.offsets[first_commit:][:n]
                                           if p == partition), default=-1)] if offset < high]
            if later:
                others = {by_value[p.value].partition for p in later
                          if p.value in by_value and p.value != failed_write.value}
                only_elsewhere = failed is not None and bool(others) and \
                    failed.partition not in others and not parked_instead
                raise CheckFailure(
                    f"A write of the replay {failed_how} (a {bound} of {name} the broker never "
                    "acknowledged), and the run went on: it sent "
                    f"{len(later)} more record(s) after it"
                    + (f", before it retried {name} (that retry was acknowledged, after them)"
                       if retry_at is not None else "")
                    + (f", {name} itself to {parked_instead[0].topic}" if parked_instead else "")
                    + (f", from partition(s) {', '.join(f'p{p}' for p in sorted(others))}"
                       if others else "")
                    + ". A failed write stops the whole run: raise (or return the report) "
                    "before the next send, in any partition, with the failed record uncommitted "
                    "and nothing after it committed, so that the next run starts at it. A retry "
                    "of the same write may come first; only once it is acknowledged may the run "
                    "go on. A refused write usually means the broker or the topic is in trouble "
                    "for every record, and a key's records can sit in several DLT partitions: "
                    "going on elsewhere sends a key's later record ahead of the one that failed.",
                    expected=f"nothing sent after the failed write of {name} until a retry of it "
                             "was acknowledged",
                    actual=f"{outcome}; sent after it: "
                           + ", ".join(
                               (f"p{by_value[p.value].partition}@{by_value[p.value].offset}"
                                if p.value in by_value else "?") + f" to {p.topic}"
                               for p in later[:6])
                           + (" …" if len(later) > 6 else "")
                           + f"; committed {offsets_text(committed)}",
                    evidence=table(rows, columns),
                    fix="when a re-publish fails, raise (or return the report) with the record "
                        "uncommitted; do not park it: the next run replays it"
                        if parked_instead else
                        "retry a failed write in place, before any other send, or stop the run "
                        "there: a retry after other records comes too late"
                        if retry_at is not None else
                        "stop the whole run at a failed write, not only the partition it came "
                        "from: a refused write ends the run" if only_elsewhere else
                        "wait for each write's delivery report (flush(ack_timeout_seconds), or "
                        "poll() until its callback ran) before the next send"
                        if unwaited else None,
                    lesson=SEE)
            allowed = JOB_TIMEOUT_S + ack + RETURN_WITHIN_S
            if took > allowed + SLACK_LATE_S:
                raise CheckFailure(
                    f"A write of the replay {failed_how} (a {bound} of {name}"
                    + (", whose delivery report did not come" if silent else "")
                    + f"), and the replay took {took:.1f} s of real time to return or raise, "
                    f"though its timeout_seconds was {JOB_TIMEOUT_S:.0f} and its "
                    f"ack_timeout_seconds {ack:g}. Every wait of a run is bounded: "
                    "a write whose report has not come within ack_timeout_seconds has failed "
                    "(give flush() that timeout, or poll() until it is up), and a run returns "
                    "within about a second of timeout_seconds, or of the end of a write in "
                    "flight then."
                    + (" flush() was called without a timeout while the write waited for its "
                       "report: it waits as long as the broker does (message.timeout.ms, five "
                       "minutes by default; a broker that never answers holds the replay that "
                       f"long; here the report came as failed only after {hang:.0f} s)."
                       if router.unbounded_flush else ""),
                    expected=f"the replay ended within {allowed:g} s (timeout_seconds + "
                             "ack_timeout_seconds + 1 s)",
                    actual=f"{outcome} after {took:.1f} s; committed {offsets_text(committed)}",
                    evidence=table(rows, columns),
                    fix="producer.flush(ack_timeout_seconds): a flush() without a timeout waits "
                        "for the broker's own timeout" if router.unbounded_flush else None,
                    lesson=SEE)
            # a write with no report: the next thing after it (a retry of it, or the run's
            # end) comes within ack_timeout_seconds, not when the run's deadline is near
            if silent and router.failed_real_at is not None:
                next_at = router.retried_real_at or began + took
                waited = next_at - router.failed_real_at
                if waited > ack + SILENT_SLACK_S:
                    raise CheckFailure(
                        f"A write of the replay got no delivery report (a {bound} of {name}), "
                        f"and the replay waited {waited:.1f} s for it before it "
                        + ("retried it" if router.retried_real_at else "returned or raised")
                        + f", though its ack_timeout_seconds was {ack:g}. A write whose "
                        "report has not come within ack_timeout_seconds has failed: stop "
                        "waiting then (flush(ack_timeout_seconds) once, or poll() until that "
                        "time is up), not at the run's deadline nor after a second wait.",
                        expected=f"the wait over within {ack:g} s (+{SILENT_SLACK_S:g} s)",
                        actual=f"{outcome} after {took:.1f} s; committed "
                               f"{offsets_text(committed)}",
                        evidence=table(rows, columns),
                        fix="wait for a delivery report at most ack_timeout_seconds"
                            if not router.unbounded_flush else None,
                        lesson=SEE)

            if backwards:
                partition, high, low = backwards[0]
                raise CheckFailure(
                    f"A write of the replay {failed_how} (a {bound} of {name}), and the job's "
                    f"committed offset of p{partition} then went back: it committed {high}, "
                    f"later {low}. A committed offset covers every record below it; moved back, "
                    "it hands the records in between to the next run again, which sends them "
                    "twice. Stop at the failed write (after a retry in place, if you retry), and "
                    "commit each offset in order, after its record's write was acknowledged.",
                    expected=f"the group's committed offset of p{partition} never lower than "
                             "before",
                    actual=f"{outcome}; commits of p{partition}, in order: "
                           + ", ".join(str(o) for q, o in commits.offsets[first_commit:]
                                       if q == partition)
                           + f"; committed {offsets_text(committed)}",
                    evidence=table(rows, columns), lesson=SEE)
            # A run that returns its report at a write that stayed failed counts only what
            # was acknowledged: the failed record is neither replayed nor parked (yet).
            if report is not None and retry_at is None:
                acked = [c for c in dead if writes[(c.partition, c.offset)] == "acknowledged"]
                want_counts = (sum(1 for c in acked if bound_for(c) == topics.source),
                               sum(1 for c in acked if bound_for(c) == topics.parking_lot))
                counted = (getattr(report, "replayed", None), getattr(report, "parked", None))
                if counted != want_counts:
                    raise CheckFailure(
                        f"A write of the replay {failed_how} (a {bound}), and the run returned "
                        f"its report there: replayed={counted[0]}, parked={counted[1]}, though "
                        f"the broker had acknowledged {want_counts[0]} re-publish(es) and "
                        f"{want_counts[1]} park(s). The report counts what this run did: a "
                        "record whose write failed was neither replayed nor parked; the next "
                        "run handles it, and counts it then.",
                        expected="ReplayReport(replayed={}, parked={}, …)".format(*want_counts),
                        actual=outcome, evidence=table(rows, columns),
                        fix="count a record after its write was acknowledged, not before you "
                            "send it" if counted[0] is not None and counted[1] is not None
                            and counted[0] + counted[1] == sum(want_counts) + 1 else None,
                        lesson=SEE)
            # Once a retry of the failed write is acknowledged, the run goes on as if nothing
            # had failed (README): only a write that stays failed, or timeout_seconds, ends it
            # early. A run that stopped before its deadline must then have handled every record.
            untouched = [c for c in dead if writes[(c.partition, c.offset)] != "acknowledged"
                         or not below[(c.partition, c.offset)]]
            if retry_at is not None and not every_time and untouched \
                    and took < JOB_TIMEOUT_S - 0.5:
                raise CheckFailure(
                    f"A write of the replay failed once (a {bound} of {name}), it was retried in "
                    "place and the retry was acknowledged, and then the run ended "
                    f"({took:.1f} s into a timeout_seconds of {JOB_TIMEOUT_S:.0f}) with "
                    f"{len(untouched)} of the {len(dead)} records in the DLT not replayed and "
                    "committed. Once a retry is acknowledged, the run goes on as if nothing had "
                    "failed: only a write that stays failed (its retries failed too) or "
                    "timeout_seconds ends a run early. A run that stops at a write it did "
                    "retry successfully leaves the rest of the DLT for a next run nobody may "
                    "start, while its report says all went well.",
                    expected=f"all {len(dead)} records replayed (or parked at the cap) and "
                             "committed in that run",
                    actual=f"{outcome}; not done: "
                           + ", ".join(f"p{c.partition}@{c.offset} "
                                       f"({writes[(c.partition, c.offset)]})"
                                       for c in untouched[:6])
                           + (" …" if len(untouched) > 6 else "")
                           + f"; committed {offsets_text(committed)}",
                    evidence=table(rows, columns),
                    fix="after an acknowledged retry, carry on with the next record as after any "
                        "acknowledged write; stop (raise, or return) only when the retries fail "
                        "too",
                    lesson=SEE)
            # A retry sends the same record again: the same headers, one x-replay-count.
            if retry_at is not None:
                resent = sends.produced[retry_at]
                counts_sent = [v for k, v in resent.headers if k == "x-replay-count"]
                if resent.topic == topics.source and len(counts_sent) > 1:
                    raise CheckFailure(
                        f"A write of the replay failed once (a {bound}), and its retry in place "
                        "was acknowledged, but the retry did not send the same record: its "
                        f"headers carry {len(counts_sent)} x-replay-count header(s) "
                        f"({', '.join(repr(v) for v in counts_sent)}). A retry resends what the "
                        "failed write sent: build the headers once (a fresh list per record), "
                        "not by appending to the list the first attempt already extended.",
                        expected="the retried record with one x-replay-count, as the first "
                                 "attempt had",
                        actual=f"{outcome}; retry headers: "
                               + ", ".join(k for k, _ in resent.headers),
                        evidence=table(rows, columns),
                        fix="make the header list once per record, before the first attempt, "
                            "and send that same list on every retry",
                        lesson=SEE)
            # The report counts records, not attempts: after a retry that was acknowledged,
            # the run ended with everything done, so it counts each record once.
            replayed_n = sum(1 for c in dead if bound_for(c) == topics.source)
            parked_n = len(dead) - replayed_n
            counted = (getattr(report, "replayed", None), getattr(report, "parked", None))
            if retry_at is not None and not every_time and not untouched \
                    and report is not None and counted != (replayed_n, parked_n):
                over = (isinstance(counted[0], int) and isinstance(counted[1], int)
                        and counted[0] + counted[1] == len(dead) + retries)
                raise CheckFailure(
                    f"A write of the replay failed once (a {bound}), it was retried in place and "
                    "the retry was acknowledged, and the run then replayed the rest of "
                    f"the DLT: {replayed_n} record(s) re-published and {parked_n} parked, each "
                    f"once. Its report says replayed={counted[0]}, parked={counted[1]}. The "
                    "report counts records, not attempts: a record whose write needed a retry "
                    "is one record replayed (or parked), counted once its write is acknowledged."
                    + (f" The count is over by the {retries} retr{'y' if retries == 1 else 'ies'}"
                       ": the failed attempt was counted too." if over else ""),
                    expected=f"ReplayReport(replayed={replayed_n}, parked={parked_n}, skipped=0)",
                    actual=outcome, evidence=table(rows, columns),
                    fix="count a record when its write is acknowledged, once, not at each "
                        "attempt to send it" if over else None,
                    lesson=SEE)


def test_replay_commits_each_record_before_the_next_send(lab, clock):
    topics = lab.topics()
    dead = mixed(lab, topics, replays=(None, None, 3, None, None, None))
    group = lab.kafka.group_id("dlt-replayer")
    config = lab.kafka.consumer_config()
    seen: list[tuple[int, dict[int, int]]] = []

    def before(number):
        if number:  # from the second send on: what the group had committed by then
            seen.append((number + 1, committed_offsets(config, group, topics.dead_letter,
                                                       topics.partitions)))

    hook = HookedProducer(lab.dlt_producer(), clock, before)
    with CommitCalls() as commits:  # the replay's consumer is built inside: count its commits
        replay(lab, topics, group, clock, producer=hook)
    by_value = {c.item.value: c for c in dead}
    sent = [by_value.get(p.value or b"") for p in hook.produced]
    rows, late = [], []
    for number, committed in seen:
        behind = [c for c in sent[:number - 1]
                  if c is not None and committed.get(c.partition, -1) <= c.offset]
        rows.append((f"send {number}", offsets_text(committed),
                     ", ".join(f"p{c.partition}@{c.offset}" for c in behind) or "—"))
        if behind:
            late.append(number)
    if late:
        raise CheckFailure(
            "When the replay sent its next record, records it had sent (and had acknowledged) "
            "before were not committed yet for its group. A crash then sends them all again. "
            "Commit each DLT offset as soon as its write was acknowledged, before the next "
            "send: a crash repeats at most the record in flight.",
            expected="at every send, every record sent before it committed",
            actual=f"{len(late)} of {len(seen)} sends found earlier records uncommitted",
            evidence=table(rows, ("at", "group's committed DLT offsets", "sent, not committed")),
            lesson=SEE)
    if commits.asynchronous:
        # On the local broker a queued commit lands within milliseconds, before the next
        # send: the offsets read above cannot tell. The call itself does.
        raise CheckFailure(
            "The replay's consumer.commit() was called without asynchronous=False: it only "
            "queued the commit and returned before the broker had the offset. The next send "
            "then goes out with the previous record possibly uncommitted (a crash sends it "
            "again), and a commit the broker refuses fails silently instead of in your code. "
            "Commit synchronously, after the acknowledgement and before the next send.",
            expected="every commit() synchronous (asynchronous=False)",
            actual=f"{commits.asynchronous} of {commits.calls} commit() call(s) asynchronous",
            fix="consumer.commit(message=msg, asynchronous=False)",
            lesson=SEE)


# One record per fetch into the replay's consumer (fetch.max.bytes: at least one record, and
# no more than 1 KiB holds), and a pause of FETCH_GAP_MS before the next fetch once one is
# queued (fetch.queue.backoff.ms): the two records waiting at the start arrive with over a
# second of nothing in between (longer than a poll(1.0)), and the partition's end is not in
# sight before what comes before it was worked through.
FETCH_GAP_MS = 1100
ONE_AT_A_TIME = {"queued.min.messages": 1, "queued.max.messages.kbytes": 1,
                 "fetch.max.bytes": 1024, "message.max.bytes": 1000,
                 "max.partition.fetch.bytes": 1024, "fetch.queue.backoff.ms": FETCH_GAP_MS}


def _big(item: Item) -> Item:
    """The item with a business header of the check's that makes it over 1 KiB: one record
    per fetch under ONE_AT_A_TIME."""
    return replace(item, headers=(*item.headers, ("x-note", b"." * 1100)))


def test_replay_stops_at_the_end_it_found(lab, clock):
    topics = lab.topics()
    # two records in p0, one in p1
    dead = craft_dead_letters(lab, topics, [
        (_big(healthy(f"acc-{n}", 300 + n, partition=(0, 0, 1)[n])),
         "InvalidEvent", None) for n in range(3)])
    by_value = {c.item.value: c for c in dead}
    late: list = []

    def before(number):
        if number == 0:  # the replay has begun: the consumer writes one more dead letter, to
            # a partition whose first record the replay has not had yet (its end, read
            # first, must not grow with it)
            first = by_value.get(hook.sending or b"")
            partition = 1 if first is None or first.partition == 0 else 0
            late.extend(craft_dead_letters(lab, topics, [
                (healthy("acc-late", 999, partition=partition), "InvalidEvent", None)]))

    hook = HookedProducer(lab.dlt_producer(), clock, before)
    group = lab.kafka.group_id("dlt-replayer")
    began = time.monotonic()
    try:
        report = replay(lab, topics, group, clock, producer=hook, config=ONE_AT_A_TIME)
    except CheckFailure:
        raise
    except Exception as exc:
        report = f"raised {type(exc).__name__}: {str(exc)[:120]}"
    took = time.monotonic() - began
    sent = {p.value for p in hook.to(topics.source)}
    if late and late[0].item.value in sent:
        raise CheckFailure(
            "A dead letter written while the replay ran was replayed by it. Replay works "
            "through what was in the DLT when it started: it reads the end offsets of every "
            "partition first, before it handles any record, and stops there. Reading until "
            "the end of the partition instead (or reading a partition's end only once its "
            "first record arrives) chases a live consumer that keeps dead-lettering (during "
            "an outage, for ever), and replays a failure seconds old before anyone has looked "
            "at it.",
            expected=f"the {len(dead)} records that were there at the start replayed, not "
                     f"p{late[0].partition}@{late[0].offset}",
            actual=f"p{late[0].partition}@{late[0].offset}, written after the first send to a "
                   "partition whose first record had not reached the replay yet, was "
                   f"re-published; report {report!r}",
            lesson=SEE)
    left = [c for c in dead if c.item.value not in sent]
    if left:
        returned = not isinstance(report, str)
        raise CheckFailure(
            f"Replay {'returned' if returned else 'ended'} after {took:.1f} s of real time "
            f"(its timeout_seconds was 60) with {len(left)} of the {len(dead)} records that "
            "were in the DLT when it started not replayed. This DLT's records reached the "
            f"replay's consumer a fetch at a time, {FETCH_GAP_MS / 1000:.1f} s apart (the "
            "check's consumer settings): an empty poll() says only that nothing has arrived "
            "yet, not that the partition is done. Work through what was there at the start: "
            "read the end offsets first and stop at them.",
            expected=f"the {len(dead)} records (p0@{dead[0].offset}, p0@{dead[1].offset}, "
                     f"p1@{dead[2].offset}) replayed",
            actual=f"not replayed: {', '.join(f'p{c.partition}@{c.offset}' for c in left)}; "
                   + (f"replay returned {report!r}" if returned else f"replay {report}"),
            # returned on its own sooner than the next fetch could come: it took the lull
            # for the end
            fix="read the end offsets at the start and poll until every partition's position "
                "reaches its end (or the deadline), instead of stopping at the first empty poll"
                if returned and took < FETCH_GAP_MS / 1000 else None,
            lesson=SEE)
    committed = committed_offsets(lab.kafka.consumer_config(), group, topics.dead_letter,
                                  topics.partitions)
    if late and committed.get(late[0].partition, -1) > late[0].offset:
        raise CheckFailure(
            f"The replay committed DLT partition {late[0].partition} past the end it read at "
            f"the start: p{late[0].partition}@{late[0].offset}, the dead letter written while "
            "it ran, was never replayed, and the group's committed offset is now behind it, "
            "so no later run of this job sees it: it is lost. A record past the end is not "
            "this run's: leave it, uncommitted, for the next run.",
            expected=f"the committed offset of p{late[0].partition} at most {late[0].offset}",
            actual=f"committed {offsets_text(committed)}; report {report!r}",
            fix="stop reading a partition at its end offset; never commit an offset past it",
            lesson=SEE)
    counts = tuple(getattr(report, name, None) for name in ("replayed", "parked", "skipped"))
    if not isinstance(report, str) and counts != (len(dead), 0, 0):
        raise CheckFailure(
            f"The replay re-published the {len(dead)} records that were in the DLT when it "
            "started (none at the cap, none outside the filters), but its report counts "
            "otherwise. A record written after the start is not this run's: not replayed, "
            "not skipped, not counted.",
            expected=f"ReplayReport(replayed={len(dead)}, parked=0, skipped=0)",
            actual=f"{report!r}", lesson=SEE)


# A dead letter written while the replay runs, handed to the replay's consumer while the run
# still has work: without a hold, a client fetching one record at a time hands it over only
# after the last record the run needed, and a run that counted it as skipped, or committed it
# (a commit() of the stored positions), passed. Two records in each of p0 and p1, none in
# p2; the first send (p0's first: p1 is paused from assign() until then) writes a late one to
# p1 and one to p2, and holds the first send's partition (pause(): the client's own way to
# stop a partition, its position unchanged) until the late p1 record was handed out, or
# LATE_HOLD_S (a replay that stops reading a partition at its end never gets it: fine).
# consume() hands out one record a call, as OneRecordPerConsume does.
LATE_HOLD_S = 1.5


class HoldUntilLate:
    """While active, every confluent_kafka.Consumer made of group `group` hands out at most one
    record per consume() call, and `hold(partition, late)` pauses that DLT partition until the
    record `late` (a Crafted) was handed out, or LATE_HOLD_S passed. The learner's replay
    module must be imported inside the `with`."""

    def __init__(self, group: str, topic: str, later: int) -> None:
        self.group, self.topic = group, topic
        self._original: Any = None
        self._consumers: list[Any] = []
        # partition `later` stays paused from assign() to the first hold(), so that the first
        # send is another partition's record, the same in every run
        self.later: int | None = later
        self.held: tuple[int, Any, float] | None = None  # (partition, late, until real time)
        self.late_handed = False

    def hold(self, partition: int, late: Any) -> None:
        from confluent_kafka import TopicPartition

        self.held = (partition, late, time.monotonic() + LATE_HOLD_S)
        later, self.later = self.later, None
        for consumer in self._consumers:
            consumer._dojo_pause([TopicPartition(self.topic, partition)])
            if later is not None and later != partition:
                consumer._dojo_resume([TopicPartition(self.topic, later)])

    def _release(self) -> None:
        from confluent_kafka import TopicPartition

        if self.held is not None:
            partition, self.held = self.held[0], None
            for consumer in self._consumers:
                consumer._dojo_resume([TopicPartition(self.topic, partition)])

    def __enter__(self) -> HoldUntilLate:
        import confluent_kafka

        original = self._original = confluent_kafka.Consumer
        outer = self

        class Holding(original):  # type: ignore[misc, valid-type]
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(*args, **kwargs)
                config = args[0] if args and isinstance(args[0], dict) else kwargs
                if config.get("group.id") == outer.group:
                    outer._consumers.append(self)

            def assign(self, *args: Any, **kwargs: Any) -> Any:
                from confluent_kafka import TopicPartition

                result = super().assign(*args, **kwargs)
                if self in outer._consumers and outer.later is not None:
                    assigned = {tp.partition for tp in super().assignment()
                                if tp.topic == outer.topic}
                    if outer.later in assigned:
                        super().pause([TopicPartition(outer.topic, outer.later)])
                return result

            def _dojo_pause(self, partitions: Any) -> None:
                super().pause(partitions)

            def _dojo_resume(self, partitions: Any) -> None:
                super().resume(partitions)

            def _dojo_seen(self, msg: Any) -> None:
                held = outer.held
                if self not in outer._consumers or held is None:
                    return
                if msg is not None and msg.error() is None and msg.topic() == outer.topic and \
                        (msg.partition(), msg.offset()) == (held[1].partition, held[1].offset):
                    outer.late_handed = True
                    outer._release()
                elif time.monotonic() >= held[2]:
                    outer._release()

            def poll(self, *args: Any, **kwargs: Any) -> Any:
                msg = super().poll(*args, **kwargs)
                self._dojo_seen(msg)
                return msg

            def consume(self, num_messages: int = 1, *args: Any, **kwargs: Any) -> Any:
                timeout = args[0] if args else kwargs.get("timeout", -1)
                batch = super().consume(1, timeout)
                for msg in batch or [None]:
                    self._dojo_seen(msg)
                return batch

        confluent_kafka.Consumer = Holding  # type: ignore[misc]
        return self

    def __exit__(self, *exc: object) -> None:
        import confluent_kafka

        confluent_kafka.Consumer = self._original  # type: ignore[misc]


def test_a_record_written_during_the_run_is_the_next_runs(lab, clock):
    topics = lab.topics()
    dead = craft_dead_letters(lab, topics, [
        (healthy(f"acc-{n}", 320 + n, partition=n % 2), "InvalidEvent", None) for n in range(4)])
    by_value = {c.item.value: c for c in dead}
    group = lab.kafka.group_id("dlt-replayer")
    late: list[Crafted] = []

    with HoldUntilLate(group, topics.dead_letter, later=1) as gate:
        def before(number: int) -> None:
            if number == 0:  # the first send: a dead letter arrives in the other partition
                first = by_value.get(hook.sending or b"")
                held = first.partition if first is not None else 0
                late.extend(craft_dead_letters(lab, topics, [
                    (healthy("acc-late", 998, partition=1 - held), "InvalidEvent", None),
                    # and one to p2, empty at the start: done before the run began
                    (healthy("acc-late", 997, partition=2), "InvalidEvent", None)]))
                gate.hold(held, late[0])

        hook = HookedProducer(lab.dlt_producer(), clock, before)
        try:
            report: Any = replay(lab, topics, group, clock, producer=hook)
        except CheckFailure:
            raise
        except Exception as exc:
            report = f"raised {type(exc).__name__}: {str(exc)[:120]}"
    sent = {p.value for p in hook.to(topics.source)}
    if not late:
        return  # nothing sent: whether the replay sends at all, other checks say
    where = " and ".join(f"p{c.partition}@{c.offset}" for c in late)
    seen = ("one reached the replay's consumer before the run ended" if gate.late_handed else
            "the replay did not read them")
    again = [c for c in late if c.item.value in sent]
    if again:
        raise CheckFailure(
            f"A dead letter written while the replay ran ({where}, after the first send; p2 "
            "was empty at the start) was replayed by it: "
            + ", ".join(f"p{c.partition}@{c.offset}" for c in again) + ". Replay works "
            "through what was in the DLT when it started: read every partition's end offset "
            "before the first record, and stop there (a partition empty at the start is done "
            "before the run begins).",
            expected=f"the {len(dead)} records there at the start replayed, nothing of {where}",
            actual=f"re-published {len(sent)} record(s), among them "
                   + ", ".join(f"p{c.partition}@{c.offset}" for c in again)
                   + f"; report {report!r}", lesson=SEE)
    committed = committed_offsets(lab.kafka.consumer_config(), group, topics.dead_letter,
                                  topics.partitions)
    past = [c for c in late if committed.get(c.partition, -1) > c.offset]
    if past:
        raise CheckFailure(
            f"A dead letter written while the replay ran ({where}; {seen}) was not replayed, "
            f"yet the group's committed offset of p{past[0].partition} is past it: no later run "
            "of this job sees it, and it is lost. A record past the end read at the start is "
            "the next run's: leave it uncommitted. Commit the record you handled "
            "(commit(message=msg, asynchronous=False), or its offset + 1), not the consumer's "
            "stored positions, which include every record poll() handed out.",
            expected=f"the committed offset of p{past[0].partition} at most {past[0].offset}",
            actual=f"committed {offsets_text(committed)}; report {report!r}",
            fix="commit each handled record's own offset (message=msg), never the stored "
                "positions, and never past the end read at the start"
                if gate.late_handed else None,
            lesson=SEE)
    counts = tuple(getattr(report, name, None) for name in ("replayed", "parked", "skipped"))
    if not isinstance(report, str) and len(sent) == len(dead) and counts != (len(dead), 0, 0):
        raise CheckFailure(
            f"The replay re-published the {len(dead)} records that were in the DLT when it "
            f"started (none at the cap, none outside the filters), but its report counts "
            f"otherwise. {where}, written after the start ({seen}), "
            f"{'are' if len(late) > 1 else 'is'} not this run's: neither replayed nor skipped "
            "nor counted.",
            expected=f"ReplayReport(replayed={len(dead)}, parked=0, skipped=0)",
            actual=f"{report!r}",
            fix="leave a record past the end out of the report: it is not skipped, it is the "
                "next run's" if gate.late_handed and counts[2] else None,
            lesson=SEE)


# The last record of p0 reaches the replay's consumer only after a pause longer than the
# run, and the third only GATE_OPENS_S into it: the replay handles the first two, waits,
# handles the third late in the run, then nothing comes until its timeout_seconds is up.
# A quiet spell is not the end, however long: a replay that ends after some idle time ends
# before DEADLINE_S (any rule of up to about 3.5 s of quiet, between the second record and
# the third; a longer one never fires before the deadline of this run, so here it is the
# deadline). And the run's last wait for records begins GATE_OPENS_S in: a poll() (or
# consume()) of more than about 2.5 s then overruns the deadline by more than LATE_BY_S,
# wherever the replay's reads happen to fall. How the pauses are made: one record per fetch
# (ONE_AT_A_TIME), and the client postpones its next fetch by fetch.queue.backoff.ms once
# two records wait in its queue (queued.min.messages); the first acknowledgement is slow
# (SLOW_FIRST_ACK_S, real time), so while the replay waits for it the second and third
# records are fetched, and the fourth is held back for longer than the run. The check's
# consumer (OneRecordPerConsume) hands the replay's group the third only at GATE_OPENS_S.
# Costs DEADLINE_S of real time; the pause ends when the replay closes its consumer.
DEADLINE_S = 5.0
HELD_BACK = {**ONE_AT_A_TIME, "queued.min.messages": 2, "fetch.queue.backoff.ms": 20_000}
SLOW_FIRST_ACK_S = 0.5
GATE_AFTER = 2  # records handed out before the gate
GATE_OPENS_S = 4.5  # real seconds after the check calls replay()
# README: the run returns within a second of its deadline (no write is in flight then here:
# every acknowledgement but the first comes at once); SLACK_LATE_S for close() and a loaded
# machine. A poll of a second, then close(), is in time; one of several seconds is not.
LATE_BY_S = RETURN_WITHIN_S + SLACK_LATE_S
DEADLINE_RECORDS = 4
# a record the replay's consumer got later than this before the deadline need not be replayed
HANDLE_IN_S = 0.25


class OneRecordPerConsume:
    """While active, every confluent_kafka.Consumer made hands out at most one record per
    consume() call, whatever num_messages asks (a batch may always come back short: that
    is what a consume() that times out returns). A replay that reads in batches then takes
    its records from the client's queue one at a time, as a poll() loop does, and the
    queue fills behind the slow first acknowledgement as HELD_BACK needs. With `gate`
    (group id, n, real time), a consumer of that group hands out its first n records, then
    nothing until that time (a poll() or consume() meanwhile waits its timeout, or until
    then, and comes back empty if it ends first), as if the next had not arrived yet. The
    learner's replay module must be imported inside the `with` (each check imports it
    afresh)."""

    def __init__(self) -> None:
        self._original: Any = None
        self.gate: tuple[str, int, float] | None = None
        # when each record reached the gated group's consumer (real time), in order
        self.handed_at: list[float] = []
        # every poll() or consume() of the gated group's consumers: (real time, its timeout)
        self.waits: list[tuple[float, Any]] = []

    def __enter__(self) -> OneRecordPerConsume:
        import confluent_kafka

        original = self._original = confluent_kafka.Consumer
        outer = self
        empty = object()  # the call comes back empty: the gate was still shut when it ended

        class OneAtATime(original):  # type: ignore[misc, valid-type]
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(*args, **kwargs)
                config = args[0] if args and isinstance(args[0], dict) else kwargs
                self._dojo_group = config.get("group.id")
                self._dojo_handed = 0

            def _dojo_gate(self, timeout: Any) -> Any:
                """The timeout left for the client's call once the gate is open, or `empty`."""
                gate = outer.gate
                if gate is None or self._dojo_group != gate[0] or self._dojo_handed < gate[1]:
                    return timeout
                shut = gate[2] - time.monotonic()
                if shut <= 0:
                    return timeout
                forever = timeout is None or timeout < 0
                if not forever and timeout < shut:
                    time.sleep(max(0.0, timeout))
                    return empty
                time.sleep(shut)
                return timeout if forever else max(0.0, timeout - shut)

            def poll(self, *args: Any, **kwargs: Any) -> Any:
                timeout = args[0] if args else kwargs.get("timeout")
                self._dojo_wait(timeout)
                left = self._dojo_gate(timeout)
                if left is empty:
                    return None
                msg = super().poll() if left is None else super().poll(left)
                if msg is not None and msg.error() is None:
                    self._dojo_count(1)
                return msg

            def consume(self, num_messages: int = 1, *args: Any, **kwargs: Any) -> Any:
                timeout = args[0] if args else kwargs.get("timeout", -1)
                self._dojo_wait(timeout)
                left = self._dojo_gate(timeout)
                if left is empty:
                    return []
                batch = super().consume(1, left if left is not None else -1)
                self._dojo_count(sum(1 for m in batch if m.error() is None))
                return batch

            def _dojo_wait(self, timeout: Any) -> None:
                if outer.gate is not None and self._dojo_group == outer.gate[0]:
                    outer.waits.append((time.monotonic(), timeout))

            def _dojo_count(self, records: int) -> None:
                self._dojo_handed += records
                if outer.gate is not None and self._dojo_group == outer.gate[0]:
                    outer.handed_at.extend([time.monotonic()] * records)

        confluent_kafka.Consumer = OneAtATime  # type: ignore[misc]
        return self

    def __exit__(self, *exc: object) -> None:
        import confluent_kafka

        confluent_kafka.Consumer = self._original  # type: ignore[misc]


def _deadline_run(lab, clock, consumers: OneRecordPerConsume) -> tuple[Any, ...]:
    topics = lab.topics()
    dead = craft_dead_letters(lab, topics, [
        (_big(healthy(f"acc-{n}", 400 + n, partition=0)), "InvalidEvent", None)
        for n in range(DEADLINE_RECORDS)])
    group = lab.kafka.group_id("dlt-replayer")
    sends = FirstAckLate(lab.dlt_producer(), clock, SLOW_FIRST_ACK_S, real=True)
    began = time.monotonic()
    consumers.gate = (group, GATE_AFTER, began + GATE_OPENS_S)
    consumers.handed_at, consumers.waits = [], []
    try:
        report: Any = replay(lab, topics, group, clock, producer=sends, config=HELD_BACK,
                             timeout_seconds=DEADLINE_S)
        raised = None
    except CheckFailure:
        raise
    except Exception as exc:
        report, raised = None, exc
    ended = time.monotonic()
    sent = [c for c in dead if c.item.value in {p.value for p in sends.to(topics.source)}]
    committed = committed_offsets(lab.kafka.consumer_config(), group, topics.dead_letter,
                                  topics.partitions)
    return dead, sent, sends.real_at, report, raised, ended - began, ended, committed


SCENE_TRIES = 3


def test_replay_returns_at_its_deadline(lab, clock):
    # a batch reader (consume()) takes its records one at a time; the third comes late
    with OneRecordPerConsume() as consumers:
        for attempt in range(SCENE_TRIES):
            dead, sent, sent_at, report, raised, took, ended, committed = _deadline_run(
                lab, clock, consumers)
            # Should the client fetch the last record early after all (its queue is a race
            # between its fetcher and the replay's reads, and a replay that drains the
            # queue from another thread, or reads it some other way, keeps it short), the
            # scene did not happen: set it again, on new topics.
            early = dead[-1] in sent and took < DEADLINE_S + LATE_BY_S
            if not early or attempt == SCENE_TRIES - 1:
                break
    what = (f"raised {type(raised).__name__}: {str(raised)[:100]}" if raised is not None
            else f"returned {report!r}")
    facts = (f"replay {what} after {took:.1f} s of real time; re-published "
             f"{', '.join(f'p0@{c.offset}' for c in sent) or 'nothing'}; the group's committed "
             f"DLT offsets {offsets_text(committed)}")
    *before, last = dead
    done = ', '.join(f'p0@{c.offset}' for c in before)
    # A record the replay's consumer got too close to the deadline to be handled in time
    # (a loaded machine, a slow group join) may be left for the next run: not required.
    began = ended - took
    required = [c for n, c in enumerate(before) if n < len(consumers.handed_at)
                and consumers.handed_at[n] <= began + DEADLINE_S - HANDLE_IN_S]
    if early:
        # The scene could not be set: every record reached the replay in time. What the run
        # shows is still judged (all four replayed and committed, the report counting them,
        # no exception); what it cannot show is how the replay behaves when a record of its
        # end is late: whether it waits for it until the deadline (rather than ending after
        # a quiet spell) and returns the report then (rather than raising).
        wrong = []
        if raised is not None:
            wrong.append("it raised, though every write was acknowledged")
        if len(sent) < len(dead):
            wrong.append(f"{len(sent)} of the {len(dead)} records re-published")
        if committed.get(0, -1) != last.offset + 1:
            wrong.append(f"the group's committed offset of p0 is not the end, "
                         f"{last.offset + 1}")
        if raised is None and getattr(report, "replayed", None) != len(sent):
            wrong.append(f"the report does not count the {len(sent)} record(s) it "
                         "re-published")
        if wrong:
            raise CheckFailure(
                f"Every one of the {len(dead)} records reached the replay in time here (the "
                "check's consumer settings did not hold the last one back), and every write "
                "was acknowledged: the run replays them all, commits each, and returns a "
                "report that counts them.",
                expected=f"{len(dead)} replayed, p0 committed at {last.offset + 1}; "
                         f"ReplayReport(replayed={len(dead)}, …)",
                actual="; ".join(wrong) + f" ({facts})", lesson=SEE)
        return
    if raised is not None:
        raise CheckFailure(
            f"The replay raised when its timeout_seconds ({DEADLINE_S:.0f} s) was up. Running "
            "out of time is not a failure: return the report of what was done so far, and "
            "leave what is left uncommitted for the next run. Raise only when a write failed.",
            expected=f"a ReplayReport returned after about {DEADLINE_S:.0f} s, {done} "
                     f"replayed, p0@{last.offset} left uncommitted",
            actual=facts,
            fix="return the ReplayReport when the deadline passes instead of raising"
                if took >= DEADLINE_S - 0.05 else None,
            lesson=SEE)
    if last not in sent and took < DEADLINE_S - 0.05:
        waited = ended - sent_at[-1] if sent_at else took
        raise CheckFailure(
            f"Replay returned {took:.1f} s into a run whose timeout_seconds was "
            f"{DEADLINE_S:.0f}, with "
            f"{', '.join(f'p0@{c.offset}' for c in dead if c not in sent)}, in the DLT when it "
            "started, not replayed. In this DLT the third record reached the replay's "
            f"consumer only {GATE_OPENS_S:.1f} s into the run and the last only after a pause "
            "longer than the run (the check's consumer settings): no stretch of empty "
            "polls, however long, says a partition is done. Only its position reaching the "
            "end offset read at the start does; until then keep polling, and when "
            "timeout_seconds is up return the report.",
            expected=f"replay returning at its deadline, {DEADLINE_S:.0f} s in (a little more "
                     f"is fine), with {done} replayed",
            actual=facts + (f"; it returned {waited:.1f} s after its last send"
                            if sent_at else ""),
            fix="drop the rule that ends the run after a spell without records: poll until "
                "every partition reaches its end offset or timeout_seconds is up"
                if sent_at and waited >= 0.5 else None,
            lesson=SEE)
    if took > DEADLINE_S + LATE_BY_S and last not in sent:
        raise CheckFailure(
            f"Replay returned {took - DEADLINE_S:.1f} s after its deadline (timeout_seconds "
            f"{DEADLINE_S:.0f}, {took:.1f} s of real time), while it waited for p0@{last.offset}, "
            "which did not come. timeout_seconds bounds the run: it returns within a second of "
            "it (plus the ack_timeout_seconds of a write in flight then; none was here). A wait "
            "for records is what overruns it: poll() (or consume()) with a timeout of at most "
            "a second, or the time left before the deadline if that is less, and look at the "
            "deadline after every poll.",
            expected=f"the report back within {DEADLINE_S + RETURN_WITHIN_S:.0f} s, {done} "
                     "replayed",
            actual=facts,
            fix="poll with a short timeout (poll(0.2), or min(1.0, time left)), never one of "
                "several seconds" if took > DEADLINE_S + 2.0 else None,
            lesson=SEE)
    # A wait for records of more than a second that, had nothing come, would have ended more
    # than a second past the deadline: the run's return then depends on luck (here the third
    # record is handed out GATE_OPENS_S in, and the next wait begins just after it).
    overrun = [(at - began, timeout) for at, timeout in consumers.waits
               if isinstance(timeout, int | float) and timeout > RETURN_WITHIN_S + 0.01
               and at + timeout > began + DEADLINE_S + RETURN_WITHIN_S]
    if overrun:
        at, timeout = overrun[-1]
        raise CheckFailure(
            f"The replay waited for records with a timeout of {timeout:g} s, {at:.2f} s into a "
            f"run whose timeout_seconds was {DEADLINE_S:g}: had nothing come, that wait alone "
            f"would have ended {at + timeout - DEADLINE_S:.2f} s after the deadline. A run "
            "returns within a second of its deadline, so a wait for records lasts at most a "
            "second, or the time left if that is less; then look at the deadline again.",
            expected="every poll() or consume() timeout at most 1 s (or the time left)",
            actual=f"{len(overrun)} wait(s) of more than a second ending past the deadline + 1 s"
                   f" ({facts})",
            fix="poll(min(1.0, time left)) (or consume(n, that timeout))", lesson=SEE)
    wrong = []
    if took > DEADLINE_S + LATE_BY_S:
        wrong.append(f"it returned {took - DEADLINE_S:.1f} s after its deadline")
    if any(c not in sent for c in required):
        wrong.append(f"{', '.join(f'p0@{c.offset}' for c in required)}, there from the start "
                     "and handed to its consumer in time, not all re-published")
    if committed.get(0, -1) > last.offset:
        wrong.append(f"the group committed p0 past p0@{last.offset}, which it never replayed")
    uncommitted = [c for c in before if c in sent and committed.get(0, -1) <= c.offset]
    if uncommitted:
        wrong.append(f"{', '.join(f'p0@{c.offset}' for c in uncommitted)} re-published but "
                     "its offset not committed")
    if report is None or getattr(report, "replayed", None) != len(sent):
        wrong.append(f"the report does not count the {len(sent)} record(s) it re-published")
    if wrong:
        raise CheckFailure(
            "When timeout_seconds is up, the replay returns the report of what it did so "
            "far: the records it re-published committed, what is left uncommitted for the "
            "next run, and within a second of the deadline (real time: time.monotonic()).",
            expected=f"returned after about {DEADLINE_S:.0f} s, {done} replayed "
                     f"and committed, p0@{last.offset} not committed; "
                     f"ReplayReport(replayed={len(before)}, …)",
            actual="; ".join(wrong) + f" ({facts})", lesson=SEE)


# Every acknowledgement reaches the replay SLOW_ACK_S of real time late (a flush() or poll()
# hands it over only then) and the DLT holds more records than STREAM_DEADLINE_S leaves time
# for: the replay's consumer has a record at every poll, so only a deadline looked at before
# each send ends the run (one looked at only after an empty poll, or once per consume() batch,
# never comes while records keep coming). A run's own deadline starts before its first send, so
# no send begins later than the first send + STREAM_DEADLINE_S + SEND_AFTER_S, wherever the
# replay starts its clock. Costs about STREAM_DEADLINE_S + SLOW_ACK_S of real time.
SLOW_ACK_S = 0.45
STREAM_DEADLINE_S = 1.0
STREAM_RECORDS = 8
SEND_AFTER_S = 0.2


class EveryAckLate(ProducerTap):
    """A producer tap whose every delivery report reaches the caller `seconds` of real time
    after the broker gave it (a slow broker: flush() or poll() return it only then, and a
    flush() whose timeout ends first returns without it); `real_at` holds the real time of
    every produce()."""

    def __init__(self, producer: Any, clock: Any, seconds: float) -> None:
        super().__init__(producer, clock, hold_acks=seconds)
        self.real_at: list[float] = []

    def produce(self, *args: Any, **kwargs: Any) -> Any:
        self.real_at.append(time.monotonic())
        return super().produce(*args, **kwargs)

    def late_sends(self, deadline_s: float) -> list[float]:
        """The sends that began more than `deadline_s` + SEND_AFTER_S after the first (a run's
        deadline starts before its first send, wherever the replay starts its clock); none when
        nothing was sent (whether the replay sends at all, other checks say)."""
        if not self.real_at:
            return []
        return [t for t in self.real_at if t > self.real_at[0] + deadline_s + SEND_AFTER_S]


def test_replay_stops_sending_at_its_deadline(lab, clock):
    topics = lab.topics()
    # in one partition, read in order: two re-publishes, then records at the cap, whose
    # parks are sends too (a deadline looked at only before a re-publish never comes)
    dead = craft_dead_letters(lab, topics, [
        (healthy(f"acc-{n}", 500 + n, partition=0), "InvalidEvent", None if n < 2 else 3)
        for n in range(STREAM_RECORDS)])
    sends = EveryAckLate(lab.dlt_producer(), clock, SLOW_ACK_S)
    group = lab.kafka.group_id("dlt-replayer")
    began = time.monotonic()
    raised: Exception | None = None
    try:
        report = replay(lab, topics, group, clock, producer=sends,
                        timeout_seconds=STREAM_DEADLINE_S)
        outcome = f"returned {report!r}"
    except CheckFailure:
        raise
    except Exception as exc:
        outcome, raised = f"raised {type(exc).__name__}: {str(exc)[:100]}", exc
    took = time.monotonic() - began
    if raised is not None:
        # every write was acknowledged, SLOW_ACK_S after it, well within ack_timeout_seconds
        raise CheckFailure(
            f"The replay raised, {took:.1f} s into a run whose timeout_seconds was "
            f"{STREAM_DEADLINE_S:g}, though the broker acknowledged every write "
            f"{SLOW_ACK_S:g} s after it, well within ack_timeout_seconds. A write in flight when "
            "the deadline passes gets its whole ack_timeout_seconds: its acknowledgement is "
            "waited for, its record committed, and the report returned. Running out of time is "
            "not a failure: raise only when a write failed.",
            expected="a ReplayReport of the records sent before the deadline, each acknowledged "
                     "and committed",
            actual=f"replay {outcome} after {took:.1f} s; sends at "
                   + ", ".join(f"+{t - began:.2f} s" for t in sends.real_at),
            fix="wait for a write's report up to ack_timeout_seconds, whatever time is left "
                "before the deadline" if sends.real_at else None,
            lesson=SEE)
    late = sends.late_sends(STREAM_DEADLINE_S)
    if late:
        first = sends.real_at[0]
        raise CheckFailure(
            f"Every acknowledgement took {SLOW_ACK_S:g} s of real time here and the DLT held "
            f"{len(dead)} records, more than a timeout_seconds of {STREAM_DEADLINE_S:g} leaves "
            "time for, so the replay's consumer had a record for it at every poll. The replay "
            f"went on sending past its deadline: {len(late)} send(s) began more than "
            f"{STREAM_DEADLINE_S:g} s after its first one, the last "
            f"{late[-1] - first:.2f} s after it. When timeout_seconds is up the run returns "
            "the report of what it did so far: look at the deadline before every send (a park "
            "as much as a re-publish), after a poll that brought a record as after an empty "
            "one, and between the records of a consume() batch. Records that keep coming do "
            "not extend a run.",
            expected=f"no send later than {STREAM_DEADLINE_S + SEND_AFTER_S:g} s after the first "
                     "one",
            actual=f"replay {outcome} after {took:.1f} s; sends at "
                   + ", ".join(f"+{t - first:.2f} s" for t in sends.real_at),
            lesson=SEE)
    _no_retry_past_the_deadline(lab, clock)
    _no_send_after_a_late_first_record(lab, clock)


# A re-publish whose report never comes (FailOnce, silent, every time): its ack_timeout_seconds
# outlast the run's timeout_seconds, so when the write has failed the deadline is up, and a
# retry of it in place, a send like any other, may not begin. Costs RETRY_ACK_S of real time.
RETRY_DEADLINE_S = 0.5
RETRY_ACK_S = 1.0


def _no_retry_past_the_deadline(lab: Any, clock: InstantClock) -> None:
    topics = lab.topics()
    craft_dead_letters(lab, topics, [(healthy("acc-r", 613, partition=0), "InvalidEvent", None)])
    sink = lab.kafka.topic(1, hint="unacknowledged")
    router = FailOnce(lab.dlt_producer(), sink, fail_topic=topics.source, silent=True,
                      every_time=True, hang_seconds=_hang_seconds(RETRY_ACK_S))
    sends = EveryAckLate(router, clock, 0.0)
    began = time.monotonic()
    try:
        report = replay(lab, topics, lab.kafka.group_id("dlt-replayer"), clock, producer=sends,
                        timeout_seconds=RETRY_DEADLINE_S, ack_timeout_seconds=RETRY_ACK_S)
        outcome = f"returned {report!r}"
    except CheckFailure:
        raise
    except Exception as exc:  # the write failed: raising is fine
        outcome = f"raised {type(exc).__name__}"
    late = sends.late_sends(RETRY_DEADLINE_S)
    if late:
        first = sends.real_at[0]
        raise CheckFailure(
            f"The first re-publish got no delivery report: it had failed once its "
            f"ack_timeout_seconds ({RETRY_ACK_S:g} s) were up, and by then so was the run's "
            f"timeout_seconds ({RETRY_DEADLINE_S:g} s). The replay wrote it again after its "
            f"deadline: {len(late)} send(s) began more than {RETRY_DEADLINE_S:g} s after the "
            "first. A retry in place is a send like any other: look at the deadline before it, "
            "and when the time is up end the run with the record uncommitted (retries that "
            "ignore the deadline make a run late by an ack timeout each).",
            expected=f"no send later than {RETRY_DEADLINE_S + SEND_AFTER_S:g} s after the first; "
                     "the run ending once the write has failed",
            actual=f"replay {outcome} after {time.monotonic() - began:.1f} s; sends at "
                   + ", ".join(f"+{t - first:.2f} s" for t in sends.real_at),
            fix="look at the deadline before a retry, as before every send",
            lesson=SEE)


# The one record of the DLT reaches the replay's consumer only FIRST_HELD_S into the run
# (OneRecordPerConsume's gate, shut from the start), later than timeout_seconds plus the second
# a run may return after its deadline: the deadline is up before anything arrives, so nothing
# may be sent. A deadline counted from the first record (or the first poll that brought one)
# sends it. Costs about LATE_FIRST_DEADLINE_S + a poll of real time.
LATE_FIRST_DEADLINE_S = 1.0
FIRST_HELD_S = 2.4


def _no_send_after_a_late_first_record(lab: Any, clock: InstantClock) -> None:
    topics = lab.topics()
    craft_dead_letters(lab, topics, [(healthy("acc-f", 619, partition=0), "InvalidEvent", None)])
    group = lab.kafka.group_id("dlt-replayer")
    sends = EveryAckLate(lab.dlt_producer(), clock, 0.0)
    lab.learner.purge()  # imported by the check's earlier scenes: again, with the gate's Consumer
    with OneRecordPerConsume() as consumers:
        began = time.monotonic()
        consumers.gate = (group, 0, began + FIRST_HELD_S)
        try:
            report = replay(lab, topics, group, clock, producer=sends,
                            timeout_seconds=LATE_FIRST_DEADLINE_S)
            outcome = f"returned {report!r}"
        except CheckFailure:
            raise
        except Exception as exc:  # whether it may raise here, other scenes say
            outcome = f"raised {type(exc).__name__}"
    lab.learner.purge()
    allowed = LATE_FIRST_DEADLINE_S + RETURN_WITHIN_S
    late = [t - began for t in sends.real_at if t > began + allowed]
    if late:
        handed = ", ".join(f"+{t - began:.2f} s" for t in consumers.handed_at) or "never"
        raise CheckFailure(
            f"The DLT's one record reached the replay's consumer only {FIRST_HELD_S:g} s into a "
            f"run whose timeout_seconds was {LATE_FIRST_DEADLINE_S:g}: its deadline had passed "
            "before anything arrived, yet the replay re-published it "
            f"{late[0]:.2f} s in. A run's deadline counts from the call, not from its first "
            "record: start the clock (time.monotonic()) when replay() begins, and a record "
            "that comes after the deadline waits for the next run.",
            expected=f"no send later than {allowed:g} s into the run (the deadline plus the "
                     "second a run may take to return)",
            actual=f"replay {outcome} after {time.monotonic() - began:.1f} s; the record "
                   f"handed to it at {handed}; sends at "
                   + ", ".join(f"+{t:.2f} s" for t in late),
            fix="take the deadline from time.monotonic() at the start of replay(), before "
                "the first poll",
            lesson=SEE)
