"""Stage replay: DLT records go back to their original topic under the replayer's own
consumer group (a second run sends nothing), stripped of the old failure headers with their
business headers and an incremented x-replay-count; past the cap they go to the parking
lot; replay is rate-limited, filterable by exception type and time, and commits only after
the acknowledgement."""

from __future__ import annotations

import re
import time
from dataclasses import replace
from typing import Any

import pytest
from _support import READ, Crafted, FailOnce, HookedProducer, craft_dead_letters
from _tools import Item, healthy

from dojo.checks import CheckFailure, call, table
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
    placed_key = b"acc-p"
    placed = (partition_for(placed_key, topics.partitions) + 1) % topics.partitions
    specs: list[tuple[Item, str, int | None]] = [
        (healthy("acc-p", 777, partition=placed), "DownstreamTimeout", None)]
    for n in range(KEYLESS_PER_PARTITION * topics.partitions):
        item = healthy("acc-x", 880 + n)
        specs.append((Item(item.label, None, item.value, item.headers, item.event_id,
                           item.account, item.cents, n % topics.partitions),
                      "DownstreamTimeout", 2 if n % 2 else None))
    dead += craft_dead_letters(lab, topics, specs)
    group = lab.kafka.group_id("dlt-replayer")
    report = replay(lab, topics, group, clock)
    back = lab.read(topics.source, topics.partitions, fence=True)
    by_value = {r.value: r for r in back}
    problems, shown = [], None
    misplaced: list[str] = []  # records without a key, not back in their original partition
    for c in dead:
        r = by_value.get(c.item.value)
        name = c.item.key.decode() if c.item.key is not None else "(no key)"
        if r is None:
            problems.append(f"{name}: not re-published to {topics.source}")
            continue
        wrong = []
        if r.key != c.item.key:
            wrong.append(f"key {show_bytes(r.key, 20)} (was {show_bytes(c.item.key, 20)})")
        want = partition_for(c.item.key, topics.partitions) if c.item.key is not None \
            else c.partition
        if c.item.key is None and r.partition != want:
            misplaced.append(f"p{want}->p{r.partition}")
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
    if misplaced:
        problems.insert(0, f"{len(misplaced)} of the {keyless} records without a key (from "
                           f"every partition) not back in their kafka_dlt-original-partition")
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
            fix="send a record without a key with partition= its kafka_dlt-original-partition "
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
    second = replay(lab, topics, group, clock)
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
        ("acc-6", "DownstreamUnavailable", start_ms + 2_000, "at failed_before exactly"),
        ("acc-7", "DownstreamUnavailable", start_ms + 3_000, "after the window"),
        # two key-less records of one partition, the first outside the window: no key has no
        # order to keep, so the skipped one holds nothing back
        (None, "DownstreamUnavailable", start_ms - 600_000, "no key, 10 min before the window"),
        (None, "DownstreamUnavailable", start_ms + 1_250, "no key, inside the window")]
    wanted_types = {"DownstreamUnavailable", "OperationalError"}
    dead = craft_dead_letters(lab, topics, [(_item(k, 101 + n), e, None)
                                            for n, (k, e, _, _) in enumerate(specs)],
                              timestamps=[t for _, _, t, _ in specs])
    # An empty collection of types wants none of them (None is the one that means all): a
    # job whose type list came out empty must replay nothing.
    report = replay(lab, topics, lab.kafka.group_id("dlt-replayer-none"), clock,
                    exception_types=[])
    sent = lab.read(topics.source, topics.partitions, fence=True)
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
    report = replay(lab, topics, lab.kafka.group_id("dlt-replayer"), clock,
                    exception_types=wanted_types, failed_after=since, failed_before=until)
    back = {r.value for r in lab.read(topics.source, topics.partitions, fence=True)}
    rows, wrong = [], []
    for c, (_, _, _, when) in zip(dead, specs, strict=True):
        name = c.exception.rsplit(".", 1)[-1]
        want = name in wanted_types and since <= c.timestamp_ms / 1000 < until
        got = c.item.value in back
        rows.append(((c.item.key or b"(none)").decode(), c.exception, when,
                     "yes" if want else "no", "yes" if got else "no"))
        if want != got:
            wrong.append(when if "." not in c.exception else f"{c.exception} {when}")
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


class FirstAckLate(ProducerTap):
    """A producer tap whose first acknowledgement takes `seconds` on the clock (a broker
    that stalls once, then answers at once)."""

    def __init__(self, producer: Any, clock: Any, seconds: float) -> None:
        super().__init__(producer, clock)
        self._late, self._stalled = seconds, False

    def produce(self, *args: Any, **kwargs: Any) -> Any:
        callback = kwargs.pop("on_delivery", None) or kwargs.pop("callback", None)

        def report(err: Any, msg: Any) -> None:
            if not self._stalled:
                self._stalled = True
                self._clock.advance(self._late)
            if callback is not None:
                callback(err, msg)

        return super().produce(*args, on_delivery=report, **kwargs)


