"""The DLQ checks' harness: topics named by the learner's code, inputs produced with exact
offsets, the learner's consumer run against a scripted gateway with the kit's taps on its
clients, the state read back from PostgreSQL and Kafka, and the run told as a timeline.

Nothing here reads the learner's internals: only the documented functions and tables
(ledger_entries), the records in the topics, and the group's committed offsets.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from _tools import Item
from sqlalchemy import Engine, text

from dojo.checks import CheckFailure, InstantClock, call, first_line, table
from dojo.checks.observers import (
    CommitProbe,
    ConsumerTap,
    ProducerTap,
    Record,
    committed_offsets,
    offsets_text,
    read_topic,
)

DLQ = "dead-letter-queue"
# The lesson section each stage's failures send the learner to (lab.yaml says the same).
READ = {
    "classify": f"{DLQ}#one-question-decides-where-a-failure-goes",
    "retry": f"{DLQ}#retrying-before-you-dead-letter",
    "dead-letter-record": f"{DLQ}#what-to-attach-to-a-dead-lettered-message",
    "dlt-topic": f"{DLQ}#kafka-the-application-writes-the-dead-letter-topic",
    "nothing-lost": f"{DLQ}#a-production-spring-kafka-setup-setting-by-setting",
    "keep-flowing": f"{DLQ}#what-goes-wrong-without-one",
    "idempotent-effect": "idempotent-consumer#marker-and-effect-in-one-transaction",
    "system-wide-failure": "circuit-breaker#message-consumers-pause-instead-of-dead-lettering",
    "visibility": f"{DLQ}#monitoring-the-silent-graveyard",
    "replay": f"{DLQ}#replay-getting-messages-back-out-safely",
    "order-per-key": f"{DLQ}#ordering-what-a-dlq-does-to-a-key",
}
MISTAKES = f"{DLQ}#common-mistakes"
SERVICE = "payments-consumer"
CHECKS_DIR = Path(__file__).parent


# -- inputs -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Input:
    """A record the check produced, where it landed, and what it is."""

    item: Item
    partition: int
    offset: int
    timestamp_ms: int

    @property
    def label(self) -> str:
        return self.item.label

    @property
    def at(self) -> str:
        return f"p{self.partition}@{self.offset}"

    def describe(self) -> str:
        key = f"key {self.item.key.decode(errors='backslashreplace')}" \
            if self.item.key is not None else "no key"
        return f"{self.at} ({self.label}, {key})"


@dataclass
class Topics:
    source: str
    dead_letter: str
    parking_lot: str
    partitions: int


@dataclass
class RunResult:
    consumer: ConsumerTap
    producer: ProducerTap
    outcome: str  # done | timeout | returned
    seconds: float  # real
    virtual_seconds: float
    committed: dict[int, int]
    ends: dict[int, int]

    def lag(self) -> int:
        return sum(max(0, end - max(self.committed.get(p, -1), 0))
                   for p, end in self.ends.items())


class RunRaised(CheckFailure):
    """consumer.run() raised instead of running until should_stop() said stop."""

    def __init__(self, error: BaseException, result: RunResult, downstream: Any,
                 inputs: Sequence[Input]) -> None:
        self.error, self.result = error, result
        last = result.consumer.delivered[-1] if result.consumer.delivered else None
        by_offset = {(i.partition, i.offset): i for i in inputs}
        found = by_offset.get((last.partition, last.offset)) if last else None
        handling = (found.describe() if found else f"p{last.partition}@{last.offset}") \
            if last else "no record yet"
        super().__init__(
            "consumer.run() raised an exception instead of consuming until should_stop() said "
            "stop. A consumer that dies on one record dies again on it after every restart "
            "(the record is never committed): the whole partition stops.",
            expected="run() handles every record (booked or dead-lettered) and returns only "
                     "when should_stop() is true",
            actual=f"run() raised {first_line(error)}, while handling {handling}",
            evidence="what happened (clock time):\n" + timeline(result, downstream, inputs,
                                                                 limit=14),
            lesson=READ["keep-flowing"])


_PRODUCERS: dict[str, Any] = {}  # learner producers, one per distinct config, for the session


class DLQLab:
    """Everything a check needs, bound to one test's broker topics and the learner's code."""

    def __init__(self, kafka: Any, learner: Any) -> None:
        self.kafka = kafka
        self.learner = learner
        self.ends: dict[str, dict[int, int]] = {}
        self.inputs: dict[str, list[Input]] = {}  # every input produced, per topic
        self._input_producer: Any = None

    # learner modules, imported fresh for this test
    def module(self, name: str) -> Any:
        return self.learner.module(name)

    @property
    def payments(self) -> Any:
        return self.module("payments")

    # -- topics ---------------------------------------------------------------------------
    def topics(self, partitions: int = 3, hint: str = "payments",
               config: dict[str, str] | None = None) -> Topics:
        source = self.kafka.topic(partitions, hint=hint, config=config)
        deadletter = self.module("deadletter")
        names = call(deadletter.topic_names, source)
        for name in (names.dead_letter, names.parking_lot):
            if not isinstance(name, str) or not name.startswith(source) or name == source:
                raise CheckFailure(
                    "deadletter.topic_names(source) must derive both names from the source "
                    "topic by adding a suffix: an explicit scheme, the same every time.",
                    expected=f"names like {source}-dlt and {source}-parking-lot",
                    actual=f"dead_letter={names.dead_letter!r}, "
                           f"parking_lot={names.parking_lot!r}",
                    lesson=READ["dlt-topic"])
        if names.dead_letter == names.parking_lot:
            raise CheckFailure("deadletter.topic_names(source) gives the DLT and the parking "
                               "lot the same name; they are two topics.",
                               expected="two different names",
                               actual=f"both {names.dead_letter!r}", lesson=READ["dlt-topic"])
        self.kafka.created.extend([names.dead_letter, names.parking_lot])  # deleted afterwards
        admin = self.kafka.admin()
        call(self.module("deadletter").create_topics, admin, source)
        self._wait_for(admin, [names.dead_letter, names.parking_lot])
        return Topics(source, names.dead_letter, names.parking_lot, partitions)

    def _wait_for(self, admin: Any, names: list[str]) -> None:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            meta = admin.list_topics(timeout=5).topics
            if all(n in meta and meta[n].error is None and meta[n].partitions and
                   all(p.leader >= 0 for p in meta[n].partitions.values()) for n in names):
                self.kafka.wait_until_served(names, deadline)
                return
            time.sleep(0.05)
        raise CheckFailure("deadletter.create_topics(admin, source) returned, but the topics "
                      "are not there.", expected=", ".join(names),
                      actual="missing after 10 s", lesson=READ["dlt-topic"])

    def partition_counts(self, names: Sequence[str]) -> dict[str, int]:
        meta = self.kafka.admin().list_topics(timeout=10).topics
        return {n: len(meta[n].partitions) if n in meta and meta[n].error is None else 0
                for n in names}

    # -- settings -------------------------------------------------------------------------
    def settings(self, topics: Topics, *, attempts: int = 4, initial: float = 0.4,
                 multiplier: float = 2.0, cap: float = 1.6, jitter: float = 0.2,
                 open_seconds: float = 2.0, max_poll_interval_ms: int = 300_000,
                 group_id: str | None = None) -> Any:
        p = self.payments
        return p.Settings(
            service=SERVICE, group_id=group_id or self.kafka.group_id("payments"),
            source_topic=topics.source, dead_letter_topic=topics.dead_letter,
            retry=p.RetryPolicy(max_attempts=attempts, initial_backoff_seconds=initial,
                                multiplier=multiplier, max_backoff_seconds=cap, jitter=jitter),
            breaker=p.BreakerPolicy(open_seconds=open_seconds),
            max_poll_interval_ms=max_poll_interval_ms, dead_letter_timeout_seconds=5.0)

    # -- producing inputs -----------------------------------------------------------------
    def produce(self, topic: str, items: Sequence[Item], *,
                extra_headers: Sequence[tuple[str, bytes]] = (),
                timestamp_ms: int | None = None) -> list[Input]:
        """Produce `items` one at a time (linger 0, flushed each), so offsets are exact and
        the broker's high watermark stays right; keys placed by murmur2 like Java.
        `timestamp_ms` is the producer's (CreateTime) timestamp of every record; an Input's
        timestamp is the one the broker acknowledged (its own on a LogAppendTime topic)."""
        if self._input_producer is None:
            self._input_producer = self.kafka.producer(**{"linger.ms": 0})
        out: list[Input] = []
        for item in items:
            reports: list[Any] = []
            kwargs: dict[str, Any] = {}
            if item.partition is not None:
                kwargs["partition"] = item.partition
            if timestamp_ms is not None:
                kwargs["timestamp"] = timestamp_ms
            self._input_producer.produce(
                topic, key=item.key, value=item.value,
                headers=list(item.headers) + list(extra_headers),
                on_delivery=lambda err, msg, r=reports: r.append((err, msg)), **kwargs)
            self._input_producer.flush(10)
            err, msg = reports[0]
            if err is not None:
                raise RuntimeError(f"the check could not produce its input: {err}")
            out.append(Input(item, msg.partition(), msg.offset(), msg.timestamp()[1]))
            self.inputs.setdefault(topic, []).append(out[-1])
            ends = self.ends.setdefault(topic, {})
            ends[msg.partition()] = max(ends.get(msg.partition(), 0), msg.offset() + 1)
        return out

    # -- the learner's clients ------------------------------------------------------------
    def consumer_config(self, settings: Any) -> dict[str, Any]:
        # A short session on both brokers: max.poll.interval.ms may then go down to 6 s.
        base = self.kafka.consumer_config(settings.group_id, **{"session.timeout.ms": 6000,
                                                                "heartbeat.interval.ms": 500})
        config = call(self.module("consumer").consumer_config, dict(base), settings)
        yours = ("group.id", "enable.auto.commit", "enable.auto.offset.store",
                 "max.poll.interval.ms")  # how this consumer commits is its own business
        changed = {k: (v, config.get(k)) for k, v in base.items()
                   if k not in yours and config.get(k) != v}
        if changed:
            raise CheckFailure(
                "consumer_config(base, settings) must keep every setting of base (the checks "
                "tune the client to their broker) and add its own.",
                expected=f"every key of base unchanged (except {', '.join(yours)})",
                actual="; ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in changed.items()),
                lesson=READ["nothing-lost"])
        return config

    def source_consumer(self, settings: Any, topics: Topics) -> Any:
        """The learner's consumer, assigned every partition of the source topic. assign()
        rather than subscribe(): offsets still live in settings.group_id, and the embedded
        broker would make a new group wait ~3 s for its first record."""
        from confluent_kafka import Consumer, TopicPartition

        consumer = Consumer(self.consumer_config(settings))
        self.kafka._clients.append(consumer)
        consumer.assign([TopicPartition(topics.source, p) for p in range(topics.partitions)])
        return consumer

    def producer_config(self, **overrides: Any) -> dict[str, Any]:
        base = self.kafka.producer_config(**overrides)
        config = call(self.module("consumer").producer_config, dict(base))
        changed = {k: (v, config.get(k)) for k, v in base.items()
                   if k not in ("acks", "linger.ms") and config.get(k) != v}
        if changed:
            raise CheckFailure(
                "producer_config(base) must keep every setting of base and add its own.",
                expected="every key of base unchanged (acks and linger.ms may change)",
                actual="; ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in changed.items()),
                lesson=READ["nothing-lost"])
        return config

    def dlt_producer(self, **overrides: Any) -> Any:
        """A producer from the learner's producer_config(), kept for the session (an
        idempotent producer spends ~1 s on the embedded broker getting its id)."""
        from confluent_kafka import Producer

        config = self.producer_config(**overrides)
        key = json.dumps(config, sort_keys=True, default=str)
        if key not in _PRODUCERS:
            producer = Producer(config)
            producer.produce(self.kafka.topic(1, hint="warmup"), value=b"warm-up")
            producer.flush(10)
            _PRODUCERS[key] = producer
        return _PRODUCERS[key]

    # -- running the consumer -------------------------------------------------------------
    def run(self, engine: Engine, topics: Topics, settings: Any, downstream: Any,
            clock: InstantClock, *, metrics: Any = None, producer: Any = None,
            consumer: Any = None, timeout: float = 12.0, linger: float = 0.0,
            watch: Callable[[dict[int, int]], None] | None = None,
            before_commit: Callable[[dict[int, int]], None] | None = None,
            hold_acks: float = 0.0,
            stop_when: Callable[[], bool] | None = None) -> RunResult:
        """Run consumer.run() until the group has committed every input (then `linger` s
        more), `stop_when()` is true, or `timeout` real seconds. `watch(committed)` sees every
        probe. A run() that raises fails the check with what it was handling (RunRaised)."""
        consumer_module = self.module("consumer")
        raw = consumer if consumer is not None else self.source_consumer(settings, topics)
        ctap = ConsumerTap(raw, clock, before_commit=before_commit)
        ptap = producer if isinstance(producer, ProducerTap) else \
            ProducerTap(producer if producer is not None else self.dlt_producer(), clock,
                        hold_acks=hold_acks)
        probe = CommitProbe(self.kafka, settings.group_id, topics.source,
                            topics.partitions)
        state: dict[str, Any] = {"outcome": "returned", "done_at": None}
        started = time.monotonic()
        virtual_started = clock.monotonic()

        def should_stop() -> bool:
            if stop_when is not None and stop_when():
                state["outcome"] = "stopped"
                return True
            ends = self.ends.get(topics.source, {})
            committed = probe.read()
            if watch is not None:
                watch(committed)
            now = time.monotonic()
            if ends and all(committed.get(p, -1) >= end for p, end in ends.items()):
                if state["done_at"] is None:
                    state["done_at"] = now
                if now - state["done_at"] >= linger:
                    state["outcome"] = "done"
                    return True
            if now - started > timeout:
                state["outcome"] = "timeout"
                return True
            return False

        try:
            call(consumer_module.run, ctap, ptap, engine, downstream, settings, clock=clock,
                 metrics=metrics, should_stop=should_stop)
        except CheckFailure:
            raise
        except Exception as exc:
            committed = probe.read(force=True)
            result = RunResult(ctap, ptap, "raised", time.monotonic() - started,
                               clock.monotonic() - virtual_started, committed,
                               dict(self.ends.get(topics.source, {})))
            raise RunRaised(exc, result, downstream, self.inputs.get(topics.source, [])) \
                from exc
        finally:
            committed = probe.read(force=True)
            probe.close()
        return RunResult(ctap, ptap, str(state["outcome"]), time.monotonic() - started,
                         clock.monotonic() - virtual_started, committed,
                         dict(self.ends.get(topics.source, {})))

    def learn_ends(self, topics: Topics, sent: ProducerTap) -> None:
        """Where the source ends after a replay wrote to it, from the acknowledgements it
        received (exact, at once); read the topic instead if one was never acknowledged."""
        writes = sent.to(topics.source)
        if any(p.acked_offset is None for p in writes):
            self.refresh_ends(topics)
            return
        ends = self.ends.setdefault(topics.source, {})
        for p in writes:
            if p.acked_partition is not None and p.acked_offset is not None:
                ends[p.acked_partition] = max(ends.get(p.acked_partition, 0),
                                              p.acked_offset + 1)

    def refresh_ends(self, topics: Topics) -> None:
        """Learn the source's end offsets by reading it (records another writer, such as a
        replay, added), never from the broker's high watermark (wrong on Tansu after a
        multi-record batch)."""
        ends = self.ends.setdefault(topics.source, {})
        for record in self.read(topics.source, topics.partitions):
            ends[record.partition] = max(ends.get(record.partition, 0), record.offset + 1)

    def run_until_stopped(self, engine: Engine, topics: Topics, settings: Any,
                          downstream: Any, clock: InstantClock, **kwargs: Any
                          ) -> tuple[RunResult | None, str, dict[int, int]]:
        """Like run(), for a run that may legitimately end by raising (a consumer that stops
        when its DLT is unreachable): (the result or None, how it ended, committed)."""
        try:
            result = self.run(engine, topics, settings, downstream, clock, **kwargs)
            return result, result.outcome, result.committed
        except RunRaised as raised:
            exc = raised.error
            how = f"run() raised {type(exc).__name__}: {str(exc)[:120]}"
            return raised.result, how, committed_offsets(self.kafka,
                                                         settings.group_id, topics.source,
                                                         topics.partitions)

    # -- reading back ---------------------------------------------------------------------
    def read(self, topic: str, partitions: int, *, expect: int | None = None,
             start: dict[int, int] | None = None, fence: bool = False) -> list[Record]:
        """Every record of `topic`. `fence=True` reads it completely at once (fence records
        appended and read back): only for a topic no code of the learner reads afterwards in
        this check. Without it the read stops 0.3 s after `expect` records came (0.6 s after
        the last one when None)."""
        if fence:
            return read_topic(self.kafka, topic, partitions, fence=True, start=start,
                              timeout=15.0)
        return read_topic(self.kafka, topic, partitions, fence=False, expect=expect,
                          start=start, timeout=4.0)


class HookedProducer(ProducerTap):
    """A producer tap that calls `before(record_number)` at every produce(), before the
    record leaves (to look at the world at that moment, or change it)."""

    def __init__(self, producer: Any, clock: Any, before: Callable[[int], None]) -> None:
        super().__init__(producer, clock)
        self._before_send = before
        self.sending: bytes | None = None  # the value of the record produce() was given

    def produce(self, *args: Any, **kwargs: Any) -> Any:
        # what is about to leave, for `before` to look at
        self.sending = kwargs.get("value", args[1] if len(args) > 1 else None)
        self._before_send(len(self.produced))
        return super().produce(*args, **kwargs)


class PausedUntil:
    """While active, every confluent_kafka.Consumer of group `group` pauses partition
    `partition` of `topic` right after assign() (its position unchanged: the client's own
    pause()), until `release()` or `fallback_s` of real time after the assign. Records of that
    partition then reach the replay only after what `release()` waits for. The learner's
    replay module must be imported inside the `with`."""

    def __init__(self, group: str, topic: str, partition: int, fallback_s: float = 1.5
                 ) -> None:
        self.group, self.topic, self.partition = group, topic, partition
        self.fallback_s = fallback_s
        self.released_by_trigger = False
        self._consumers: list[Any] = []
        self._until: float | None = None
        self._original: Any = None

    def release(self) -> None:
        """Resume the partition now (from a send hook: what it waited for has happened)."""
        self.released_by_trigger = True
        self._resume()

    def _resume(self) -> None:
        from confluent_kafka import TopicPartition

        if self._until is None:
            return
        self._until = None
        for consumer in self._consumers:
            consumer._dojo_resume([TopicPartition(self.topic, self.partition)])

    def __enter__(self) -> PausedUntil:
        import confluent_kafka

        original = self._original = confluent_kafka.Consumer
        outer = self

        class Pausing(original):  # type: ignore[misc, valid-type]
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(*args, **kwargs)
                config = args[0] if args and isinstance(args[0], dict) else kwargs
                self._dojo_ours = config.get("group.id") == outer.group
                if self._dojo_ours:
                    outer._consumers.append(self)

            def assign(self, *args: Any, **kwargs: Any) -> Any:
                from confluent_kafka import TopicPartition

                result = super().assign(*args, **kwargs)
                assigned = {tp.partition for tp in super().assignment() if tp.topic == outer.topic}
                if self._dojo_ours and outer.partition in assigned \
                        and not outer.released_by_trigger:
                    super().pause([TopicPartition(outer.topic, outer.partition)])
                    outer._until = time.monotonic() + outer.fallback_s
                return result

            def _dojo_resume(self, partitions: Any) -> None:
                super().resume(partitions)

            def _dojo_tick(self) -> None:
                if outer._until is not None and time.monotonic() >= outer._until:
                    outer._resume()

            def poll(self, *args: Any, **kwargs: Any) -> Any:
                self._dojo_tick()
                return super().poll(*args, **kwargs)

            def consume(self, *args: Any, **kwargs: Any) -> Any:
                self._dojo_tick()
                return super().consume(*args, **kwargs)

        confluent_kafka.Consumer = Pausing  # type: ignore[misc]
        return self

    def __exit__(self, *exc: object) -> None:
        import confluent_kafka

        confluent_kafka.Consumer = self._original  # type: ignore[misc]


class CommitCalls:
    """Counts the commit() calls of every confluent_kafka.Consumer made while it is active,
    and how many of them only queued the commit (asynchronous, confluent-kafka's default).
    For code that builds its own consumer from a config (replay): the learner's module must
    be imported inside the `with`, so that its `from confluent_kafka import Consumer` takes
    the counting class."""

    def __init__(self) -> None:
        self.calls = 0
        self.asynchronous = 0
        # (partition, offset) of every commit() given a message or offsets, in call order
        self.offsets: list[tuple[int, int]] = []
        self.at: list[float] = []  # when each of `offsets` was committed (time.monotonic())
        self._original: Any = None

    def __enter__(self) -> CommitCalls:
        import confluent_kafka

        original = self._original = confluent_kafka.Consumer
        calls = self

        class CountedConsumer(original):  # type: ignore[misc, valid-type]
            def commit(self, *args: Any, **kwargs: Any) -> Any:
                calls.calls += 1
                # commit(message=None, offsets=None, asynchronous=True), positional or not
                names = ("message", "offsets", "asynchronous")
                given = {**dict(zip(names, args, strict=False)), **kwargs}
                if given.get("asynchronous", True):
                    calls.asynchronous += 1
                message, offsets = given.get("message"), given.get("offsets")
                if message is not None:
                    calls.offsets.append((message.partition(), message.offset() + 1))
                for tp in offsets or ():
                    calls.offsets.append((tp.partition, tp.offset))
                calls.at.extend([time.monotonic()] * (len(calls.offsets) - len(calls.at)))
                return super().commit(*args, **kwargs)

        confluent_kafka.Consumer = CountedConsumer  # type: ignore[misc]
        return self

    def __exit__(self, *exc: object) -> None:
        import confluent_kafka

        confluent_kafka.Consumer = self._original  # type: ignore[misc]


class FailOnce:
    """A producer whose `fail_at`-th produce() (counted from 0) fails: the record goes to
    `sink` (a topic nobody reads) instead of where it was bound, and its delivery report
    reaches the caller as an error, the one a broker that never answers gives
    (_MSG_TIMED_OUT), at once rather than after message.timeout.ms. Every other produce()
    goes where it was bound: a write that fails once, the next succeeding. With `fail_topic`,
    the write that fails is the first one bound for that topic, whatever its number. With
    `every_time`, every later write of that same record (its value, to that topic) fails the
    same way: a retry of it never succeeds. With `silent`, its delivery report does not come
    for `hang_seconds` of real time (a broker that never answers): meanwhile the write counts
    in len(), and flush() and poll() block as a real client's do while it waits for it, for
    the whole timeout they are given (for ever when none, which here ends at `hang_seconds`,
    when the report comes at last as _MSG_TIMED_OUT, as after message.timeout.ms)."""

    _NAMES = ("topic", "value", "key", "partition", "on_delivery", "timestamp", "headers")

    def __init__(self, producer: Any, sink: str, fail_at: int = 0,
                 fail_topic: str | None = None, silent: bool = False,
                 every_time: bool = False, hang_seconds: float = 30.0) -> None:
        self._producer, self._sink, self._fail_at = producer, sink, fail_at
        self._fail_topic = fail_topic
        self.silent, self.every_time, self._hang = silent, every_time, hang_seconds
        self._failed: int | None = None  # the number of the produce() that failed
        self._failing: tuple[Any, bytes | None] | None = None  # (topic, value) that fails
        self._count = 0
        self._reported = False
        self.reported_at: float | None = None  # when the failed write's report was handed over
        # real time of the failing produce(), and of the first produce() of that record again
        self.failed_real_at: float | None = None
        self.retried_real_at: float | None = None
        # the silent write whose report has not come yet: (when it comes, real time; the
        # delivery; whether the caller gave a callback, without which no report reaches it)
        self._silent: tuple[float, Any, bool] | None = None
        # flush() called with no timeout (or a negative one) while the silent write waited
        self.unbounded_flush = False
        # for each produce() after the failing one: had its delivery report been handed to
        # the caller by then (the caller went on after the failure), or not (it did not wait)
        self.after_failure: list[bool] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._producer, name)

    def __len__(self) -> int:
        return len(self._producer) + (1 if self._silent is not None else 0)

    @property
    def failed(self) -> int | None:
        """The number of the produce() that failed (counted from 0), or None."""
        return self._failed

    def produce(self, *args: Any, **kwargs: Any) -> Any:
        from confluent_kafka import KafkaError

        number, self._count = self._count, self._count + 1
        if self._failed is not None:
            self.after_failure.append(self._reported)
        given = {k: v for k, v in zip(self._NAMES, args, strict=False) if v is not None}
        given.update(kwargs)
        topic = given.get("topic")
        if self._failed is not None and self.retried_real_at is None and \
                (topic, given.get("value")) == self._failing:
            self.retried_real_at = time.monotonic()
        if self._failed is None:
            fails = topic == self._fail_topic if self._fail_topic is not None \
                else number == self._fail_at
        else:
            fails = self.every_time and (topic, given.get("value")) == self._failing
        if not fails:
            return self._producer.produce(*args, **kwargs)
        if self._failed is None:
            self._failed, self._failing = number, (topic, given.get("value"))
            self.failed_real_at = time.monotonic()
        callback = given.pop("on_delivery", None) or given.pop("callback", None)
        given.pop("partition", None)
        given["topic"] = self._sink
        error = KafkaError(KafkaError._MSG_TIMED_OUT,
                           "the check's broker did not acknowledge this write")

        def report(_err: Any, msg: Any) -> None:
            if self.silent:
                # the report comes only when the broker's own timeout is up (_deliver_late)
                self._silent = (time.monotonic() + self._hang,
                                lambda: callback(error, msg) if callback is not None else None,
                                callback is not None)
                return
            if callback is not None:  # without one, the report never reaches the caller
                callback(error, msg)
                self._reported, self.reported_at = True, time.monotonic()

        return self._producer.produce(on_delivery=report, **given)

    def _deliver_late(self) -> int:
        """Hand over the silent write's report once its time has come."""
        if self._silent is None or time.monotonic() < self._silent[0]:
            return 0
        (_, deliver, has_callback), self._silent = self._silent, None
        deliver()
        if has_callback:
            self._reported, self.reported_at = True, time.monotonic()
        return 1

    def _wait(self, timeout: float | None) -> None:
        """Block as a client waiting for the silent write: `timeout` seconds (None or
        negative: until its report comes)."""
        if self._silent is None:
            return
        until = self._silent[0] if timeout is None or timeout < 0 or timeout >= 1e8 else \
            min(self._silent[0], time.monotonic() + timeout)
        time.sleep(max(0.0, until - time.monotonic()))

    def poll(self, timeout: float | None = None) -> int:
        served = self._producer.poll(0 if self._silent is not None else timeout)
        if self._silent is not None and not served:
            self._wait(timeout)
        return served + self._deliver_late()

    def flush(self, timeout: float | None = None) -> int:
        # no timeout, or a negative one, is for ever (a ProducerTap hands on for ever as 1e9)
        forever = timeout is None or timeout < 0 or timeout >= 1e8
        began = time.monotonic()
        if forever:
            self._producer.flush()
        else:
            self._producer.flush(timeout)
        if self._silent is not None:
            self.unbounded_flush = self.unbounded_flush or forever
            self._wait(None if forever or timeout is None
                       else timeout - (time.monotonic() - began))
        self._deliver_late()
        return len(self)


class CommitAudit:
    """Judges every offset commit of the learner's consumer before it reaches the broker:
    each input it covers for the first time must be booked (in ledger_entries) or
    acknowledged by the DLT by then. Hand `producer` to every run() of the check (the
    acknowledgements are remembered across runs) and the audit itself as `before_commit`.
    """

    COLUMNS = ("commit", "record below it", "at that moment")

    def __init__(self, lab: DLQLab, engine: Engine, topics: Topics, clock: InstantClock, *,
                 hold_acks: float = 0.0) -> None:
        self.engine, self.topics, self.lab = engine, topics, lab
        self.producer = ProducerTap(lab.dlt_producer(), clock, hold_acks=hold_acks)
        self.violations: list[tuple[str, str, str]] = []
        self._judged: set[tuple[int, int]] = set()

    def __call__(self, upto: dict[int, int]) -> None:
        inputs = self.lab.inputs.get(self.topics.source, [])
        fresh = [i for i in inputs if i.offset < upto.get(i.partition, -1)
                 and (i.partition, i.offset) not in self._judged]
        if not fresh:
            return
        booked = applied_ids(self.engine)
        writes = self.producer.to(self.topics.dead_letter)
        acked = {p.value for p in writes if p.acked_at is not None and p.error is None}
        for i in fresh:
            self._judged.add((i.partition, i.offset))
            if (i.item.event_id in booked) or (i.item.value in acked):
                continue
            pending = any(p.value == i.item.value for p in writes)
            state = ("its DLT write was produced but not yet acknowledged" if pending
                     else "not booked, no DLT write")
            self.violations.append((f"p{i.partition} -> {upto[i.partition]}", i.describe(),
                                    state))

    def table(self) -> str:
        return table(self.violations[:8], self.COLUMNS)


# -- the database -----------------------------------------------------------------------------

@dataclass(frozen=True)
class LedgerRow:
    id: int
    event_id: str
    account: str
    amount_cents: int


def ledger(engine: Engine) -> list[LedgerRow]:
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT id, event_id::text, account, amount_cents "
                                 "FROM ledger_entries ORDER BY id")).all()
    return [LedgerRow(*row) for row in rows]


