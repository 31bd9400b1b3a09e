"""Replay: dead-lettered records back to their original topic, once, at a limited rate, with
a cap that parks repeat offenders in the parking lot, and without overtaking within a key.

A replay job is its group id and its filters. The group's committed offsets say how far the
job got, so running it again sends nothing twice.
"""

from __future__ import annotations

import time
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from confluent_kafka import OFFSET_INVALID, Consumer, KafkaError, KafkaException, TopicPartition
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


class ReplayWriteFailed(Exception):
    """The broker did not acknowledge a re-published record; its DLT offset stays uncommitted."""


def _header(msg: Any, name: str) -> bytes | None:
    values = [v for k, v in (msg.headers() or []) if k == name]
    return values[-1] if values else None


def _text(msg: Any, name: str) -> str | None:
    value = _header(msg, name)
    return None if value is None else value.decode("utf-8", "replace")


def replay_count(msg: Any) -> int:
    value = _text(msg, REPLAY_COUNT)
    try:
        return int(value) if value is not None else 0
    except ValueError:
        return 0


def exception_type(msg: Any) -> str | None:
    value = _text(msg, EXCEPTION_FQCN)
    return None if value is None else value.rsplit(".", 1)[-1]


def business_headers(msg: Any) -> list[tuple[str, bytes]]:
    """Everything but the failure context of the last trip and the old replay count."""
    return [(k, v) for k, v in (msg.headers() or [])
            if not k.startswith(FAILURE_HEADER_PREFIXES) and k != REPLAY_COUNT]