FIRST_ACK_SECONDS = 2.0


def test_replay_is_rate_limited(lab, clock):
    topics = lab.topics()
    dead = mixed(lab, topics, replays=(None,) * 6)
    rate = 7.3
    # The first acknowledgement takes 2 s on the clock: a schedule kept from the start would
    # then send the next records in a burst to catch up.
    sends = FirstAckLate(lab.dlt_producer(), clock, FIRST_ACK_SECONDS)
    began = clock.monotonic()
    replay(lab, topics, lab.kafka.group_id("dlt-replayer"), clock, producer=sends,
           rate_per_second=rate)
    took = clock.monotonic() - began
    times = [p.at for p in sends.to(topics.source)]
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    interval = 1 / rate
    # A send is timed where produce() is called, a moment after the replay read the clock to
    # pace it; on a loaded machine that moment can be some milliseconds, which shortens the
    # next gap by as much (the reference's own sends showed 6 ms). SLACK absorbs that; a
    # burst (gaps near zero) or a faster rate (the total below) is still far outside it.
    close = [(n, g) for n, g in enumerate(gaps, start=2) if g < interval - SLACK]
    floor = (len(dead) - 1) * interval - 0.01
    evidence = table([(n, f"t+{t - times[0]:.3f}s", f"{g:.3f} s" if g is not None else "",
                       "TOO SOON" if g is not None and g < interval - SLACK else "")
                      for n, (t, g) in enumerate(zip(times, [None, *gaps], strict=True),
                                                 start=1)],
                     ("send", "at (clock)", "after the previous", ""))
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
               if close and close[0][0] > 2 else ""),
            expected=f"{len(dead)} records at {rate} per second: sends at least "
                     f"{interval:.3f} s apart",
            actual=f"{len(close)} of {len(gaps)} gaps shorter" if close else
                   f"{len(times)} sends in {took:.2f} s", evidence=evidence, lesson=SEE)


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
        raise CheckFailure(
            f"Replay returned after {sent} of {len(dead)} records, {real:.1f} s into a run "
            "whose timeout_seconds is 4.7: the rate limit's sleeps (1.3 records per second) "
            f"had moved the clock {on_clock:.1f} s on, and the deadline was read on it. "
            "timeout_seconds bounds a run in real time; the clock you are handed is for the "
            "pacing, and the checks' clock skips every sleep.",
            expected=f"all {len(dead)} re-published", actual=f"{sent}; report {report!r}",
            fix="measure the deadline with time.monotonic(), not clock.monotonic()",
            lesson=SEE)


# Two jobs over one DLT (all in partition 0, so read in order), each through a producer that
# fails one write and acknowledges the next: (what the failed write is, max_replays, which
# write fails). The first job's first write, a re-publish, fails; the second job (cap 1: the
# second record, replayed once, is at it) re-publishes the first record and then fails to
# park the second.
FAIL_ONCE_JOBS = (("re-publish to the source", 3, 0), ("park in the parking lot", 1, 1))