def applied_ids(engine: Engine) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for row in ledger(engine):
        out.setdefault(row.event_id, []).append(row.id)
    return out


def balances(engine: Engine) -> dict[str, int]:
    """{account: balance in cents}, in account order (a message prints it the same every run)."""
    with engine.connect() as conn:
        return dict(conn.execute(text("SELECT account, balance_cents FROM balances "
                                      "ORDER BY account")).all())


# -- what a run left behind, as the learner should read it -----------------------------------

def match_dlt(inputs: Sequence[Input], records: Sequence[Record], *,
              by_key: bool = False) -> dict[int, list[Record]]:
    """DLT records per input (index), matched by their bytes (every input value is unique);
    with `by_key`, a record whose bytes match nothing is matched by its key and partition
    when exactly one input has them (so a changed value can still be shown)."""
    by_value: dict[bytes, int] = {i.item.value: n for n, i in enumerate(inputs)}
    out: dict[int, list[Record]] = {}
    for record in records:
        n = by_value.get(record.value or b"")
        if n is None and by_key and record.key is not None:
            same = [m for m, i in enumerate(inputs)
                    if i.item.key == record.key and i.partition == record.partition]
            n = same[0] if len(same) == 1 else None
        if n is not None:
            out.setdefault(n, []).append(record)
    return out


