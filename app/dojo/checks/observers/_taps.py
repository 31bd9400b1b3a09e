"""Taps around the Kafka clients a check hands to learner code: they forward every call
and record what the code did with them, on the check's clock.

    consumer = ConsumerTap(raw_consumer, clock)        # deliveries, commits, pauses, resumes
    producer = ProducerTap(raw_producer, clock)        # produce() calls and their acks
    run(consumer, producer, ...)                       # the learner's loop
    consumer.commits[-1].upto, producer.to(dead_letter_topic)

A tap can also hold acknowledgements back (`hold_acks`: a slow broker as the caller sees
it), audit each commit before it reaches the broker (`before_commit`), and SIGKILL its own
process right after the n-th commit or acknowledgement (in a child process only), writing
what happened to a log that survives the kill (`jsonl_log`).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Log = Callable[[dict[str, Any]], None]


def jsonl_log(path: str) -> Log:
    """An append-only log of dicts that survives kill -9 (one os.write per line).

    Args:
        path: the file (created if missing).

    Returns:
        A function that appends one dict as a JSON line.
    """
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def log(entry: dict[str, Any]) -> None:
        os.write(fd, (json.dumps(entry, default=str) + "\n").encode())

    return log


def read_jsonl(path: str) -> list[dict[str, Any]]:
    """The entries of a `jsonl_log` file ([] when there is none; a line cut by a kill is
    skipped)."""
    try:
        with open(path, encoding="utf-8") as handle:
            lines = handle.read().splitlines()
    except FileNotFoundError:
        return []
    out = []
    for line in lines:
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            pass  # the last line of a killed process may be cut
    return out


def die(reason: str, log: Log | None = None) -> None:
    """SIGKILL this process (no finally blocks, no flush, like kill -9), after writing the
    reason to `log` and stderr."""
    if log is not None:
        log({"ev": "kill", "why": reason})
    sys.stderr.write(f"dojo.checks: SIGKILL {reason}\n")
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)


@dataclass
class Delivery:
    partition: int
    offset: int
    at: float


@dataclass
class Commit:
    upto: dict[int, int]  # partition -> offset committed (the next one to read)
    at: float


class ConsumerTap:
    """Wraps the source consumer: records deliveries, commits (and offset stores), pauses and
    resumes, with the clock's time. `before_commit(upto)` runs before a commit reaches the
    broker (the audit); `kill_after_commit=n` SIGKILLs right after the n-th commit returned."""

    def __init__(self, consumer: Any, clock: Any, *,
                 before_commit: Callable[[dict[int, int]], None] | None = None,
                 kill_after_commit: int | None = None,
                 log: Log | None = None) -> None:
        self._consumer = consumer
        self._clock = clock
        self._before_commit = before_commit
        self._kill_after_commit = kill_after_commit
        self._log = log
        self.polls: list[float] = []
        self.delivered: list[Delivery] = []
        self.commits: list[Commit] = []
        self.pauses: list[tuple[float, list[int]]] = []
        self.resumes: list[tuple[float, list[int]]] = []
        self._position: dict[int, int] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._consumer, name)

    def _seen(self, msg: Any) -> None:
        if msg is None or msg.error():
            return
        delivery = Delivery(msg.partition(), msg.offset(), self._clock.monotonic())
        self.delivered.append(delivery)
        self._position[msg.partition()] = msg.offset() + 1
        if self._log is not None:
            self._log({"ev": "poll", "p": msg.partition(), "o": msg.offset()})

    def poll(self, *args: Any, **kwargs: Any) -> Any:
        self.polls.append(self._clock.monotonic())
        msg = self._consumer.poll(*args, **kwargs)
        self._seen(msg)
        return msg

    def consume(self, *args: Any, **kwargs: Any) -> list[Any]:
        self.polls.append(self._clock.monotonic())
        msgs = self._consumer.consume(*args, **kwargs)
        for msg in msgs:
            self._seen(msg)
        return msgs

    def _upto(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[int, int]:
        message = kwargs.get("message")
        offsets = kwargs.get("offsets")
        if args:
            if isinstance(args[0], list):
                offsets = args[0]
            elif args[0] is not None:
                message = args[0]
        if message is not None:
            return {message.partition(): message.offset() + 1}
        if offsets is not None:
            return {tp.partition: tp.offset for tp in offsets if tp.offset >= 0}
        return dict(self._position)  # commit() alone: every delivered position

    def _commit_point(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        upto = self._upto(args, kwargs)
        if self._before_commit is not None:
            self._before_commit(upto)
        result = getattr(self._consumer, method)(*args, **kwargs)
        self.commits.append(Commit(upto, self._clock.monotonic()))
        if self._log is not None:
            self._log({"ev": method, "upto": {str(k): v for k, v in upto.items()}})
        if self._kill_after_commit is not None and len(self.commits) >= self._kill_after_commit:
            die(f"right after offset commit #{len(self.commits)} returned", self._log)
        return result

    def commit(self, *args: Any, **kwargs: Any) -> Any:
        return self._commit_point("commit", args, kwargs)

    def store_offsets(self, *args: Any, **kwargs: Any) -> Any:
        return self._commit_point("store_offsets", args, kwargs)

    def pause(self, partitions: Any) -> Any:
        self.pauses.append((self._clock.monotonic(), [tp.partition for tp in partitions]))
        return self._consumer.pause(partitions)

    def resume(self, partitions: Any) -> Any:
        self.resumes.append((self._clock.monotonic(), [tp.partition for tp in partitions]))
        return self._consumer.resume(partitions)


@dataclass
class Produced:
    topic: str
    partition: int | None  # as asked (None: the partitioner chooses)
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]]
    at: float
    acked_at: float | None = None
    error: str | None = None
    acked_partition: int | None = None
    acked_offset: int | None = None


_CALLBACK_POSITION = 4  # produce(topic, value, key, partition, on_delivery, …)


class ProducerTap:
    """Wraps the DLT producer: records every produce() and the acknowledgement the caller was
    given (only once its delivery callback ran: that is when the caller can know). Optional
    `hold_acks` seconds delays every report (a slow broker); `kill_after_ack=n` SIGKILLs right
    after the n-th successful report reached the caller."""

    def __init__(self, producer: Any, clock: Any, *, hold_acks: float = 0.0,
                 kill_after_ack: int | None = None,
                 log: Log | None = None) -> None:
        self._producer = producer
        self._clock = clock
        self._hold = hold_acks
        self._kill_after_ack = kill_after_ack
        self._log = log
        self.produced: list[Produced] = []
        self._due: list[tuple[float, Callable[[], None]]] = []
        self._lock = threading.RLock()
        self._acks = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._producer, name)

    def __len__(self) -> int:
        return len(self._producer) + len(self._due)

    def produce(self, *args: Any, **kwargs: Any) -> Any:
        names = ("topic", "value", "key", "partition")
        given = dict(zip(names, args, strict=False))
        given.update({k: kwargs[k] for k in names if k in kwargs})
        callback = kwargs.pop("on_delivery", None) or kwargs.pop("callback", None)
        if callback is None and len(args) > _CALLBACK_POSITION:
            callback = args[_CALLBACK_POSITION]
            args = args[:_CALLBACK_POSITION] + (None,) + args[_CALLBACK_POSITION + 1:]
        partition = given.get("partition")
        record = Produced(given.get("topic", ""), None if partition in (None, -1) else
                          partition, given.get("key"), given.get("value"),
                          [(k, v) for k, v in (kwargs.get("headers") or [])],
                          self._clock.monotonic())
        with self._lock:
            self.produced.append(record)
        due = time.monotonic() + self._hold

        def report(err: Any, msg: Any) -> None:
            def hand_over() -> None:
                record.acked_at = self._clock.monotonic()
                record.error = None if err is None else str(err)
                if err is None and msg is not None:
                    record.acked_partition, record.acked_offset = msg.partition(), msg.offset()
                if callback is not None:
                    callback(err, msg)
                if err is None:
                    self._acks += 1
                    if self._log is not None:
                        self._log({"ev": "ack", "topic": record.topic,
                                   "p": record.acked_partition, "o": record.acked_offset,
                                   "value": (record.value or b"").hex()[:64]})
                    if self._kill_after_ack is not None and self._acks >= self._kill_after_ack:
                        die(f"right after DLT acknowledgement #{self._acks} reached the "
                            "consumer", self._log)
            if self._hold <= 0:
                hand_over()
            else:
                with self._lock:
                    self._due.append((due, hand_over))

        return self._producer.produce(*args, on_delivery=report, **kwargs)

    def _hand_over_due(self) -> int:
        now = time.monotonic()
        with self._lock:
            ready = [cb for when, cb in self._due if when <= now]
            self._due[:] = [(w, cb) for w, cb in self._due if w > now]
        for hand_over in ready:
            hand_over()
        return len(ready)

    def poll(self, timeout: float | None = None) -> int:
        served = self._producer.poll(0 if self._hold > 0 else timeout)
        if self._hold <= 0:
            return served
        deadline = time.monotonic() + (timeout if timeout and timeout > 0 else 0)
        while True:
            served += self._hand_over_due()
            if served or time.monotonic() >= deadline:
                return served
            time.sleep(0.005)
            self._producer.poll(0)

    def flush(self, timeout: float | None = None) -> int:
        limit = 1e9 if timeout is None or timeout < 0 else timeout
        deadline = time.monotonic() + limit
        while True:
            left = max(0.0, deadline - time.monotonic())
            self._producer.flush(min(left, 0.05) if self._hold > 0 else left)
            self._hand_over_due()
            pending = len(self)
            if not pending or time.monotonic() >= deadline:
                return pending
            time.sleep(0.005)

    # what the checks ask afterwards
    def to(self, topic: str) -> list[Produced]:
        return [p for p in self.produced if p.topic == topic]
