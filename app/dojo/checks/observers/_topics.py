"""Reading Kafka from the outside: every record of a topic, and a group's committed offsets.

Why fence records: on Tansu the high watermark can lag the records actually readable after a
multi-record batch, so "read up to the end offset" can stop early. A fence record appended
to each partition and read back proves the read complete on every broker. Fencing writes to
the topic, so use it only on a topic no code under test reads afterwards (an output topic);
read an input topic with `fence=False` (it stops when `expect` records came, or when nothing
new arrived for a while).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

FENCE_HEADER = "dojo-fence"


@dataclass(frozen=True)
class Record:
    """One record as a reader got it."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    timestamp_ms: int

    def header(self, name: str) -> bytes | None:
        """The last value of header `name` (None when absent or null)."""
        values = [v for k, v in self.headers if k == name]
        return values[-1] if values else None

    def text(self, name: str) -> str | None:
        """Header `name` decoded as UTF-8 (None when absent)."""
        value = self.header(name)
        return None if value is None else value.decode("utf-8", "replace")

    def names(self) -> list[str]:
        """The header names, in order (repeats kept)."""
        return [k for k, _ in self.headers]

    @property
    def key_text(self) -> str | None:
        """The key decoded as UTF-8 (None for a null key)."""
        return None if self.key is None else self.key.decode("utf-8", "replace")

    @property
    def at(self) -> str:
        """`p<partition>@<offset>`, how messages name a record."""
        return f"p{self.partition}@{self.offset}"