def dlt_table(records: Sequence[Record], inputs: Sequence[Input] = (), limit: int = 10) -> str:
    origin = {i.item.value: i for i in inputs}
    rows = []
    for r in records[:limit]:
        source = origin.get(r.value or b"")
        rows.append((f"p{r.partition}@{r.offset}", source.describe() if source else "?",
                     r.text("kafka_dlt-exception-fqcn") or "(no exception header)"))
    text_out = table(rows, ("DLT record", "original input", "exception"), limit)
    if len(records) > limit:
        text_out += f"\n… and {len(records) - limit} more DLT records"
    return text_out


def timeline(run: RunResult, downstream: Any, inputs: Sequence[Input], limit: int = 12) -> str:
    """What happened, in the clock's time: deliveries, gateway calls, DLT writes, commits."""
    t0 = min([d.at for d in run.consumer.delivered] + [c.at for c in downstream.calls] +
             [p.at for p in run.producer.produced] + [float("inf")])
    if t0 == float("inf"):
        return "(nothing happened: no record was polled)"
    by_offset = {(i.partition, i.offset): i for i in inputs}
    by_event = {i.item.event_id: i for i in inputs if i.item.event_id}
    by_value = {i.item.value: i for i in inputs}
    events: list[tuple[float, str]] = []
    for d in run.consumer.delivered:
        found = by_offset.get((d.partition, d.offset))
        where = found.describe() if found else f"p{d.partition}@{d.offset}"
        events.append((d.at, f"polled {where}"))
    for c in downstream.calls:
        found = by_event.get(c.event_id or "")
        events.append((c.at, f"{c.what}({found.at if found else ''}) -> {c.outcome}"))
    for p in run.producer.produced:
        found = by_value.get(p.value or b"")
        what = found.at if found else "?"
        events.append((p.at, f"DLT write of {what} produced"))
        if p.acked_at is not None:
            outcome = f"FAILED: {p.error}" if p.error else "acknowledged"
            events.append((p.acked_at, f"DLT write of {what} {outcome}"))
    for c in run.consumer.commits:
        upto = ", ".join(f"p{k}->{v}" for k, v in sorted(c.upto.items()))
        events.append((c.at, f"commit {upto}"))
    events.sort(key=lambda e: e[0])
    lines = [f"t+{at - t0:6.2f}s  {what}" for at, what in events[:limit]]
    if len(events) > limit:
        lines.append(f"… {len(events) - limit} more")
    return "\n".join(lines)


