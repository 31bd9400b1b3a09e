"""Replay: dead-lettered records back to their original topic, once, at a limited rate, with
a cap that parks repeat offenders in the parking lot, and without overtaking within a key.

A replay job is its group id and its filters. The group's committed offsets say how far the
job got, so running it again sends nothing twice.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from payments import SYSTEM_CLOCK, Clock


@dataclass(frozen=True)
class ReplayReport:
    replayed: int  # re-published to their original topic
    parked: int  # moved to the parking lot (cap reached, or behind a parked record of the key)
    skipped: int  # left alone: filtered out (or behind a filtered-out record of the key)


def replay(consumer_config: dict[str, Any], producer: Any, *, dead_letter_topic: str,
           parking_lot_topic: str, group_id: str, max_replays: int = 3,
           rate_per_second: float = 50.0, exception_types: Collection[str] | None = None,
           failed_after: float | None = None, failed_before: float | None = None,
           clock: Clock = SYSTEM_CLOCK, ack_timeout_seconds: float = 10.0,
           timeout_seconds: float = 60.0) -> ReplayReport:
    """Replay the DLT records that `group_id` has not handled yet, up to the DLT's end as it
    was when the replay started (the README's stage replay has the rules).

    Args:
        consumer_config: bootstrap and tuning for the DLT consumer you build; set its
            group.id to `group_id`.
        producer: a confluent-kafka Producer for the re-published and parked records.
        exception_types: replay only records whose kafka_dlt-exception-fqcn class name is in
            it (None: all; an empty collection: none, every record is skipped).
        failed_after, failed_before: replay only records whose DLT timestamp (seconds since
            the epoch) is in [failed_after, failed_before).
        clock: for the rate limit (clock.sleep).
    """
    raise NotImplementedError(
        "replay: Consumer({**consumer_config, 'group.id': group_id, 'enable.auto.commit': "
        "False}); assign the DLT partitions at their committed offsets; for each record up "
        "to the end offsets read at the start: re-publish (or park, or skip), wait for the "
        "acknowledgement, then commit its offset")
