"""DLT visibility read with the AdminClient (ListConsumerGroupOffsets + ListOffsets: no
consumer group membership at all), the oldest waiting record fetched by a plain assign."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from threading import RLock
from typing import Any

from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

_CONSUMER_ONLY = ("group.", "enable.auto.", "auto.", "max.poll.", "session.", "heartbeat.",
                  "fetch.", "isolation.", "partition.assignment", "enable.partition.eof",
                  "queued.", "check.crcs", "client.rack")


class DeadLetterMetrics:
    def __init__(self) -> None:
        self._c: Counter[str] = Counter()
        self._lock = RLock()

    def dead_lettered(self, exception_type: str) -> None:
        with self._lock:
            self._c.update([exception_type])

    def counts(self) -> dict[str, int]:
        with self._lock:
            return {k: v for k, v in self._c.items() if v}


def _admin(consumer_config: dict[str, Any]) -> AdminClient:
    return AdminClient({k: v for k, v in consumer_config.items()
                        if not k.startswith(_CONSUMER_ONLY)})


def _ranges(consumer_config: dict[str, Any], topic: str, group_id: str
            ) -> list[tuple[int, int, int]]:
    """(partition, first waiting offset, end offset) per partition of `topic`."""
    admin = _admin(consumer_config)
    parts = sorted(admin.list_topics(topic, timeout=10).topics[topic].partitions)
    tps = [TopicPartition(topic, p) for p in parts]
    request = [ConsumerGroupTopicPartitions(group_id, tps)]
    done = admin.list_consumer_group_offsets(request)[group_id].result(timeout=10)
    committed = {tp.partition: tp.offset for tp in done.topic_partitions}
    ends = admin.list_offsets({tp: OffsetSpec.latest() for tp in tps})
    starts = admin.list_offsets({tp: OffsetSpec.earliest() for tp in tps})
    out = []
    for tp in tps:
        high = ends[tp].result(timeout=10).offset
        low = starts[tp].result(timeout=10).offset
        got = committed.get(tp.partition, -1)
        first = low if got is None or got < 0 else max(got, low)
        out.append((tp.partition, first, high))
    return out


def dead_letter_depth(consumer_config: dict[str, Any], topic: str, group_id: str) -> int:
    return sum(max(0, high - first) for _, first, high in _ranges(consumer_config, topic,
                                                                  group_id))


def oldest_dead_letter_age_seconds(consumer_config: dict[str, Any], topic: str, group_id: str,
                                   *, now: float) -> float | None:
    waiting = [(p, first) for p, first, high in _ranges(consumer_config, topic, group_id)
               if high > first]
    if not waiting:
        return None
    reader = Consumer({**consumer_config, "group.id": group_id, "enable.auto.commit": False})
    stamps = []
    try:
        for partition, first in waiting:
            reader.assign([TopicPartition(topic, partition, first)])
            for _ in range(60):
                rec = reader.poll(0.1)
                if rec is not None and rec.error() is None:
                    stamps.append(rec.timestamp()[1] / 1000)
                    break
            reader.unassign()
    finally:
        reader.close()
    return max(0.0, now - min(stamps)) if stamps else None


def alert_reason(depth: int, oldest_age_seconds: float | None,
                 new_writes_by_type: Mapping[str, int]) -> str | None:
    lines = []
    new = {k: v for k, v in new_writes_by_type.items() if v > 0}
    if new:
        lines.append("dead-lettered payments since the last check: " +
                     ", ".join(f"{k} ({v})" for k, v in sorted(new.items(),
                                                              key=lambda kv: (-kv[1], kv[0]))))
    if depth > 0:
        line = f"{depth} dead-lettered payment(s) not yet handled"
        if oldest_age_seconds is not None:
            line += f", the oldest for {oldest_age_seconds:.0f} s"
        lines.append(line)
    return "\n".join(lines) if lines else None
