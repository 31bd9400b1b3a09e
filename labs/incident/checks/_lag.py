"""Stage lag: the shop's notifier group, its committed offsets and a poison record.

The notifier reads the shop's order events from a topic of 3 partitions as a consumer group
and commits after every event it handled. Here it is driven step by step (so every look the
learner takes sees a settled state, whatever the machine's load): it really reads each record
with the group's id and commits the offset after it. In a run with a poison record it meets
one event it cannot decode on one partition: it never commits past it, while new events keep
arriving there (in even runs). Another partition is slow but moving (more waits there than on
the stuck one, and its committed offset advances between the two looks); the third is caught
up: in that run new events arrive there between the looks and the group handles them all (its
committed offset advances with nothing waiting: not slow), in the others it is idle (its
committed offset does not move, with nothing to read: not stuck). Which partition plays which
part, where the poison record lies and its key depend on the run: replay it with
DOJO_INCIDENT_RUN. When every partition is stuck, the record the answer is stuck on has an
empty key (b"", a key all the same, not None).
"""

from __future__ import annotations

import json
import random
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from _support import Sources

from dojo.checks import table

LAG = "where-to-look-first#step-5-the-services-own-health"
PARTITIONS = 3
POISON_VALUE = b'{"order_id": 4711, "qty": "two", "sku": "sku-2203"'   # cut short: no JSON


@dataclass
class LagSources(Sources):
    """The sources of stage lag: the broker, the topic and the group (README, stage 7)."""
    kafka: dict[str, Any] = field(default_factory=dict)
    topic: str = ""
    group: str = ""


@dataclass(frozen=True)
class Roles:
    """Which partition plays which part in this run."""
    stuck: int
    moving: int
    caught_up: int


def roles_of(seed: int) -> Roles:
    n = seed % PARTITIONS
    return Roles(n, (n + 1) % PARTITIONS, (n + 2) % PARTITIONS)


@dataclass
class Look:
    """The group's committed offset and the end offset of every partition at one look."""
    committed: dict[int, int]
    end: dict[int, int]

    def lag(self) -> dict[int, int]:
        return {p: self.end[p] - self.committed[p] for p in sorted(self.end)}


@dataclass
class LagRun:
    sources: LagSources
    roles: Roles
    seed: int
    poison: bool
    moving: bool
    first: Look
    second: Look
    poison_offset: int = -1
    poison_key: str = ""
    poison_headers: dict[str, str] = field(default_factory=dict)
    keys: dict[tuple[int, int], str] = field(default_factory=dict)
    step: Callable[[], None] = lambda: None     # moves the group on to the second look
    several: bool = False                       # every partition stuck, partition 1 the most

    def describe(self) -> str:
        replay = f"run {self.seed}, replay: DOJO_INCIDENT_RUN={self.seed}"
        if self.several:
            return (f"every partition is stuck behind a poison record; partition "
                    f"{self.roles.stuck} has the most records waiting, its record has an empty "
                    f"key ({replay})")
        if self.poison:
            return (f"partition {self.roles.stuck} is stuck behind a poison record at offset "
                    f"{self.poison_offset} ({replay})")
        if self.moving:
            return f"partition {self.roles.moving} is slow but moving, none is stuck ({replay})"
        return f"the group is caught up on every partition ({replay})"

    def evidence(self, after: Look | None = None) -> str:
        rows = []
        for p in range(PARTITIONS):
            rows.append((p, self.first.committed[p], self.first.end[p], self.first.lag()[p],
                         self.second.committed[p], self.second.end[p], self.second.lag()[p]))
        parts = [self.describe(),
                 f"group {self.sources.group} on topic {self.sources.topic}, as the broker "
                 "had it at the two looks:",
                 table(rows, ("partition", "committed 1", "end 1", "lag 1", "committed 2",
                              "end 2", "lag 2"))]
        if self.poison:
            parts.append(f"the record at partition {self.roles.stuck}, offset "
                         f"{self.poison_offset}: key {self.poison_key!r}, headers "
                         f"{self.poison_headers}")
        if after is not None and after.committed != self.second.committed:
            parts.append("the group's committed offsets after your code ran: "
                         + _offsets(after.committed))
        return "\n".join(parts)


def _offsets(offsets: dict[int, int]) -> str:
    return "{" + ", ".join(f"p{p}: {o}" for p, o in sorted(offsets.items())) + "}"