def retries_of(downstream: Any, event_id: str | None) -> list[float]:
    """Gaps (clock seconds) between the successive authorize() calls for one event."""
    times = [c.at for c in downstream.authorizations(event_id)]
    return [b - a for a, b in zip(times, times[1:], strict=False)]


class SteppedWallClock(InstantClock):
    """The checks' clock whose wall time (`now()`) can jump, as an NTP correction or a VM
    resume makes it jump; `monotonic()` never does."""

    def __init__(self) -> None:
        super().__init__()
        self.wall_offset = 0.0

    def __call__(self) -> datetime:
        return super().__call__() + timedelta(seconds=self.wall_offset)

    def now(self) -> float:
        return super().now() + self.wall_offset

    def step_wall(self, seconds: float) -> None:
        """Move the wall clock (only) `seconds` on; negative steps it back."""
        self.wall_offset += seconds


class EndOfSecondClock(InstantClock):
    """The checks' clock whose wall time (`now()`) always reads in the last half millisecond
    of a second (x.9995 to x.9999): where milliseconds rounded instead of truncated become
    1000. It keeps moving on (a jump of a second at each real second); `monotonic()` is the
    InstantClock's."""

    def now(self) -> float:
        t = super().now()
        return math.floor(t) + 0.9995 + (t - math.floor(t)) * 0.0004

    def __call__(self) -> datetime:
        return datetime.fromtimestamp(self.now(), UTC)


