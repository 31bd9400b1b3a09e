"""Replay: dead letters back to their source, once, capped, at a limited rate, one DLT
partition at a time (a key's records share a partition, so per-key order is per partition)."""

from __future__ import annotations

import time
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from deadletter import (
    EXCEPTION_FQCN,
    FAILURE_HEADER_PREFIXES,
    ORIGINAL_PARTITION,
    ORIGINAL_TOPIC,
    REPLAY_COUNT,
)
from payments import SYSTEM_CLOCK, Clock


@dataclass(frozen=True)
class ReplayReport:
    replayed: int  # re-published to their original topic
    parked: int  # moved to the parking lot (cap reached, or behind a parked record of the key)
    skipped: int  # left alone: filtered out (or behind a filtered-out record of the key)


class ReplayFailed(Exception):
    """A write was not acknowledged: its DLT offset (and everything after) stays uncommitted."""


def _headers(msg: Any) -> dict[str, bytes]:
    last: dict[str, bytes] = {}
    for name, value in msg.headers() or ():
        last[name] = value
    return last


class _Pacer:
    """At most `rate` sends per second of `clock` time: each send waits for its slot."""

    def __init__(self, rate: float, clock: Clock) -> None:
        self.gap = 1.0 / rate
        self.clock = clock
        self.last: float | None = None

    def wait(self) -> None:
        if self.last is not None:
            due = self.last + self.gap
            now = self.clock.monotonic()
            if due > now:
                self.clock.sleep(due - now)
        self.last = self.clock.monotonic()


def _publish(producer: Any, topic: str, msg: Any, headers: list[tuple[str, bytes]],
             partition: int | None, timeout: float) -> None:
    box: list[Any] = []
    extra = {} if partition is None else {"partition": partition}
    try:
        producer.produce(topic, value=msg.value(), key=msg.key(), headers=headers,
                         on_delivery=lambda err, _m: box.append(err), **extra)
    except (KafkaException, BufferError) as exc:
        raise ReplayFailed(f"{topic}: {exc}") from exc
    left = producer.flush(timeout)
    if left or not box or box[0] is not None:
        raise ReplayFailed(f"{topic} did not acknowledge: {box[0] if box else 'timeout'}")


def replay(consumer_config: dict[str, Any], producer: Any, *, dead_letter_topic: str,
           parking_lot_topic: str, group_id: str, max_replays: int = 3,
           rate_per_second: float = 50.0, exception_types: Collection[str] | None = None,
           failed_after: float | None = None, failed_before: float | None = None,
           clock: Clock = SYSTEM_CLOCK, ack_timeout_seconds: float = 10.0,
           timeout_seconds: float = 60.0) -> ReplayReport:
    wanted_types = None if exception_types is None else set(exception_types)
    reader = Consumer({**consumer_config, "group.id": group_id, "enable.auto.commit": False,
                       "auto.offset.reset": "earliest"})
    counts = {"replay": 0, "park": 0, "skip": 0}
    verdict_of_key: dict[bytes, str] = {}
    pacer = _Pacer(rate_per_second, clock)
    give_up = time.monotonic() + timeout_seconds
    try:
        parts = sorted(reader.list_topics(dead_letter_topic, timeout=10)
                       .topics[dead_letter_topic].partitions)
        committed = reader.committed([TopicPartition(dead_letter_topic, p) for p in parts],
                                     timeout=10)
        plan = []  # (partition, from, to) fixed now: what arrives later is the next run's
        for tp in committed:
            low, high = reader.get_watermark_offsets(tp, timeout=10, cached=False)
            start = max(low, tp.offset) if tp.offset >= 0 else low
            if start < high:
                plan.append((tp.partition, start, high))
        for partition, start, end in plan:
            reader.assign([TopicPartition(dead_letter_topic, partition, start)])
            position = start
            while position < end:
                if time.monotonic() > give_up:
                    return ReplayReport(counts["replay"], counts["park"], counts["skip"])
                msg = reader.poll(0.2)
                if msg is None:
                    continue
                if msg.error() is not None:
                    if msg.error().code() == KafkaError._PARTITION_EOF:
                        continue
                    raise KafkaException(msg.error())
                if msg.offset() >= end:
                    break
                position = msg.offset() + 1
                action = _verdict(msg, verdict_of_key, max_replays, wanted_types,
                                  failed_after, failed_before)
                headers = _headers(msg)
                if action == "replay":
                    pacer.wait()
                    count = int(headers.get(REPLAY_COUNT, b"0") or b"0") + 1
                    keep = [(k, v) for k, v in msg.headers() or ()
                            if not k.startswith(FAILURE_HEADER_PREFIXES) and k != REPLAY_COUNT]
                    target = None
                    if msg.key() is None and len(headers.get(ORIGINAL_PARTITION, b"")) == 4:
                        target = int.from_bytes(headers[ORIGINAL_PARTITION], "big", signed=True)
                    _publish(producer, headers[ORIGINAL_TOPIC].decode(), msg,
                             keep + [(REPLAY_COUNT, str(count).encode())], target,
                             ack_timeout_seconds)
                elif action == "park":
                    _publish(producer, parking_lot_topic, msg, list(msg.headers() or ()),
                             msg.partition(), ack_timeout_seconds)
                counts[action] += 1
                reader.commit(message=msg, asynchronous=False)
            reader.unassign()
        return ReplayReport(counts["replay"], counts["park"], counts["skip"])
    finally:
        reader.close()


def _verdict(msg: Any, verdict_of_key: dict[bytes, str], max_replays: int,
             wanted_types: set[str] | None, failed_after: float | None,
             failed_before: float | None) -> str:
    key = msg.key()
    if key is not None and key in verdict_of_key:
        return verdict_of_key[key]
    headers = _headers(msg)
    class_name = headers.get(EXCEPTION_FQCN, b"").decode("utf-8", "replace").split(".")[-1]
    dlt_time = msg.timestamp()[1] / 1000.0
    in_filter = ((wanted_types is None or class_name in wanted_types)
                 and (failed_after is None or dlt_time >= failed_after)
                 and (failed_before is None or dlt_time < failed_before))
    if not in_filter:
        verdict = "skip"
    else:
        try:
            count = int(headers.get(REPLAY_COUNT, b"0") or b"0")
        except ValueError:
            count = 0
        if ORIGINAL_TOPIC not in headers or count >= max_replays:
            verdict = "park"
        else:
            return "replay"
    if key is not None:
        verdict_of_key[key] = verdict
    return verdict