class _Notifier:
    """The shop's consumer group, one step at a time: it reads each record with the group's
    id, handles it (decodes the event) and commits the offset after it."""

    def __init__(self, kafka: Any, topic: str, group: str) -> None:
        self.kafka = kafka
        self.topic = topic
        self.group = group

    def advance(self, partition: int, start: int, upto: int) -> None:
        """Handle the records [start, upto) of `partition` and commit `upto`."""
        from confluent_kafka import Consumer, TopicPartition

        consumer = Consumer(self.kafka.consumer_config(group_id=self.group))
        try:
            consumer.assign([TopicPartition(self.topic, partition, start)])
            offset = start
            deadline = time.monotonic() + 30
            while offset < upto:
                if time.monotonic() > deadline:
                    raise AssertionError(f"the notifier never read {self.topic} partition "
                                         f"{partition} offset {offset} (end {upto})")
                message = consumer.poll(0.2)
                if message is None or message.error():
                    continue
                if message.offset() != offset:
                    continue
                json.loads(message.value() or b"")  # the poison record would raise here
                offset += 1
            consumer.commit(offsets=[TopicPartition(self.topic, partition, upto)],
                            asynchronous=False)
        finally:
            consumer.close()


def look(kafka: Any, topic: str, group: str) -> Look:
    """The group's committed offsets and the partitions' end offsets, as the broker has them."""
    from confluent_kafka import Consumer, TopicPartition

    probe = Consumer(kafka.consumer_config(group_id=group))
    try:
        found = probe.committed([TopicPartition(topic, p) for p in range(PARTITIONS)],
                                timeout=10)
        committed = {tp.partition: tp.offset for tp in found}
        end = {p: probe.get_watermark_offsets(TopicPartition(topic, p), timeout=10,
                                              cached=False)[1] for p in range(PARTITIONS)}
        return Look(committed, end)
    finally:
        probe.close()


def _settle(kafka: Any, topic: str, group: str, want: Look) -> Look:
    """A barrier on the broker: until the group's committed offsets and the end offsets are
    exactly those expected (a broker may show a write a moment after acknowledging it)."""
    deadline = time.monotonic() + 30
    seen = look(kafka, topic, group)
    while seen != want:
        if time.monotonic() > deadline:
            raise AssertionError(f"the broker never showed the expected offsets of {topic}: "
                                 f"expected {want}, it shows {seen}")
        time.sleep(0.05)
        seen = look(kafka, topic, group)
    return seen


@dataclass
class _Plan:
    """Records to write per partition before each look, and how far the group gets."""
    end: dict[int, int]
    committed: dict[int, int]


def _plans(seed: int, roles: Roles, poison: bool, moving: bool) -> tuple[_Plan, _Plan, int]:
    """The two looks' end and committed offsets, and the poison record's offset (-1: none)."""
    at = 3 + seed % 4                       # the poison record's offset on the stuck partition
    first_end, first_committed = {}, {}
    second_end, second_committed = {}, {}
    # the stuck partition: handled up to the poison record; in even runs new events arrive
    # behind it between the looks, in odd runs none (its lag stays the same: stuck all the same)
    stuck_end, more = at + 3 + seed % 3, 2 if seed % 2 == 0 else 0
    first_end[roles.stuck], second_end[roles.stuck] = stuck_end, stuck_end + more
    if poison:
        first_committed[roles.stuck] = second_committed[roles.stuck] = at
    else:
        first_committed[roles.stuck], second_committed[roles.stuck] = stuck_end, stuck_end + more
    # the slow partition: more waits there than on the stuck one, and the group moves on
    slow_end = 14 + seed % 5
    first_end[roles.moving], second_end[roles.moving] = slow_end, slow_end + 6
    if moving:
        first_committed[roles.moving], second_committed[roles.moving] = 2, 5
    else:
        first_committed[roles.moving], second_committed[roles.moving] = slow_end, slow_end + 6
    # the caught-up partition: every event handled. In the stuck run new events arrive between
    # the looks and the group handles them all (its committed offset moves, nothing waits:
    # neither stuck nor slow); in the others none (it stays put, nothing waits: idle, not stuck)
    first_end[roles.caught_up] = first_committed[roles.caught_up] = 6
    second_end[roles.caught_up] = second_committed[roles.caught_up] = 6 + (3 if poison else 0)
    return (_Plan(first_end, first_committed), _Plan(second_end, second_committed),
            at if poison else -1)