def nominal_backoffs(settings: Any, retries: int) -> list[float]:
    """The README's nominal waits before retry 1 … `retries`: min(cap, initial × mult^(n−1))."""
    r = settings.retry
    return [min(r.max_backoff_seconds, r.initial_backoff_seconds * r.multiplier ** (n - 1))
            for n in range(1, retries + 1)]


# The check's own time between two authorize() calls (a thread switch on a loaded machine)
# adds to the wait it measures; it never takes any away.
WAIT_SLACK_SECONDS = 0.15


@dataclass(frozen=True)
class BackoffWait:
    """One measured wait before a retry, against the README's formula."""

    account: str
    retry: int
    nominal: float
    jitter: float
    waited: float
    capped: bool

    COLUMNS = ("account", "retry", "nominal s", "allowed s", "waited s", "÷ nominal", "")

    @property
    def factor(self) -> float:
        return self.waited / self.nominal

    @property
    def low(self) -> float:
        return self.nominal * (1 - self.jitter) - 0.02

    @property
    def high(self) -> float:
        return self.nominal * (1 + self.jitter) + WAIT_SLACK_SECONDS

    @property
    def inside(self) -> bool:
        return self.low <= self.waited <= self.high

    def row(self) -> tuple[Any, ...]:
        return (self.account, self.retry, f"{self.nominal:.2f}", f"{self.low:.2f}–{self.high:.2f}",
                f"{self.waited:.3f}", f"{self.factor:.3f}", "" if self.inside else "WRONG")