def consumer_settings(kafka: Any, group_id: str | None = None) -> dict[str, Any]:
    """A consumer config from the `kafka` fixture or from a config dict (in a child process
    there is no fixture), with auto-commit off and reading from the start."""
    base = dict(kafka.consumer_config() if hasattr(kafka, "consumer_config") else kafka)
    base.update({"group.id": group_id or f"dojo.reader.{uuid.uuid4().hex}",
                 "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    return base


def _producer(kafka: Any) -> Any:
    from confluent_kafka import Producer

    if hasattr(kafka, "producer_config"):
        return Producer(kafka.producer_config(**{"linger.ms": 0}))
    keep = {k: v for k, v in dict(kafka).items()
            if k == "bootstrap.servers" or k.startswith(("security.", "sasl.", "ssl."))}
    return Producer({**keep, "linger.ms": 0})


def partition_count(kafka: Any, topic: str) -> int:
    """How many partitions `topic` has (0 when it does not exist)."""
    from confluent_kafka import Consumer

    probe = Consumer(consumer_settings(kafka))
    try:
        meta = probe.list_topics(topic, timeout=10).topics.get(topic)
        return len(meta.partitions) if meta is not None and meta.error is None else 0
    finally:
        probe.close()


def read_topic(kafka: Any, topic: str, partitions: int | None = None, *, fence: bool = True,
               expect: int | None = None, start: Mapping[int, int] | None = None,
               settle: float = 0.3, timeout: float = 15.0) -> list[Record]:
    """Every record of `topic`, read with assign() (no group, so no join delay).

    Args:
        kafka: the `kafka` fixture (or a consumer config dict).
        topic: the topic.
        partitions: its partition count (looked up when None).
        fence: append a fence record to each partition and read until all come back: the
            read is complete on any broker. The fences are left out of the result, but stay
            in the topic: only for topics no code under test reads afterwards.
        expect: without a fence: stop `settle` s after this many records arrived (more that
            arrive in that time still show); None: stop once nothing new came for
            max(settle, 0.6) s.
        start: {partition: first offset} (default 0 everywhere).
        settle: see `expect`.
        timeout: give up after this many seconds (with a fence: RuntimeError).

    Returns:
        The records, ordered by partition and offset.

    Raises:
        RuntimeError: with `fence`, the fence records could not be written or did not come
            back within `timeout`.
    """
    from confluent_kafka import Consumer, TopicPartition

    count = partitions if partitions is not None else partition_count(kafka, topic)
    fence_id = uuid.uuid4().hex.encode()
    if fence:
        fencer = _producer(kafka)
        for partition in range(count):
            fencer.produce(topic, value=b"", partition=partition,
                           headers=[(FENCE_HEADER, fence_id)])
        if fencer.flush(10):
            raise RuntimeError(f"the check could not write its fence records to {topic}")
    consumer = Consumer(consumer_settings(kafka))
    out: list[Record] = []
    fenced: set[int] = set()
    try:
        consumer.assign([TopicPartition(topic, p, (start or {}).get(p, 0))
                         for p in range(count)])
        began = last = time.monotonic()
        idle_limit = max(settle, 0.6)  # the first fetch of an assignment takes ~0.1 s
        while time.monotonic() - began < timeout:
            msg: Any = consumer.poll(0.05)  # confluent-kafka's stubs make every field Optional
            now = time.monotonic()
            if msg is not None and not msg.error():
                headers = tuple((str(k), v) for k, v in (msg.headers() or ()))
                marks = [v for k, v in headers if k == FENCE_HEADER]
                if marks:
                    if marks[0] == fence_id:
                        fenced.add(int(msg.partition()))
                        if len(fenced) == count:
                            break
                    continue
                out.append(Record(msg.topic(), msg.partition(), msg.offset(), msg.key(),
                                  msg.value(), headers, msg.timestamp()[1]))
                last = now
                continue
            if fence:
                continue
            if expect is not None and len(out) >= expect and now - last >= settle:
                break
            if expect is None and now - last >= idle_limit:
                break
    finally:
        consumer.close()
    if fence and len(fenced) < count:
        raise RuntimeError(f"the check's fence records did not come back from {topic} "
                           f"within {timeout} s")
    return sorted(out, key=lambda r: (r.partition, r.offset))


def committed_offsets(kafka: Any, group_id: str, topic: str,
                      partitions: int) -> dict[int, int]:
    """A group's committed offset per partition, as the broker has it now.

    Args:
        kafka: the `kafka` fixture (or a consumer config dict).
        group_id: the consumer group.
        topic: the topic.
        partitions: its partition count.

    Returns:
        {partition: the next offset the group will read}; -1 where nothing is committed.
    """
    from confluent_kafka import Consumer, TopicPartition

    probe = Consumer(consumer_settings(kafka, group_id))
    try:
        found = probe.committed([TopicPartition(topic, p) for p in range(partitions)],
                                timeout=10)
        return {tp.partition: (tp.offset if tp.offset >= 0 else -1) for tp in found}
    finally:
        probe.close()


def offsets_text(offsets: Mapping[int, int]) -> str:
    """`{p0: 3, p1: none}`: offsets per partition, -1 shown as none."""
    return "{" + ", ".join(f"p{p}: {o if o >= 0 else 'none'}"
                           for p, o in sorted(offsets.items())) + "}"


class CommitProbe:
    """Watches a group's committed offsets from a background thread, so that asking (from a
    `should_stop()` the learner's loop calls) never blocks the code under test.

    Args:
        kafka: the `kafka` fixture (or a consumer config dict).
        group_id: the consumer group.
        topic: the topic.
        partitions: its partition count.
        every: seconds between two fetches.
    """

    def __init__(self, kafka: Any, group_id: str, topic: str, partitions: int,
                 every: float = 0.03) -> None:
        from confluent_kafka import Consumer

        self.topic, self.partitions, self.every = topic, partitions, every
        self._consumer = Consumer(consumer_settings(kafka, group_id))
        self.latest: dict[int, int] = {p: -1 for p in range(partitions)}
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="dojo-probe")
        self._thread.start()

    def _fetch(self) -> None:
        from confluent_kafka import TopicPartition

        try:
            with self._lock:
                found = self._consumer.committed(
                    [TopicPartition(self.topic, p) for p in range(self.partitions)], timeout=5)
            self.latest = {tp.partition: (tp.offset if tp.offset >= 0 else -1) for tp in found}
        except Exception:
            pass  # a slow or failed answer: keep the last one

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._fetch()
            self._stop.wait(self.every)

    def read(self, force: bool = False) -> dict[int, int]:
        """The latest committed offsets; `force` fetches them now first."""
        if force:
            self._fetch()
        return dict(self.latest)

    def close(self) -> None:
        """Stop watching."""
        self._stop.set()
        self._thread.join(6)
        with self._lock:
            self._consumer.close()


def by_partition(records: Sequence[Record]) -> dict[int, list[Record]]:
    """Records grouped by partition, in the order given."""
    out: dict[int, list[Record]] = {}
    for record in records:
        out.setdefault(record.partition, []).append(record)
    return out
