"""The dead-letter topic and record. The failure context comes first in the header list,
then the original headers (Kafka headers are an ordered multi-map; readers use lastHeader()
or a by-name lookup). No stack-trace header: it is optional, and it leaks."""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass
from datetime import UTC, datetime
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


SUFFIXES = {"dead_letter": "-dlt", "parking_lot": "-parking-lot"}


def topic_names(source_topic: str) -> DeadLetterTopics:
    return DeadLetterTopics(**{role: source_topic + sfx for role, sfx in SUFFIXES.items()})


def create_topics(admin: Any, source_topic: str, *, replication_factor: int = 1
                  ) -> DeadLetterTopics:
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import NewTopic

    names = topic_names(source_topic)
    described = admin.list_topics(timeout=10).topics
    source = described.get(source_topic)
    if source is None or source.error is not None or not source.partitions:
        raise ValueError(f"cannot read the partitions of {source_topic}")
    n = max(source.partitions) + 1
    requests = []
    for topic in (names.dead_letter, names.parking_lot):
        have = described.get(topic)
        if have is not None and have.error is None:
            if max(have.partitions) + 1 < n:
                raise ValueError(f"{topic} has fewer partitions than {source_topic}")
        else:
            requests.append(NewTopic(topic, num_partitions=n,
                                     replication_factor=replication_factor))
    if requests:
        for topic, future in admin.create_topics(requests, request_timeout=15).items():
            try:
                future.result()
            except KafkaException as exc:
                if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                    raise ValueError(f"creating {topic}: {exc}") from exc
    return names


def digest(value: bytes | None) -> str:
    return hashlib.sha256(value if value is not None else b"").hexdigest()


def _name(cls: type) -> bytes:
    return (cls.__module__ + "." + cls.__qualname__).encode()


def _last_link(error: BaseException) -> BaseException:
    visited: set[int] = set()
    while id(error) not in visited:
        visited.add(id(error))
        following = error.__cause__ if error.__cause__ is not None else error.__context__
        if following is None:
            break
        error = following
    return error


def _stamp(epoch: float) -> bytes:
    moment = datetime.fromtimestamp(epoch, UTC)
    return f"{moment:%Y-%m-%dT%H:%M:%S}.{moment.microsecond // 1000:03d}Z".encode()


def publish_dead_letter(producer: Any, msg: Any, failure: Failure, *, topic: str,
                        group_id: str, service: str, timeout_seconds: float) -> None:
    from confluent_kafka import KafkaException

    ts_type, ts = msg.timestamp()
    err = failure.error
    context = [
        (EXCEPTION_FQCN, _name(type(err))),
        (EXCEPTION_CAUSE_FQCN, _name(type(_last_link(err)))),
        (EXCEPTION_MESSAGE, str(err)[:1000].encode()),
        (ORIGINAL_TOPIC, msg.topic().encode()),
        (ORIGINAL_PARTITION, struct.pack(">i", msg.partition())),
        (ORIGINAL_OFFSET, struct.pack(">q", msg.offset())),
        (ORIGINAL_TIMESTAMP, struct.pack(">q", ts)),
        (ORIGINAL_TIMESTAMP_TYPE, b"LogAppendTime" if ts_type == 2 else b"CreateTime"),
        (ORIGINAL_CONSUMER_GROUP, group_id.encode()),
        (SERVICE, service.encode()),
        (ATTEMPTS, str(failure.attempts).encode()),
        (FIRST_FAILURE_AT, _stamp(failure.first_failure_at)),
        (LAST_FAILURE_AT, _stamp(failure.last_failure_at)),
    ]
    originals = [(k, v) for k, v in (msg.headers() or []) if not k.startswith(("kafka_dlt-",
                                                                              "x-dlt-"))]
    result: list[Any] = []
    try:
        producer.produce(topic, key=msg.key(), value=msg.value(), partition=msg.partition(),
                         headers=context + originals,
                         on_delivery=lambda e, _r: result.append(e))
        producer.flush(timeout_seconds)
    except (KafkaException, BufferError) as exc:
        raise DeadLetterWriteFailed(f"{topic}: {exc}") from exc
    if not result:
        raise DeadLetterWriteFailed(f"{topic}: not acknowledged within {timeout_seconds} s")
    if result[0] is not None:
        raise DeadLetterWriteFailed(f"{topic}: {result[0]}")