def backoff_table(settings: Any, downstream: Any, items: Sequence[Item]) -> list[BackoffWait]:
    """Every wait between two authorize() calls of each item, with its nominal value."""
    r = settings.retry
    out = []
    for item in items:
        gaps = retries_of(downstream, item.event_id)
        for n, (gap, nominal) in enumerate(zip(gaps, nominal_backoffs(settings, len(gaps)),
                                               strict=True), start=1):
            raw = r.initial_backoff_seconds * r.multiplier ** (n - 1)
            out.append(BackoffWait(item.account or "?", n, nominal, r.jitter, gap,
                                   raw > r.max_backoff_seconds))
    return out



def require_done(run: RunResult, inputs: Sequence[Input], downstream: Any, *, read: str,
                 why: str = "") -> None:
    """Fail with the story of the run when the consumer did not commit every input."""
    if run.outcome == "done":
        return
    stuck = {p: c for p, c in run.committed.items() if c < run.ends.get(p, 0)}
    waiting = [i for i in inputs if i.offset >= max(run.committed.get(i.partition, -1), 0)
               and i.partition in stuck]
    how = ("consumer.run() returned before should_stop() said so" if run.outcome == "returned"
           else f"after {run.seconds:.1f} s the check stopped it")
    raise CheckFailure(
        "The consumer did not get through its input: some offsets were never committed. "
        + why,
        expected="every input booked or dead-lettered, and its offset committed",
        actual=f"{how}; committed {offsets_text(run.committed)} of {offsets_text(run.ends)}; "
               f"first uncommitted: {', '.join(i.describe() for i in waiting[:4]) or '?'}",
        evidence="what happened (clock time):\n" + timeline(run, downstream, inputs, limit=16),
        lesson=read)


