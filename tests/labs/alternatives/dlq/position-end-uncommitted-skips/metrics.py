"""What keeps the DLT from becoming a silent graveyard: a counter of dead-letter writes by
exception type, the DLT's depth and the age of its oldest waiting record (both read from the
broker), and the alert condition of this money flow.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Mapping
from typing import Any

from confluent_kafka import OFFSET_INVALID, Consumer, TopicPartition


class DeadLetterMetrics:
    """Counts dead-letter writes the broker acknowledged, by exception class name."""

    def __init__(self) -> None:
        self._counts: Counter[str] = Counter()
        self._lock = threading.Lock()

    def dead_lettered(self, exception_type: str) -> None:
        """Called by the consumer once per acknowledged DLT write (never before the ack)."""
        with self._lock:
            self._counts[exception_type] += 1

    def counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)


def _waiting(consumer: Any, topic: str, timeout: float = 10.0
             ) -> list[tuple[TopicPartition, int, int]]:
    """(partition, first waiting offset, end offset) for every partition of `topic`: waiting
    starts at the group's committed offset, or at the low watermark when there is none."""
    meta = consumer.list_topics(topic, timeout=timeout).topics[topic]
    parts = [TopicPartition(topic, p) for p in sorted(meta.partitions)]
    committed = {tp.partition: tp.offset for tp in consumer.committed(parts, timeout=timeout)}
    out = []
    for tp in parts:
        low, high = consumer.get_watermark_offsets(tp, timeout=timeout)
        start = committed.get(tp.partition, OFFSET_INVALID)
        start = low if start < 0 else max(start, low)
        out.append((tp, start, high))
    return out


def _probe(consumer_config: dict[str, Any], group_id: str) -> Any:
    # Reading committed offsets does not join the group: this never disturbs the replayer.
    return Consumer({**consumer_config, "group.id": group_id, "enable.auto.commit": False})


def dead_letter_depth(consumer_config: dict[str, Any], topic: str, group_id: str) -> int:
    """Records in `topic` that `group_id` (the job that handles the DLT) has not handled:
    end offset − committed offset per partition (− low watermark where nothing is committed).
    """
    consumer = _probe(consumer_config, group_id)
    try:
        return sum(max(0, high - start) for _, start, high in _waiting(consumer, topic))
    finally:
        consumer.close()


def oldest_dead_letter_age_seconds(consumer_config: dict[str, Any], topic: str, group_id: str,
                                   *, now: float) -> float | None:
    """How long the oldest record `group_id` has not handled has been in `topic`: `now` −
    its timestamp (when it was dead-lettered). None when nothing waits."""
    consumer = _probe(consumer_config, group_id)
    try:
        wanted = {tp.partition: start for tp, start, high in _waiting(consumer, topic)
                  if start < high}
        if not wanted:
            return None
        # all waiting partitions at once; keep the first record seen of each
        consumer.assign([TopicPartition(topic, p, o) for p, o in wanted.items()])
        firsts: dict[int, int] = {}
        deadline = time.monotonic() + 10
        while len(firsts) < len(wanted) and time.monotonic() < deadline:
            msg = consumer.poll(0.1)
            if msg is None or msg.error() or msg.partition() in firsts:
                continue
            firsts[msg.partition()] = msg.timestamp()[1]
            consumer.pause([TopicPartition(topic, msg.partition())])
        if not firsts:
            return None
        return max(0.0, now - min(firsts.values()) / 1000)
    finally:
        consumer.close()


def alert_reason(depth: int, oldest_age_seconds: float | None,
                 new_writes_by_type: Mapping[str, int]) -> str | None:
    """The page to send, or None. Payments are money: one dead letter is one too many, so any
    new write and anything still waiting alerts; an old one says it is being ignored."""
    reasons = []
    written = {kind: n for kind, n in new_writes_by_type.items() if n > 0}
    if written:
        listed = ", ".join(f"{n} × {kind}" for kind, n in sorted(written.items()))
        reasons.append(f"new dead letters on the payments flow: {listed}")
    if depth > 0:
        age = "" if oldest_age_seconds is None else \
            f", the oldest for {oldest_age_seconds / 60:.0f} min"
        reasons.append(f"{depth} payment event(s) wait in the DLT{age}")
    return "; ".join(reasons) or None
