"""The `kafka` fixture: unique topics, and client configs tuned to the broker under test."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from dojo.checks.guard import TOPIC_PREFIX, check_kafka_cluster, check_topic_name
from dojo.runner import ledger
from dojo.services.manager import Endpoints


def _quiet_logger() -> Any:
    import logging

    logger = logging.getLogger("dojo.kafka.clients")
    if not logger.handlers:
        logger.addHandler(logging.NullHandler())
    logger.propagate = False
    return logger


@dataclass
class KafkaEnv:
    """What a check needs of Kafka: where it is, what it can do, and topics of its own."""

    endpoints: Endpoints
    created: list[str] = field(default_factory=list)
    # Tansu answers a fetch that found nothing new only after fetch.wait.max.ms (500 ms by
    # default), even when a record arrives meanwhile (Apache Kafka answers at once): a lab
    # whose scenes hand records back and forth between its consumers sets a shorter wait.
    tansu_fetch_wait_ms: int | None = None
    _clients: list[Any] = field(default_factory=list, repr=False)

    @property
    def bootstrap(self) -> str:
        return self.endpoints.kafka_bootstrap

    @property
    def backend(self) -> str:
        return self.endpoints.kafka_backend

    @property
    def capabilities(self) -> frozenset[str]:
        return self.endpoints.kafka_capabilities

    def has(self, capability: str) -> bool:
        return capability in self.capabilities

    # -- configs ---------------------------------------------------------------------------
    def admin_config(self, **overrides: Any) -> dict[str, Any]:
        return {"bootstrap.servers": self.bootstrap, **overrides}

    def producer_config(self, **overrides: Any) -> dict[str, Any]:
        """Keys land where a Java producer would put them (murmur2), acks from all replicas."""
        return {
            "bootstrap.servers": self.bootstrap,
            "partitioner": "murmur2_random",
            "acks": "all",
            "linger.ms": 5,
            **overrides,
        }

    def consumer_config(self, group_id: str | None = None, **overrides: Any) -> dict[str, Any]:
        """A consumer that reads from the start and commits only when told to."""
        config: dict[str, Any] = {
            "bootstrap.servers": self.bootstrap,
            "group.id": group_id or self.group_id(),
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
        if self.backend == "tansu":
            # Tansu hands a new group its partitions only after about session.timeout.ms / 2;
            # a short session keeps that to ~3 s. Apache Kafka here runs with a zero initial
            # rebalance delay, so its defaults are fine.
            config.update({"session.timeout.ms": 6000, "heartbeat.interval.ms": 500})
            if self.tansu_fetch_wait_ms is not None:
                config["fetch.wait.max.ms"] = self.tansu_fetch_wait_ms
        config.update(overrides)
        return config

    def group_id(self, hint: str = "") -> str:
        return f"{TOPIC_PREFIX}{hint + '.' if hint else ''}g.{uuid.uuid4().hex[:8]}"

    # -- clients ---------------------------------------------------------------------------
    def admin(self, **overrides: Any) -> Any:
        from confluent_kafka.admin import AdminClient

        return AdminClient(self.admin_config(logger=_quiet_logger(), **overrides))

    def producer(self, **overrides: Any) -> Any:
        from confluent_kafka import Producer

        producer = Producer(self.producer_config(**overrides))
        self._clients.append(producer)
        return producer

    def consumer(self, group_id: str | None = None, **overrides: Any) -> Any:
        from confluent_kafka import Consumer

        consumer = Consumer(self.consumer_config(group_id, **overrides))
        self._clients.append(consumer)
        return consumer

    # -- topics ----------------------------------------------------------------------------
    def topic(self, partitions: int = 1, hint: str = "", config: dict[str, str] | None = None,
              name: str | None = None) -> str:
        """Create a topic of this test's own (`dojo.<hint>.<hex>`), deleted at teardown."""
        from confluent_kafka.admin import NewTopic

        tag = "".join(ch if ch.isalnum() or ch in "-_" else "-" for ch in hint.lower())[:30]
        topic = name or f"{TOPIC_PREFIX}{tag + '.' if tag else ''}{uuid.uuid4().hex[:10]}"
        check_topic_name(topic)
        admin = self.admin()
        if not self.created:
            check_kafka_cluster(self.endpoints, set(admin.list_topics(timeout=10).topics))
        ledger.record("topic", topic)  # before it exists, so a killed run leaks nothing
        futures = admin.create_topics(
            [NewTopic(topic, num_partitions=partitions, replication_factor=1,
                      config=config or {})],
            operation_timeout=15,
        )
        for future in futures.values():
            future.result(timeout=20)
        self.created.append(topic)
        self._wait_for_leaders(admin, topic, partitions)
        return topic

    def _wait_for_leaders(self, admin: Any, topic: str, partitions: int) -> None:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            meta = admin.list_topics(topic=topic, timeout=5).topics.get(topic)
            if meta is not None and meta.error is None and len(meta.partitions) == partitions and \
                    all(p.leader >= 0 for p in meta.partitions.values()):
                self.wait_until_served([topic], deadline)
                return
            time.sleep(0.05)
        raise TimeoutError(f"topic {topic} has no leaders for all {partitions} partitions")

    def wait_until_served(self, topics: list[str], deadline: float) -> None:
        """Until every partition of `topics` answers a ListOffsets request: on Apache Kafka a
        leader named in the metadata can still refuse it for a moment (NOT_LEADER_FOR_PARTITION),
        and the learner's first get_watermark_offsets() must not meet that."""
        from confluent_kafka import Consumer, KafkaException, TopicPartition

        probe = Consumer(self.consumer_config(self.group_id("probe")))
        try:
            for topic in topics:
                meta = probe.list_topics(topic, timeout=5).topics[topic]
                for pid in meta.partitions:
                    while True:
                        try:
                            probe.get_watermark_offsets(TopicPartition(topic, pid), timeout=5)
                            break
                        except KafkaException:
                            if time.monotonic() >= deadline:
                                raise
                            time.sleep(0.05)
        finally:
            probe.close()

    def high_watermarks(self, topic: str) -> dict[int, int]:
        """Partition → high watermark (the offset the next record will get)."""
        from confluent_kafka import Consumer, TopicPartition

        probe = Consumer(self.consumer_config(self.group_id("probe")))
        try:
            meta = probe.list_topics(topic, timeout=10).topics[topic]
            marks = {}
            for pid in meta.partitions:
                _, high = probe.get_watermark_offsets(TopicPartition(topic, pid), timeout=10)
                marks[pid] = high
            return marks
        finally:
            probe.close()

    def close(self) -> None:
        for client in self._clients:
            try:
                if hasattr(client, "close"):
                    client.close()
                else:
                    client.flush(1)
            except Exception:
                pass
        self._clients.clear()
        if not self.created:
            return
        for topic in self.created:
            check_topic_name(topic)
        admin = self.admin()  # held while waiting: a destroyed client's futures just fail
        try:
            futures = admin.delete_topics(list(self.created), operation_timeout=10)
            for future in futures.values():
                try:
                    future.result(timeout=15)
                except Exception:
                    pass  # best effort: memory storage vanishes with the broker anyway
        finally:
            self.created.clear()