def first_delivery(run: RunResult, i: Input) -> float | None:
    times = [d.at for d in run.consumer.delivered
             if d.partition == i.partition and d.offset == i.offset]
    return min(times) if times else None


def dlt_writes_of(run: RunResult, topic: str, i: Input) -> list[Any]:
    return [p for p in run.producer.to(topic) if (p.value or b"") == i.item.value]


# -- dead-letter records the check writes itself (for the visibility and replay stages) ------

@dataclass(frozen=True)
class Crafted:
    """A record the check put in the DLT, as the README's consumer would have written it."""

    item: Item
    exception: str  # simple class name, or module.Name for a class outside payments
    replays: int | None  # x-replay-count on the DLT record (None: never replayed)
    partition: int  # in the DLT (and the source: the same number)
    offset: int  # in the DLT
    timestamp_ms: int  # when it was dead-lettered
    source_offset: int


def spring_headers(source: str, partition: int, offset: int, exception: str,
                   replays: int | None, group: str = "payments-consumer-group") -> list:
    import struct

    # "sqlalchemy.exc.OperationalError": a class of another, nested module
    fqcn = exception if "." in exception else f"payments.{exception}"
    headers = [("kafka_dlt-original-topic", source.encode()),
               ("kafka_dlt-original-partition", struct.pack(">i", partition)),
               ("kafka_dlt-original-offset", struct.pack(">q", offset)),
               ("kafka_dlt-original-timestamp", struct.pack(">q", int(time.time() * 1000))),
               ("kafka_dlt-original-timestamp-type", b"CreateTime"),
               ("kafka_dlt-original-consumer-group", group.encode()),
               ("kafka_dlt-exception-fqcn", fqcn.encode()),
               # the root cause is another class (the filters read the exception's)
               ("kafka_dlt-exception-cause-fqcn", b"builtins.ConnectionResetError"),
               ("kafka_dlt-exception-message", f"{exception} (written by the check)".encode()),
               # a failure header of another writer's: the prefix, not a list of names, says
               # what a replay strips
               ("kafka_dlt-exception-stacktrace", b"Traceback (written by the check)"),
               ("x-dlt-attempts", b"1"),
               ("x-dlt-first-failure-at", b"2025-01-16T11:33:00.752Z"),
               ("x-dlt-last-failure-at", b"2025-01-16T11:33:00.752Z"),
               ("x-dlt-service", SERVICE.encode()),
               ("x-dlt-host", b"payments-7f9c4")]
    if replays is not None:
        headers.append(("x-replay-count", str(replays).encode()))
    return headers


