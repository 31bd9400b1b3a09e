"""Replay, structured as a reader (what is in the DLT now) and a writer (where each goes)."""

from __future__ import annotations

import time
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition
from payments import SYSTEM_CLOCK, Clock


@dataclass(frozen=True)
class ReplayReport:
    replayed: int
    parked: int
    skipped: int


class ReplayWriteFailed(Exception):
    pass


def _last(headers: list[tuple[str, bytes]], name: str) -> bytes | None:
    found = None
    for k, v in headers:
        if k == name:
            found = v
    return found


def _count(headers: list[tuple[str, bytes]]) -> int:
    raw = _last(headers, "x-replay-count")
    try:
        return int(raw.decode()) if raw else 0
    except (ValueError, UnicodeDecodeError):
        return 0


def _deliver(producer: Any, timeout: float, topic: str, msg: Any,
             headers: list[tuple[str, bytes]], partition: int | None) -> None:
    box: list[Any] = []
    args: dict[str, Any] = {"key": msg.key(), "value": msg.value(), "headers": headers,
                            "on_delivery": lambda err, _m: box.append(err)}
    if partition is not None:
        args["partition"] = partition
    try:
        producer.produce(topic, **args)
    except (KafkaException, BufferError) as exc:
        raise ReplayWriteFailed(str(exc)) from exc
    producer.flush(timeout)
    if not box:
        raise ReplayWriteFailed(f"no acknowledgement from {topic}")
    if box[0] is not None:
        raise ReplayWriteFailed(f"{topic} refused: {box[0]}")


def replay(consumer_config: dict[str, Any], producer: Any, *, dead_letter_topic: str,
           parking_lot_topic: str, group_id: str, max_replays: int = 3,
           rate_per_second: float = 50.0, exception_types: Collection[str] | None = None,
           failed_after: float | None = None, failed_before: float | None = None,
           clock: Clock = SYSTEM_CLOCK, ack_timeout_seconds: float = 10.0,
           timeout_seconds: float = 60.0) -> ReplayReport:
    real_deadline = time.monotonic() + timeout_seconds
    wanted_types = None if exception_types is None else set(exception_types)
    gap = 1.0 / rate_per_second
    consumer = Consumer({**consumer_config, "group.id": group_id, "enable.auto.commit": False})
    counts = {"replayed": 0, "parked": 0, "skipped": 0}
    try:
        topic_meta = consumer.list_topics(dead_letter_topic, timeout=10).topics[dead_letter_topic]
        tps = [TopicPartition(dead_letter_topic, p) for p in topic_meta.partitions]
        assign = []
        last_offset: dict[int, int] = {}
        for tp in consumer.committed(tps, timeout=10):
            low, high = consumer.get_watermark_offsets(
                TopicPartition(dead_letter_topic, tp.partition), timeout=10)
            begin = tp.offset if tp.offset >= low else low
            if begin < high:
                assign.append(TopicPartition(dead_letter_topic, tp.partition, begin))
                last_offset[tp.partition] = high - 1
        if not assign:
            return ReplayReport(0, 0, 0)
        consumer.assign(assign)
        blocked_park: set[bytes] = set()
        blocked_skip: set[bytes] = set()
        last_send: float | None = None
        while last_offset and time.monotonic() < real_deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            if msg.error():
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    continue
                raise KafkaException(msg.error())
            p = msg.partition()
            if p not in last_offset or msg.offset() > last_offset[p]:
                continue
            headers = list(msg.headers() or [])
            key = msg.key()
            origin_raw = _last(headers, "kafka_dlt-original-topic")
            fq = _last(headers, "kafka_dlt-exception-fqcn")
            kind = fq.decode("utf-8", "replace").split(".")[-1] if fq is not None else None
            ts_ms = msg.timestamp()[1]
            if key is not None and key in blocked_skip:
                verdict = "skip"
            elif key is not None and key in blocked_park:
                verdict = "park"
            elif (wanted_types is not None and kind not in wanted_types) or \
                    (failed_after is not None and ts_ms < failed_after * 1000) or \
                    (failed_before is not None and ts_ms >= failed_before * 1000):
                verdict = "skip"
                if key is not None:
                    blocked_skip.add(key)
            elif origin_raw is None or _count(headers) >= max_replays:
                verdict = "park"
                if key is not None:
                    blocked_park.add(key)
            else:
                verdict = "replay"
            if verdict == "replay":
                if last_send is None:
                    last_send = clock.monotonic()
                else:
                    due = last_send + gap
                    now = clock.monotonic()
                    if now < due:
                        clock.sleep(due - now)
                    last_send = max(due, clock.monotonic())
                out = [(k, v) for k, v in headers
                       if not k.startswith(("kafka_dlt-", "x-dlt-")) and k != "x-replay-count"]
                out.append(("x-replay-count", str(_count(headers) + 1).encode()))
                target = None
                if key is None:
                    raw = _last(headers, "kafka_dlt-original-partition")
                    if raw is not None and len(raw) == 4:
                        target = int.from_bytes(raw, "big", signed=True)
                _deliver(producer, ack_timeout_seconds, origin_raw.decode("utf-8"), msg, out,
                         target)
                counts["replayed"] += 1
            elif verdict == "park":
                _deliver(producer, ack_timeout_seconds, parking_lot_topic, msg, headers, None)
                counts["parked"] += 1
            else:
                counts["skipped"] += 1
            consumer.commit(offsets=[TopicPartition(dead_letter_topic, p, msg.offset() + 1)],
                            asynchronous=False)
            if msg.offset() >= last_offset[p]:
                del last_offset[p]
        return ReplayReport(**counts)
    finally:
        consumer.close()