def _write_of(sends: ProducerTap, value: bytes) -> str:
    writes = [p for p in sends.produced if p.value == value]
    if not writes:
        return "not sent"
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
        for n, kind in enumerate(kinds)])
    sink = lab.kafka.topic(1, hint="unacknowledged")
    for bound, max_replays, fail_at in FAIL_ONCE_JOBS:
        group = lab.kafka.group_id("dlt-replayer")
        router = FailOnce(lab.dlt_producer(), sink, fail_at)
        sends = ProducerTap(router, clock)
        try:
            report = replay(lab, topics, group, clock, producer=sends,
                            max_replays=max_replays, ack_timeout_seconds=2.0,
                            timeout_seconds=10.0)
            outcome = f"replay returned {report!r}"
        except CheckFailure:
            raise  # a stub: not written yet
        except Exception as exc:  # a failed write may raise: that is fine
            outcome = f"replay raised {type(exc).__name__}"
        committed = committed_offsets(lab.kafka.consumer_config(), group,
                                      topics.dead_letter, topics.partitions)
        upto = committed.get(0, -1)
        failed = dead[fail_at]
        writes = {c.offset: _write_of(sends, c.item.value) for c in dead}
        unacked = [c for c in dead if c.offset < upto and writes[c.offset] != "acknowledged"]
        if not unacked:
            continue
        park = bound.startswith("park")
        # the next send came after the failure was reported (went on), or before it
        # was (did not wait for the delivery report)
        first_after = router.after_failure[:1]
        went_on, unwaited = first_after == [True], first_after == [False]
        rows = [(f"p0@{c.offset}", "parking lot" if (c.replays or 0) >= max_replays
                 else "source", writes[c.offset],
                 "yes" if c.offset < upto else "no") for c in dead]
        raise CheckFailure(
            f"A write of the replay failed once (a {bound} the broker never "
            "acknowledged, while it acknowledged every other write), yet the job's committed DLT "
            "offset covers the record: no later run of this job replays it. Commit a DLT "
            "offset only after the write it caused was acknowledged, and after a failed "
            "write stop the run (raise, or return) with nothing after it committed: a "
            "committed offset covers every record below it, so committing the next "
            "record's covers the failed one too."
            + (" The failed write was a park: the parking lot never had the record. A "
               "park is a write like a re-publish: wait for its acknowledgement too."
               if park else ""),
            expected=f"the group's committed offset of p0 at most {failed.offset} (the "
                     "record whose write failed), or none",
            actual=f"{outcome}; committed {offsets_text(committed)}: covers "
                   + ", ".join(f"p0@{c.offset} ({writes[c.offset]})" for c in unacked),
            evidence=table(rows, ("DLT record", "bound for", "its write",
                                  "below the committed offset")),
            fix="stop at the failed write (raise, or return the report) instead of going "
                "on to the next record: its commit covers the failed one"
                if went_on and failed in unacked else
                "wait for each write's delivery report (flush(), or poll() until its "
                "callback ran) and commit only when it reported no error"
                if unwaited and failed in unacked else None,
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


# One record per fetch into the replay's consumer (fetch.max.bytes: at least one record, and
# no more than 1 KiB holds), and a pause of FETCH_GAP_MS before the next fetch once one is
# queued (fetch.queue.backoff.ms): the two records waiting at the start arrive with over a
# second of nothing in between (longer than a poll(1.0)), and the partition's end is not in
# sight before what comes before it was worked through.
FETCH_GAP_MS = 1100
ONE_AT_A_TIME = {"queued.min.messages": 1, "queued.max.messages.kbytes": 1,
                 "fetch.max.bytes": 1024, "message.max.bytes": 1000,
                 "max.partition.fetch.bytes": 1024, "fetch.queue.backoff.ms": FETCH_GAP_MS}


def test_replay_stops_at_the_end_it_found(lab, clock):
    topics = lab.topics()
    # each record over 1 KiB (a business header of the check's): one record per fetch
    dead = craft_dead_letters(lab, topics, [
        (replace(item, headers=(*item.headers, ("x-note", b"." * 1100))), "InvalidEvent", None)
        for item in (healthy(f"acc-{n}", 300 + n, partition=0) for n in range(2))])
    late: list = []

    def before(number):
        if number == 0:  # the replay has begun: the consumer writes one more dead letter
            late.extend(craft_dead_letters(lab, topics, [
                (healthy("acc-late", 999, partition=0), "InvalidEvent", None)]))

    hook = HookedProducer(lab.dlt_producer(), clock, before)
    began = time.monotonic()
    try:
        report = replay(lab, topics, lab.kafka.group_id("dlt-replayer"), clock, producer=hook,
                        config=ONE_AT_A_TIME)
    except CheckFailure:
        raise
    except Exception as exc:
        report = f"raised {type(exc).__name__}: {str(exc)[:120]}"
    took = time.monotonic() - began
    sent = {p.value for p in hook.to(topics.source)}
    if late and late[0].item.value in sent:
        raise CheckFailure(
            "A dead letter written while the replay ran was replayed by it. Replay works "
            "through what was in the DLT when it started: it reads the end offsets first and "
            "stops there. Reading until the end of the partition instead chases a live "
            "consumer that keeps dead-lettering (during an outage, for ever), and replays a "
            "failure seconds old before anyone has looked at it.",
            expected=f"the {len(dead)} records that were there at the start replayed, not "
                     f"p{late[0].partition}@{late[0].offset}",
            actual=f"p{late[0].partition}@{late[0].offset}, written after the first send, was "
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
            expected=f"the {len(dead)} records of p0 (offsets {dead[0].offset} to "
                     f"{dead[-1].offset}) replayed",
            actual=f"not replayed: {', '.join(f'p0@{c.offset}' for c in left)}; "
                   + (f"replay returned {report!r}" if returned else f"replay {report}"),
            # returned on its own sooner than the next fetch could come: it took the lull
            # for the end
            fix="read the end offsets at the start and poll until every partition's position "
                "reaches its end (or the deadline), instead of stopping at the first empty poll"
                if returned and took < FETCH_GAP_MS / 1000 else None,
            lesson=SEE)