def craft_dead_letters(lab: DLQLab, topics: Topics,
                       specs: Sequence[tuple[Item, str, int | None]], *,
                       timestamp_ms: int | None = None,
                       timestamps: Sequence[int] | None = None,
                       origin: bool = True,
                       dlt_partitions: Sequence[int | None] | None = None,
                       drop_headers: Sequence[str] = ()) -> list[Crafted]:
    """Write (item, exception class, replay count) records to the DLT, one per batch, in
    order; each goes to the partition its key gives in the source (murmur2, like Java),
    unless the item names one (the original was placed there explicitly). `timestamps`
    gives each record its own DLT timestamp (ms); `origin=False` leaves out the
    kafka_dlt-original-* headers (a record written by hand, or by a broken tool);
    `dlt_partitions` puts a record in another DLT partition than its original's (None: the
    same), as a DLT written by another tool, or with fewer partitions, may; `drop_headers`
    leaves out those headers too (a tool that writes no exception class)."""
    from dojo.checks.partitioning import partition_for

    out = []
    for n, (item, exception, replays) in enumerate(specs):
        partition = item.partition if item.partition is not None else \
            (partition_for(item.key, topics.partitions) if item.key is not None else 0)
        source_offset = 1000 + n  # where it would have been read (the check never reads it)
        headers = list(item.headers) + spring_headers(topics.source, partition,
                                                      source_offset, exception, replays)
        if not origin:
            headers = [(k, v) for k, v in headers if not k.startswith("kafka_dlt-original-")]
        headers = [(k, v) for k, v in headers if k not in drop_headers]
        reports: list[Any] = []
        if lab._input_producer is None:
            lab._input_producer = lab.kafka.producer(**{"linger.ms": 0})
        stamp = timestamps[n] if timestamps is not None else timestamp_ms
        kwargs: dict[str, Any] = {"timestamp": stamp} if stamp else {}
        elsewhere = dlt_partitions[n] if dlt_partitions is not None else None
        lab._input_producer.produce(topics.dead_letter, key=item.key, value=item.value,
                                    partition=partition if elsewhere is None else elsewhere,
                                    headers=headers,
                                    on_delivery=lambda e, m, r=reports: r.append((e, m)),
                                    **kwargs)
        lab._input_producer.flush(10)
        err, msg = reports[0]
        if err is not None:
            raise RuntimeError(f"the check could not write its DLT record: {err}")
        out.append(Crafted(item, exception, replays, msg.partition(), msg.offset(),
                           msg.timestamp()[1], source_offset))
    return out


def commit_group(lab: DLQLab, group_id: str, topic: str, offsets: dict[int, int]) -> None:
    """Commit `offsets` for `group_id` as if its job had handled the records below them."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({**lab.kafka.consumer_config(group_id)})
    try:
        consumer.commit(offsets=[TopicPartition(topic, p, o) for p, o in offsets.items()],
                        asynchronous=False)
    finally:
        consumer.close()
