"""The measured gaps of the embedded Tansu broker, pinned, with Apache Kafka shown correct.

Each test asserts the gap on Tansu (so we notice when a new Tansu closes it, and the capability
list in dojo.services.kafka_common can grow) and the real behaviour on Apache Kafka.
"""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import ConfigResource, NewPartitions

from tests.kafka.conftest import consume, produce_all


def test_read_committed_hides_aborted_records_only_on_apache(kafka):
    topic = kafka.topic(1, hint="txn")
    txn_id = f"dojo.tx.{uuid.uuid4().hex}"
    producer = Producer(kafka.producer_config(**{"transactional.id": txn_id}))
    producer.init_transactions(15)
    producer.begin_transaction()
    producer.produce(topic, value=b"aborted")
    producer.flush(10)
    producer.abort_transaction(15)
    producer.begin_transaction()
    producer.produce(topic, value=b"committed")
    producer.commit_transaction(15)

    consumer = Consumer(kafka.consumer_config(**{"isolation.level": "read_committed"}))
    consumer.assign([TopicPartition(topic, 0, 0)])
    seen: list[bytes] = []
    deadline = time.monotonic() + 10
    while b"committed" not in seen and time.monotonic() < deadline:
        msg = consumer.poll(0.2)
        if msg is not None and not msg.error():
            seen.append(msg.value())
    consumer.close()
    assert b"committed" in seen
    if kafka.backend == "tansu":
        assert b"aborted" in seen, "Tansu now hides aborted records: add 'transactions'"
    else:
        assert b"aborted" not in seen, f"read_committed returned an aborted record: {seen}"
    assert kafka.has("transactions") == (b"aborted" not in seen)


def test_create_partitions_is_unsupported_on_tansu_and_works_on_apache(kafka):
    topic = kafka.topic(1, hint="grow")
    admin = kafka.admin()  # keep a reference: futures of a destroyed client fail
    futures = admin.create_partitions([NewPartitions(topic, 3)])
    if kafka.backend == "tansu":
        with pytest.raises(KafkaException, match="(?i)not supported|unsupported"):
            for future in futures.values():
                future.result(10)
    else:
        for future in futures.values():
            future.result(15)
        meta = admin.list_topics(topic, timeout=10).topics[topic]
        assert len(meta.partitions) == 3
    assert kafka.has("create_partitions") == (kafka.backend != "tansu")


def test_delete_records_fails_on_tansu_and_moves_the_low_watermark_on_apache(kafka):
    # On Tansu the request panics a broker worker thread ("not yet implemented" in its
    # dynostore, seen in the broker log); the broker keeps serving other connections.
    topic = kafka.topic(1, hint="trim")
    produce_all(kafka.producer(), topic, [(None, b"x")] * 3)
    admin = kafka.admin()
    futures = admin.delete_records([TopicPartition(topic, 0, 2)], request_timeout=10)
    if kafka.backend == "tansu":
        with pytest.raises(KafkaException):
            for future in futures.values():
                future.result(15)
    else:
        for future in futures.values():
            future.result(15)
        probe = kafka.consumer()
        low, high = probe.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
        assert (low, high) == (2, 3)


def test_describe_configs_is_empty_on_tansu_and_complete_on_apache(kafka):
    topic = kafka.topic(1, hint="cfg")
    admin = kafka.admin()
    [future] = admin.describe_configs([ConfigResource("topic", topic)]).values()
    entries = future.result(15)
    if kafka.backend == "tansu":
        assert len(entries) == 0
    else:
        assert "retention.ms" in entries and "cleanup.policy" in entries


def test_a_new_consumer_group_waits_seconds_on_tansu_not_on_apache(kafka):
    """Tansu hands out partitions after about session.timeout.ms / 2; measured in the bench."""
    topic = kafka.topic(1, hint="join")
    produce_all(kafka.producer(), topic, [(None, b"hello")])
    consumer = kafka.consumer()
    started = time.monotonic()
    consumer.subscribe([topic])
    [msg] = consume(consumer, 1, timeout=30)
    waited = time.monotonic() - started
    consumer.close()
    assert msg.value() == b"hello"
    if kafka.backend == "tansu":
        assert waited >= 1.5, f"Tansu delivered a new group's first record in {waited:.2f} s"
    else:
        assert waited < 2.5, f"Apache Kafka took {waited:.2f} s for a new group's first record"


def test_producing_to_a_missing_topic_creates_it_on_both_backends(kafka):
    topic = f"dojo.auto.{uuid.uuid4().hex[:10]}"
    kafka.created.append(topic)  # deleted at teardown like any other test topic
    reports = produce_all(kafka.producer(), topic, [(None, b"x")])
    assert reports[0].topic() == topic
    assert kafka.has("auto_create_topics")


def test_the_high_watermark_after_a_multi_record_batch_is_wrong_on_tansu(kafka):
    """Tansu answers ListOffsets(latest) with the last batch's base offset + 1."""
    topic = kafka.topic(1, hint="hwm")
    produce_all(kafka.producer(**{"linger.ms": 50}), topic, [(None, b"x")] * 12)
    high = kafka.high_watermarks(topic)[0]
    if kafka.backend == "tansu":
        assert high < 12, "Tansu's high watermark is right now: add 'exact_high_watermark'"
    else:
        assert high == 12
    assert kafka.has("exact_high_watermark") == (high == 12)
