"""What keeps the DLT from becoming a silent graveyard: a counter of dead-letter writes by
exception type, the DLT's depth and the age of its oldest waiting record (both read from the
broker), and the alert condition of this money flow.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class DeadLetterMetrics:
    """Counts dead-letter writes the broker acknowledged, by exception class name."""

    def __init__(self) -> None:
        raise NotImplementedError("DeadLetterMetrics: keep a collections.Counter (and a "
                                  "threading.Lock around it)")

    def dead_lettered(self, exception_type: str) -> None:
        """Called by the consumer once per acknowledged DLT write (never before the ack)."""
        raise NotImplementedError("dead_lettered: add one to the count of exception_type")

    def counts(self) -> dict[str, int]:
        """{exception class name: acknowledged DLT writes}."""
        raise NotImplementedError("counts: return a copy of the counter as a dict")


def dead_letter_depth(consumer_config: dict[str, Any], topic: str, group_id: str) -> int:
    """Records in `topic` that `group_id` (the job that handles the DLT) has not handled:
    end offset − committed offset per partition (− low watermark where nothing is committed).
    """
    raise NotImplementedError(
        "dead_letter_depth: a Consumer({**consumer_config, 'group.id': group_id}) (it never "
        "joins the group), consumer.committed([TopicPartition(topic, p) ...]) and "
        "get_watermark_offsets() per partition; sum high − start")


def oldest_dead_letter_age_seconds(consumer_config: dict[str, Any], topic: str, group_id: str,
                                   *, now: float) -> float | None:
    """How long the oldest record `group_id` has not handled has been in `topic`: `now` −
    its timestamp (when it was dead-lettered). None when nothing waits."""
    raise NotImplementedError(
        "oldest_dead_letter_age_seconds: for each partition with something waiting, assign "
        "it at the first waiting offset, poll that record, keep the smallest "
        "msg.timestamp()[1] / 1000; return now − that, or None")


def alert_reason(depth: int, oldest_age_seconds: float | None,
                 new_writes_by_type: Mapping[str, int]) -> str | None:
    """The page to send, or None when all is quiet. This is a money flow: any new dead
    letter (name its exception types) and anything waiting (say how many) alerts."""
    raise NotImplementedError(
        "alert_reason: None when new_writes_by_type has no positive count and depth is 0; "
        "otherwise a sentence naming the exception types and the depth")