def _key(seed: int, partition: int, offset: int) -> str:
    return f"u-{(seed * 37 + partition * 1000 + offset * 7919) % 90000 + 10000}"


def _several(seed: int) -> tuple[_Plan, _Plan, dict[int, int]]:
    """Every partition stuck behind a poison record of its own; the middle partition (1) has
    the most records waiting, so neither the first nor the last stuck partition is the
    answer, and it is the one where no new record arrives between the looks (stuck does not
    need new records)."""
    lags = {0: 4 + seed % 3, 1: 10 + seed % 3, 2: 7 + seed % 3}
    at = {p: 2 + (seed + p) % 3 for p in range(PARTITIONS)}
    first = _Plan({p: at[p] + lags[p] for p in at}, dict(at))
    second = _Plan({p: at[p] + lags[p] + (0 if p == 1 else 1) for p in at}, dict(at))
    return first, second, at


@contextmanager
def lag_run(kafka: Any, seed: int, poison: bool, moving: bool = True,
            several: bool = False) -> Iterator[LagRun]:
    """The notifier group as the run says, settled before each look: yields the run with its
    first look taken; `second()` (the run's `step`) moves it to the second look."""
    from confluent_kafka import Producer

    roles = Roles(1, 0, 2) if several else roles_of(seed)
    topic = kafka.topic(PARTITIONS, hint="orders")
    group = kafka.group_id("notifier")
    if several:
        first, second, bad_at = _several(seed)
    else:
        first, second, at = _plans(seed, roles, poison, moving)
        bad_at = {roles.stuck: at} if at >= 0 else {}
    poison_at = bad_at.get(roles.stuck, -1)
    producer = Producer(kafka.producer_config(**{"linger.ms": 0}))
    notifier = _Notifier(kafka, topic, group)
    keys: dict[tuple[int, int], str] = {}
    headers_of: dict[tuple[int, int], dict[str, str]] = {}

    def write(plan: _Plan, since: dict[int, int]) -> None:
        for p in range(PARTITIONS):
            for offset in range(since.get(p, 0), plan.end[p]):
                bad = bad_at.get(p) == offset
                # an empty key is a key: the answer's poison record has one when all are stuck
                key = "" if several and bad and p == roles.stuck else _key(seed, p, offset)
                trace = random.Random(seed * 1_000_003 + p * 4096 + offset).getrandbits(128)
                headers = {"trace_id": uuid.UUID(int=trace).hex,
                           "event_type": "order-placed",
                           "schema_version": "2" if bad else "1"}
                value = POISON_VALUE if bad else json.dumps(
                    {"order_id": 1000 + offset, "user": key, "qty": 1}).encode()
                producer.produce(topic, partition=p, key=key.encode(), value=value,
                                 headers=[(k, v.encode()) for k, v in headers.items()])
                # one record per batch: Tansu's end offset is wrong after a multi-record batch
                if producer.flush(30):
                    raise AssertionError(f"the producer could not write the shop's events to "
                                         f"{topic}")
                keys[(p, offset)] = key
                headers_of[(p, offset)] = headers

    def handle(plan: _Plan, since: dict[int, int]) -> None:
        for p in range(PARTITIONS):
            if plan.committed[p] > since.get(p, 0):
                notifier.advance(p, since.get(p, 0), plan.committed[p])

    write(first, {})
    handle(first, {})
    look_1 = _settle(kafka, topic, group, Look(first.committed, first.end))
    sources = LagSources("", "", [], datetime.now(UTC),
                         kafka={"bootstrap.servers": kafka.bootstrap}, topic=topic,
                         group=group)
    run = LagRun(sources, roles, seed, poison or several, moving and not several, look_1,
                 look_1, poison_at, keys.get((roles.stuck, poison_at), ""),
                 headers_of.get((roles.stuck, poison_at), {}), keys, several=several)

    def step() -> None:
        write(second, first.end)
        handle(second, first.committed)
        run.second = _settle(kafka, topic, group, Look(second.committed, second.end))

    run.step = step
    yield run


def two_looks(learner: Any, run: LagRun) -> Any:
    """The learner's first look (lag_snapshot), the group moving on, its second look
    (consumer_lag with the first): the finding."""
    from dojo.checks import call

    triage = learner.module("triage")
    before = call(triage.lag_snapshot, run.sources)
    run.step()
    return call(triage.consumer_lag, run.sources, before)
