"""DLT visibility, with one probe consumer per call that reads all partitions at once."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from confluent_kafka import Consumer, TopicPartition


class DeadLetterMetrics:
    def __init__(self) -> None:
        self._by_type: dict[str, int] = {}

    def dead_lettered(self, exception_type: str) -> None:
        self._by_type[exception_type] = self._by_type.get(exception_type, 0) + 1

    def counts(self) -> dict[str, int]:
        return {k: v for k, v in self._by_type.items()}


def _pending(consumer: Any, topic: str) -> dict[int, tuple[int, int]]:
    """partition -> (first waiting offset, end offset), only where something waits."""
    md = consumer.list_topics(topic, timeout=10).topics[topic]
    tps = [TopicPartition(topic, p) for p in md.partitions]
    out = {}
    for tp in consumer.committed(tps, timeout=10):
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, tp.partition),
                                                   timeout=10)
        first = max(tp.offset, low) if tp.offset >= 0 else low
        if first < high:
            out[tp.partition] = (first, high)
    return out


def _probe(consumer_config: dict[str, Any], group_id: str) -> Any:
    return Consumer({**consumer_config, "group.id": group_id, "enable.auto.commit": False})


def dead_letter_depth(consumer_config: dict[str, Any], topic: str, group_id: str) -> int:
    c = _probe(consumer_config, group_id)
    try:
        return sum(high - first for first, high in _pending(c, topic).values())
    finally:
        c.close()


def oldest_dead_letter_age_seconds(consumer_config: dict[str, Any], topic: str, group_id: str,
                                   *, now: float) -> float | None:
    c = _probe(consumer_config, group_id)
    try:
        pending = _pending(c, topic)
        if not pending:
            return None
        c.assign([TopicPartition(topic, p, first) for p, (first, _) in pending.items()])
        firsts: dict[int, int] = {}
        stop_at = time.monotonic() + 10
        while len(firsts) < len(pending) and time.monotonic() < stop_at:
            m = c.poll(0.2)
            if m is None or m.error():
                continue
            if m.partition() in pending and m.partition() not in firsts:
                firsts[m.partition()] = m.timestamp()[1]
                c.pause([TopicPartition(topic, m.partition())])
        if not firsts:
            return None
        return max(0.0, now - min(firsts.values()) / 1000.0)
    finally:
        c.close()


def alert_reason(depth: int, oldest_age_seconds: float | None,
                 new_writes_by_type: Mapping[str, int]) -> str | None:
    parts = []
    fresh = sorted(t for t, n in new_writes_by_type.items() if n)
    if fresh:
        parts.append("new dead letters: " + ", ".join(
            f"{t} ({new_writes_by_type[t]})" for t in fresh))
    if depth:
        msg = f"{depth} dead letter(s) waiting"
        if oldest_age_seconds is not None:
            msg += f", oldest {oldest_age_seconds:.0f} s old"
        parts.append(msg)
    return " | ".join(parts) if parts else None
