"""Replay with the partition computed here, the way Kafka's Java DefaultPartitioner /
BuiltInPartitioner does for a keyed record: toPositive(murmur2(key)) % partitions. The
result does not depend on how the producer handed in was configured (librdkafka's default
partitioner is CRC32-based, not murmur2)."""

from __future__ import annotations

import time
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from deadletter import EXCEPTION_FQCN, ORIGINAL_PARTITION, ORIGINAL_TOPIC, REPLAY_COUNT
from payments import SYSTEM_CLOCK, Clock


@dataclass(frozen=True)
class ReplayReport:
    replayed: int  # re-published to their original topic
    parked: int  # moved to the parking lot (cap reached, or behind a parked record of the key)
    skipped: int  # left alone: filtered out (or behind a filtered-out record of the key)


class ReplayWriteFailed(Exception):
    pass


def murmur2(data: bytes) -> int:
    """Kafka's org.apache.kafka.common.utils.Utils.murmur2, as an unsigned 32-bit value."""
    m, r = 0x5BD1E995, 24
    length = len(data)
    h = (0x9747B28C ^ length) & 0xFFFFFFFF
    for i in range(0, length - length % 4, 4):
        k = int.from_bytes(data[i:i + 4], "little")
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> r
        k = (k * m) & 0xFFFFFFFF
        h = (h * m) & 0xFFFFFFFF
        h ^= k
    tail = length % 4
    base = length - tail
    if tail == 3:
        h ^= data[base + 2] << 16
    if tail >= 2:
        h ^= data[base + 1] << 8
    if tail >= 1:
        h ^= data[base]
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return h


def partition_for(key: bytes, partitions: int) -> int:
    return (murmur2(key) & 0x7FFFFFFF) % partitions


def _header(msg: Any, name: str) -> bytes | None:
    hits = [v for k, v in msg.headers() or [] if k == name]
    return hits[-1] if hits else None


def replay(consumer_config: dict[str, Any], producer: Any, *, dead_letter_topic: str,
           parking_lot_topic: str, group_id: str, max_replays: int = 3,
           rate_per_second: float = 50.0, exception_types: Collection[str] | None = None,
           failed_after: float | None = None, failed_before: float | None = None,
           clock: Clock = SYSTEM_CLOCK, ack_timeout_seconds: float = 10.0,
           timeout_seconds: float = 60.0) -> ReplayReport:
    consumer = Consumer({**consumer_config, "group.id": group_id, "enable.auto.commit": False,
                         "auto.offset.reset": "earliest"})
    replayed = parked = skipped = 0
    decided: dict[bytes, str] = {}
    partition_counts: dict[str, int] = {}
    try:
        meta = consumer.list_topics(dead_letter_topic, timeout=10).topics[dead_letter_topic]
        tps = [TopicPartition(dead_letter_topic, p) for p in meta.partitions]
        bounds = {}
        for tp in consumer.committed(tps, timeout=10):
            low, high = consumer.get_watermark_offsets(tp, timeout=10)
            begin = low if tp.offset < 0 else max(low, tp.offset)
            if begin < high:
                bounds[tp.partition] = (begin, high)
        consumer.assign([TopicPartition(dead_letter_topic, p, b) for p, (b, _) in bounds.items()])
        deadline = time.monotonic() + timeout_seconds
        earliest_next = None
        while bounds and time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is None:
                continue
            if msg.error():
                if msg.error().code() != KafkaError._PARTITION_EOF:
                    raise KafkaException(msg.error())
                continue
            span = bounds.get(msg.partition())
            if span is None or msg.offset() >= span[1]:
                continue
            action = decide(msg, decided, max_replays, exception_types, failed_after,
                            failed_before)
            if action == "replay":
                origin = (_header(msg, ORIGINAL_TOPIC) or b"").decode()
                count = _count(msg) + 1
                headers = [(k, v) for k, v in msg.headers() or []
                           if not (k.startswith("kafka_dlt-") or k.startswith("x-dlt-")
                                   or k == REPLAY_COUNT)] + [(REPLAY_COUNT, b"%d" % count)]
                if msg.key() is not None:
                    if origin not in partition_counts:
                        partition_counts[origin] = len(
                            consumer.list_topics(origin, timeout=10).topics[origin].partitions)
                    target = partition_for(msg.key(), partition_counts[origin])
                else:
                    raw = _header(msg, ORIGINAL_PARTITION)
                    target = int.from_bytes(raw, "big", signed=True) if raw and len(raw) == 4 \
                        else None
                # pace on the moment of the send itself (metadata look-ups above take time)
                if earliest_next is not None and clock.monotonic() < earliest_next:
                    clock.sleep(earliest_next - clock.monotonic())
                earliest_next = clock.monotonic() + 1.0 / rate_per_second
                _write(producer, origin, msg, headers, target, ack_timeout_seconds)
                replayed += 1
            elif action == "park":
                _write(producer, parking_lot_topic, msg, list(msg.headers() or []), None,
                       ack_timeout_seconds)
                parked += 1
            else:
                skipped += 1
            consumer.commit(message=msg, asynchronous=False)
            if msg.offset() + 1 >= span[1]:
                del bounds[msg.partition()]
        return ReplayReport(replayed, parked, skipped)
    finally:
        consumer.close()


def _count(msg: Any) -> int:
    raw = _header(msg, REPLAY_COUNT)
    if not raw:
        return 0
    text = raw.decode("ascii", "replace").strip()
    return int(text) if text.isdigit() else 0


def _write(producer: Any, topic: str, msg: Any, headers: list[tuple[str, bytes]],
           partition: int | None, timeout: float) -> None:
    acks: list[Any] = []
    args: dict[str, Any] = {"key": msg.key(), "value": msg.value(), "headers": headers,
                            "on_delivery": lambda err, _r: acks.append(err)}
    if partition is not None:
        args["partition"] = partition
    try:
        producer.produce(topic, **args)
    except (KafkaException, BufferError) as exc:
        raise ReplayWriteFailed(f"{topic}: {exc}") from exc
    producer.flush(timeout)
    if len(acks) != 1 or acks[0] is not None:
        raise ReplayWriteFailed(f"{topic}: {acks[0] if acks else 'no acknowledgement'}")


def decide(msg: Any, decided: dict[bytes, str], max_replays: int,
           exception_types: Collection[str] | None, failed_after: float | None,
           failed_before: float | None) -> str:
    key = msg.key()
    if key is not None and key in decided:
        return decided[key]
    fqcn = (_header(msg, EXCEPTION_FQCN) or b"").decode("utf-8", "replace")
    when = msg.timestamp()[1] / 1000.0
    selected = exception_types is None or fqcn.rsplit(".", 1)[-1] in exception_types
    selected = selected and (failed_after is None or when >= failed_after)
    selected = selected and (failed_before is None or when < failed_before)
    if not selected:
        outcome = "skip"
    elif _header(msg, ORIGINAL_TOPIC) is None or _count(msg) >= max_replays:
        outcome = "park"
    else:
        return "replay"
    if key is not None:
        decided[key] = outcome
    return outcome