def murmur2(data: bytes) -> int:
    """Kafka's Java murmur2 (Utils.murmur2), as a 32-bit unsigned value."""
    m, r = 0x5BD1E995, 24
    length = len(data)
    h = (0x9747B28C ^ length) & 0xFFFFFFFF
    for i in range(length // 4):
        k = int.from_bytes(data[4 * i:4 * i + 4], "little")
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> r
        k = (k * m) & 0xFFFFFFFF
        h = (h * m) & 0xFFFFFFFF
        h ^= k
    tail, extra = length & ~3, length % 4
    if extra == 3:
        h ^= data[tail + 2] << 16
    if extra >= 2:
        h ^= data[tail + 1] << 8
    if extra >= 1:
        h ^= data[tail]
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return h


def key_partition(key: bytes, partitions: int) -> int:
    return (murmur2(key) & 0x7FFFFFFF) % partitions


def _send(producer: Any, topic: str, msg: Any, headers: list[tuple[str, bytes]],
          partition: int | None, timeout: float) -> None:
    outcome: list[Any] = []
    kwargs: dict[str, Any] = {"partition": partition} if partition is not None else {}
    try:
        producer.produce(topic, value=msg.value(), key=msg.key(), headers=headers,
                         on_delivery=lambda err, _record: outcome.append(err), **kwargs)
    except (KafkaException, BufferError) as exc:
        raise ReplayWriteFailed(f"produce to {topic} failed: {exc}") from exc
    producer.flush(timeout)
    if not outcome or outcome[0] is not None:
        raise ReplayWriteFailed(f"{topic} did not acknowledge: {outcome or 'timed out'}")


def replay(consumer_config: dict[str, Any], producer: Any, *, dead_letter_topic: str,
           parking_lot_topic: str, group_id: str, max_replays: int = 3,
           rate_per_second: float = 50.0, exception_types: Collection[str] | None = None,
           failed_after: float | None = None, failed_before: float | None = None,
           clock: Clock = SYSTEM_CLOCK, ack_timeout_seconds: float = 10.0,
           timeout_seconds: float = 60.0) -> ReplayReport:
    """Replay the DLT records that `group_id` has not handled yet, up to the DLT's end as it
    was when the replay started.

    A record whose replay count has reached `max_replays` goes to the parking lot, headers
    intact; one outside the filters (exception class name, DLT timestamp in
    [failed_after, failed_before)) is skipped. Once a record of a key is not re-published,
    no later record of that key is either: it follows to the parking lot, or is skipped.
    A re-published record keeps key, value and business headers, loses the failure headers,
    and carries x-replay-count = previous + 1. Each DLT offset is committed only after the
    broker acknowledged where the record went.

    Raises:
        ReplayWriteFailed: a write was not acknowledged (nothing after it is committed).
    """
    consumer = Consumer({**consumer_config, "group.id": group_id,
                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    replayed = parked = skipped = 0
    try:
        meta = consumer.list_topics(dead_letter_topic, timeout=10).topics[dead_letter_topic]
        parts = [TopicPartition(dead_letter_topic, p) for p in sorted(meta.partitions)]
        committed = {tp.partition: tp.offset for tp in consumer.committed(parts, timeout=10)}
        ends, starts = {}, {}
        for tp in parts:
            low, high = consumer.get_watermark_offsets(tp, timeout=10)
            start = committed.get(tp.partition, OFFSET_INVALID)
            starts[tp.partition] = low if start < 0 else max(start, low)
            ends[tp.partition] = high
        todo = {p for p in ends if starts[p] < ends[p]}
        if not todo:
            return ReplayReport(0, 0, 0)
        # One process, so no group membership is needed: assign() and start at the
        # committed offsets (the embedded broker also makes a join take seconds).
        consumer.assign([TopicPartition(dead_letter_topic, p, starts[p]) for p in sorted(todo)])
        held_back: dict[bytes, str] = {}  # key -> "park" | "skip", for the rest of this run
        interval = 1.0 / rate_per_second
        last_send: float | None = None
        counts: dict[str, int] = {}
        deadline = time.monotonic() + timeout_seconds
        while todo and time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is None:
                continue
            if msg.error():
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    continue
                raise KafkaException(msg.error())
            partition = msg.partition()
            if partition not in todo or msg.offset() >= ends[partition]:
                continue  # written after the replay started: the next run's business
            action = _decide(msg, held_back, max_replays, exception_types, failed_after,
                             failed_before)
            if action == "replay":
                if last_send is not None:
                    gap = clock.monotonic() - last_send
                    if gap < interval:
                        clock.sleep(interval - gap)
                last_send = clock.monotonic()
                headers = business_headers(msg) + [
                    (REPLAY_COUNT, str(replay_count(msg) + 1).encode())]
                origin = _text(msg, ORIGINAL_TOPIC)
                assert origin is not None
                # The key picks the partition as the original (murmur2) producer did; a record
                # without a key goes back where it came from.
                if msg.key() is not None:
                    if origin not in counts:
                        counts[origin] = len(producer.list_topics(origin, timeout=10)
                                             .topics[origin].partitions)
                    target = key_partition(msg.key(), counts[origin])
                else:
                    raw = _header(msg, ORIGINAL_PARTITION)
                    target = None if raw is None or len(raw) != 4 \
                        else int.from_bytes(raw, "big", signed=True)
                _send(producer, origin, msg, headers, target, ack_timeout_seconds)
                replayed += 1
            elif action == "park":
                _send(producer, parking_lot_topic, msg, list(msg.headers() or []), None,
                      ack_timeout_seconds)
                parked += 1
            else:
                skipped += 1  # not committed: a later commit of the partition covers it
            if action != "skip":
                consumer.commit(message=msg, asynchronous=False)
            if consumer.position([TopicPartition(dead_letter_topic, partition)])[0].offset \
                    >= ends[partition]:
                todo.discard(partition)
        return ReplayReport(replayed, parked, skipped)
    finally:
        consumer.close()


def _decide(msg: Any, held_back: dict[bytes, str], max_replays: int,
            exception_types: Collection[str] | None, failed_after: float | None,
            failed_before: float | None) -> str:
    key = msg.key()
    if key is not None and key in held_back:
        return held_back[key]  # never overtake a record of the same key that stays behind
    stamp_ms = msg.timestamp()[1]
    wanted = (exception_types is None or exception_type(msg) in exception_types) and \
        (failed_after is None or stamp_ms >= failed_after * 1000) and \
        (failed_before is None or stamp_ms < failed_before * 1000)
    if not wanted:
        action = "skip"
    elif _text(msg, ORIGINAL_TOPIC) is None or replay_count(msg) >= max_replays:
        action = "park"
    else:
        return "replay"
    if key is not None:
        held_back[key] = action
    return action
