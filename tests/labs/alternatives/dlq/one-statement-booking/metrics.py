"""Visibility of the DLT: writes by exception class, depth and age for the group that
works it (the replay job), and the page to send."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from confluent_kafka import Consumer, TopicPartition


class DeadLetterMetrics:
    def __init__(self) -> None:
        self._by_type: dict[str, int] = {}
        self._guard = threading.Lock()

    def dead_lettered(self, exception_type: str) -> None:
        with self._guard:
            self._by_type[exception_type] = self._by_type.get(exception_type, 0) + 1

    def counts(self) -> dict[str, int]:
        with self._guard:
            return {name: n for name, n in self._by_type.items()}


def _reader(consumer_config: dict[str, Any], group_id: str) -> Consumer:
    settings = {k: v for k, v in consumer_config.items() if k != "group.id"}
    settings.update({"group.id": group_id, "enable.auto.commit": False,
                     "auto.offset.reset": "earliest"})
    return Consumer(settings)


def _backlog(reader: Consumer, topic: str) -> dict[int, tuple[int, int]]:
    """partition -> (first unhandled offset, end offset), only where something waits."""
    partitions = reader.list_topics(topic, timeout=10).topics[topic].partitions
    asked = [TopicPartition(topic, p) for p in partitions]
    backlog = {}
    for tp in reader.committed(asked, timeout=10):
        low, high = reader.get_watermark_offsets(TopicPartition(topic, tp.partition),
                                                 timeout=10, cached=False)
        first = tp.offset if tp.offset >= 0 else low
        first = max(first, low)
        if high > first:
            backlog[tp.partition] = (first, high)
    return backlog


def dead_letter_depth(consumer_config: dict[str, Any], topic: str, group_id: str) -> int:
    reader = _reader(consumer_config, group_id)
    try:
        return sum(high - first for first, high in _backlog(reader, topic).values())
    finally:
        reader.close()


def oldest_dead_letter_age_seconds(consumer_config: dict[str, Any], topic: str, group_id: str,
                                   *, now: float) -> float | None:
    reader = _reader(consumer_config, group_id)
    try:
        backlog = _backlog(reader, topic)
        if not backlog:
            return None
        reader.assign([TopicPartition(topic, p, first) for p, (first, _) in backlog.items()])
        heads: dict[int, int] = {}
        for _ in range(100):
            if len(heads) == len(backlog):
                break
            for rec in reader.consume(num_messages=len(backlog), timeout=0.1):
                if rec.error() is not None or rec.partition() in heads:
                    continue
                heads[rec.partition()] = rec.timestamp()[1]  # the first one it returns
        if not heads:
            return None
        return max(0.0, now - min(heads.values()) / 1000.0)
    finally:
        reader.close()


def alert_reason(depth: int, oldest_age_seconds: float | None,
                 new_writes_by_type: Mapping[str, int]) -> str | None:
    parts = []
    fresh = sorted((name, n) for name, n in new_writes_by_type.items() if n)
    if fresh:
        total = sum(n for _, n in fresh)
        names = ", ".join(f"{name}={n}" for name, n in fresh)
        parts.append(f"PAGE: {total} new payment dead letter(s) ({names})")
    if depth:
        waited = "" if oldest_age_seconds is None else f"; oldest waiting {oldest_age_seconds:.0f} s"
        parts.append(f"PAGE: {depth} payment(s) waiting in the dead-letter topic{waited}")
    return " | ".join(parts) if parts else None
