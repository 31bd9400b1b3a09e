"""The dead-letter topic: its name, its partitions, and the record written to it.

The record is the one Spring Kafka's DeadLetterPublishingRecoverer writes, so a Java tool
reads it unchanged: the original key and value bytes, the original headers, and the
`kafka_dlt-*` headers (numbers as big-endian binary, text as UTF-8), plus `x-dlt-*` headers
(UTF-8 text) for what Spring leaves to a headers function. The README has the table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Spring Kafka's KafkaHeaders.DLT_* names.
ORIGINAL_TOPIC = "kafka_dlt-original-topic"  # UTF-8
ORIGINAL_PARTITION = "kafka_dlt-original-partition"  # 4-byte big-endian int
ORIGINAL_OFFSET = "kafka_dlt-original-offset"  # 8-byte big-endian long
ORIGINAL_TIMESTAMP = "kafka_dlt-original-timestamp"  # 8-byte big-endian long, epoch ms
ORIGINAL_TIMESTAMP_TYPE = "kafka_dlt-original-timestamp-type"  # "CreateTime" | "LogAppendTime"
ORIGINAL_CONSUMER_GROUP = "kafka_dlt-original-consumer-group"  # UTF-8
EXCEPTION_FQCN = "kafka_dlt-exception-fqcn"  # UTF-8, module.ClassName
EXCEPTION_CAUSE_FQCN = "kafka_dlt-exception-cause-fqcn"  # UTF-8, the root cause's class
EXCEPTION_MESSAGE = "kafka_dlt-exception-message"  # UTF-8
EXCEPTION_STACKTRACE = "kafka_dlt-exception-stacktrace"  # UTF-8 (optional)
# This lab's own, UTF-8 text.
ATTEMPTS = "x-dlt-attempts"  # decimal
FIRST_FAILURE_AT = "x-dlt-first-failure-at"  # ISO-8601 UTC, e.g. 2025-01-16T11:33:00.752Z
LAST_FAILURE_AT = "x-dlt-last-failure-at"
SERVICE = "x-dlt-service"
REPLAY_COUNT = "x-replay-count"  # decimal; set by replay.py, kept by the consumer
FAILURE_HEADER_PREFIXES = ("kafka_dlt-", "x-dlt-")


@dataclass(frozen=True)
class DeadLetterTopics:
    dead_letter: str
    parking_lot: str


@dataclass(frozen=True)
class Failure:
    """Why a record is dead-lettered, and how hard the consumer tried."""

    error: BaseException
    attempts: int
    first_failure_at: float  # clock.now() of the first failed attempt
    last_failure_at: float


class DeadLetterWriteFailed(Exception):
    """The broker did not acknowledge the dead-letter record: do not commit the original."""


def topic_names(source_topic: str) -> DeadLetterTopics:
    """The dead-letter and parking-lot topics of `source_topic`, named by one explicit scheme:
    the source's name plus a suffix, the same answer every time."""
    raise NotImplementedError(
        "topic_names: return DeadLetterTopics(f'{source_topic}-dlt', "
        "f'{source_topic}-parking-lot') (Spring Kafka 3.3's suffix; never guess a "
        "framework default)")


def create_topics(admin: Any, source_topic: str, *, replication_factor: int = 1
                  ) -> DeadLetterTopics:
    """Create the DLT and the parking lot with as many partitions as the source topic (a
    dead-letter record keeps its partition number); keep topics that exist already.

    Args:
        admin: a confluent_kafka.admin.AdminClient.
    """
    raise NotImplementedError(
        "create_topics: read the source's partition count from "
        "len(admin.list_topics(timeout=10).topics[source_topic].partitions), then "
        "admin.create_topics([NewTopic(name, num_partitions=n, replication_factor=...)]) for "
        "each name of topic_names() that does not exist yet, and wait on the futures")


def publish_dead_letter(producer: Any, msg: Any, failure: Failure, *, topic: str,
                        group_id: str, service: str, timeout_seconds: float) -> None:
    """Write `msg` to partition msg.partition() of `topic` — its value and key byte for byte,
    its headers, and the failure headers of the README — and return only once the broker
    acknowledged it.

    Raises:
        DeadLetterWriteFailed: the write failed or was not acknowledged in time.
    """
    raise NotImplementedError(
        "publish_dead_letter: producer.produce(topic, value=msg.value(), key=msg.key(), "
        "partition=msg.partition(), headers=original + failure headers, on_delivery=...); "
        "producer.flush(timeout_seconds); raise DeadLetterWriteFailed unless the callback "
        "ran with err None")
