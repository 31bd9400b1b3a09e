"""Tools the DLQ checks share with their crash child process (so: no pytest here).

A clock whose sleeps are instant, a scripted payment gateway that records every call, taps
around the consumer and producer the learner's code is given (they record what it polled,
committed, paused, produced and got acknowledged, and can kill the process at an exact
point), test events, and small Kafka readers. Everything is observed from the outside,
through the objects the lab's API passes in.
"""

from __future__ import annotations

import json
import os
import signal
import struct
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

# -- time ------------------------------------------------------------------------------------


class HybridClock:
    """Real time plus every second slept: sleep() returns at once but moves the clock on, so
    a 4 s backoff costs nothing and still reads as 4 s. Sleeps are recorded."""

    def __init__(self) -> None:
        self._skipped = 0.0
        self._lock = threading.Lock()
        self.sleeps: list[tuple[float, float]] = []  # (monotonic at the start, seconds)

    def now(self) -> float:
        return time.time() + self._skipped

    def monotonic(self) -> float:
        return time.monotonic() + self._skipped

    def sleep(self, seconds: float) -> None:
        seconds = max(0.0, float(seconds))
        with self._lock:
            self.sleeps.append((self.monotonic(), seconds))
            self._skipped += seconds
        time.sleep(0.0005)  # let other threads run, as a real sleep would

    @property
    def skipped(self) -> float:
        return self._skipped


# -- events ----------------------------------------------------------------------------------

TRACEPARENT = "traceparent"
EVENT_TYPE = "event-type"


def traceparent() -> bytes:
    return f"00-{uuid.uuid4().hex}-{uuid.uuid4().hex[:16]}-01".encode()


@dataclass(frozen=True)
class Item:
    """One record the check will produce, and what it is."""

    label: str  # healthy | undecodable | invalid | business-rule | declined | transient…
    key: bytes | None
    value: bytes
    headers: tuple[tuple[str, bytes], ...]
    event_id: str | None = None  # for events that parse
    account: str | None = None
    cents: int = 0  # signed effect on the balance when applied
    partition: int | None = None  # None: the key picks it (murmur2)


def event_bytes(event_id: str, account: str, cents: int, kind: str = "deposit",
                currency: str = "EUR") -> bytes:
    return json.dumps({"event_id": event_id, "account": account, "kind": kind,
                       "amount_cents": cents, "currency": currency}).encode()


def _headers() -> tuple[tuple[str, bytes], ...]:
    return ((TRACEPARENT, traceparent()), (EVENT_TYPE, b"payment.v1"))


def healthy(account: str, cents: int = 1000, *, kind: str = "deposit", label: str = "healthy",
            partition: int | None = None) -> Item:
    event_id = str(uuid.uuid4())
    signed = cents if kind == "deposit" else -cents
    return Item(label, account.encode(), event_bytes(event_id, account, cents, kind),
                _headers(), event_id, account, signed, partition)


def undecodable(key: str | None = None, partition: int | None = None) -> Item:
    """Bytes that are not UTF-8 (and unique, so the check can recognise them anywhere)."""
    value = b"\xff\xfe\x00\x9c not json \xc3\x28 " + uuid.uuid4().hex.encode()
    return Item("undecodable", key.encode() if key else None, value, _headers(),
                partition=partition)


def invalid(key: str, partition: int | None = None) -> Item:
    """JSON whose amount is a string: InvalidEvent. The spacing, field order and the \\u00e9
    escape are unusual on purpose: parsing and re-serialising would change the bytes."""
    event_id = str(uuid.uuid4())
    value = ('{ "event_id" : "' + event_id + '",\n  "account":"' + key + '", "kind":"deposit",'
             '  "amount_cents":"12.50", "currency":"EUR", "note":"caf\\u00e9" }').encode()
    return Item("invalid", key.encode(), value, _headers(), event_id=None, account=key,
                partition=partition)


def business_rule(key: str, partition: int | None = None) -> Item:
    """A well-formed event in a currency the service does not support."""
    event_id = str(uuid.uuid4())
    return Item("business-rule", key.encode(),
                event_bytes(event_id, key, 500, currency="GBP"), _headers(),
                partition=partition)


def with_label(item: Item, label: str) -> Item:
    return Item(label, item.key, item.value, item.headers, item.event_id, item.account,
                item.cents, item.partition)


# -- the payment gateway ---------------------------------------------------------------------


@dataclass
class Call:
    what: str  # authorize | ping
    event_id: str | None
    at: float  # clock.monotonic()
    outcome: str  # ok | timeout | unavailable | declined | down


class ScriptedDownstream:
    """A gateway that answers from a script: `scripts[event_id]` lists the outcomes of that
    event's successive authorize() calls ("timeout", "unavailable", "declined", "ok"); past
    the list (or without one) it answers ok. `down_while(clock)` True makes every call fail
    with DownstreamUnavailable, ping() included: an outage for everyone.
    """

    def __init__(self, payments: Any, clock: Any, scripts: dict[str, list[str]] | None = None,
                 *, down_while: Callable[[], bool] | None = None,
                 on_call: Callable[[Call], None] | None = None) -> None:
        self.payments = payments
        self.clock = clock
        self.scripts = {k: list(v) for k, v in (scripts or {}).items()}
        self.down_while = down_while or (lambda: False)
        self.on_call = on_call
        self.calls: list[Call] = []
        self._seen: dict[str, int] = {}
        self._lock = threading.Lock()

    def _record(self, call: Call) -> None:
        with self._lock:
            self.calls.append(call)
        if self.on_call is not None:
            self.on_call(call)

    def _error(self, outcome: str, event_id: str | None) -> BaseException | None:
        p = self.payments
        if outcome == "timeout":
            return p.DownstreamTimeout(f"gateway timed out after 2.0 s authorising {event_id}")
        if outcome == "unavailable":
            return p.DownstreamUnavailable(f"gateway answered 503 for {event_id}")
        if outcome == "declined":
            return p.PaymentDeclined(f"gateway declined {event_id}: account closed")
        return None

    def authorize(self, event: Any) -> None:
        event_id = getattr(event, "event_id", None)
        now = self.clock.monotonic()
        if self.down_while():
            self._record(Call("authorize", event_id, now, "down"))
            raise self.payments.DownstreamUnavailable(
                "gateway answered 503: service unavailable") from ConnectionRefusedError(
                    111, "connection refused by gateway-7f9c:8443")
        with self._lock:
            n = self._seen.get(event_id, 0)
            self._seen[event_id] = n + 1
        script = self.scripts.get(event_id, [])
        outcome = script[n] if n < len(script) else "ok"
        self._record(Call("authorize", event_id, now, outcome))
        error = self._error(outcome, event_id)
        if error is None:
            return
        if outcome == "unavailable":
            raise error from ConnectionResetError(104, "connection reset by gateway-7f9c:8443")
        raise error

    def ping(self) -> None:
        now = self.clock.monotonic()
        down = self.down_while()
        self._record(Call("ping", None, now, "down" if down else "ok"))
        if down:
            raise self.payments.DownstreamUnavailable("gateway health check: 503")

    # what the checks ask afterwards
    def authorizations(self, event_id: str) -> list[Call]:
        return [c for c in self.calls if c.what == "authorize" and c.event_id == event_id]


# -- taps around the learner's clients -------------------------------------------------------


def die(reason: str, log: Callable[[dict[str, Any]], None] | None = None) -> None:
    """SIGKILL this process: no finally blocks, no flush, like kill -9."""
    if log is not None:
        log({"ev": "kill", "why": reason})
    sys.stderr.write(f"dojo.dlq: SIGKILL {reason}\n")
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
                 log: Callable[[dict[str, Any]], None] | None = None) -> None:
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
                 log: Callable[[dict[str, Any]], None] | None = None) -> None:
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


# -- Kafka readers ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Record:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    timestamp_ms: int

    def header(self, name: str) -> bytes | None:
        values = [v for k, v in self.headers if k == name]
        return values[-1] if values else None

    def text(self, name: str) -> str | None:
        value = self.header(name)
        return None if value is None else value.decode("utf-8", "replace")

    def names(self) -> list[str]:
        return [k for k, _ in self.headers]


def read_topic(bootstrap_config: dict[str, Any], topic: str, partitions: int, *,
               expect: int | None = None, settle: float = 0.3, timeout: float = 8.0,
               start: dict[int, int] | None = None) -> list[Record]:
    """Every record of `topic` (from offset 0, or `start`), read with assign(): no group, so
    no join delay. Stops `settle` s after `expect` records arrived (extras still show), or
    after `settle` s with nothing new once `expect` is None, or at `timeout`."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({**bootstrap_config, "group.id": f"dojo.dlq.reader.{uuid.uuid4().hex}",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    try:
        consumer.assign([TopicPartition(topic, p, (start or {}).get(p, 0))
                         for p in range(partitions)])
        out: list[Record] = []
        began = last = time.monotonic()
        idle_limit = max(settle, 0.6)  # the first fetch of an assignment takes ~0.1 s
        while time.monotonic() - began < timeout:
            msg = consumer.poll(0.05)
            now = time.monotonic()
            if msg is not None and not msg.error():
                out.append(Record(msg.topic(), msg.partition(), msg.offset(), msg.key(),
                                  msg.value(), tuple(msg.headers() or ()), msg.timestamp()[1]))
                last = now
                continue
            if expect is not None and len(out) >= expect and now - last >= settle:
                break
            if expect is None and now - last >= idle_limit:
                break
        return sorted(out, key=lambda r: (r.partition, r.offset))
    finally:
        consumer.close()


def committed_offsets(bootstrap_config: dict[str, Any], group_id: str, topic: str,
                      partitions: int) -> dict[int, int]:
    """The group's committed offset per partition (-1 where nothing is committed)."""
    from confluent_kafka import Consumer, TopicPartition

    probe = Consumer({**bootstrap_config, "group.id": group_id, "enable.auto.commit": False})
    try:
        parts = probe.committed([TopicPartition(topic, p) for p in range(partitions)],
                                timeout=10)
        return {tp.partition: (tp.offset if tp.offset >= 0 else -1) for tp in parts}
    finally:
        probe.close()


class CommitProbe:
    """Watches a group's committed offsets from a background thread (every `every` s), so
    that asking never blocks the consumer loop that calls should_stop()."""

    def __init__(self, bootstrap_config: dict[str, Any], group_id: str, topic: str,
                 partitions: int, every: float = 0.03) -> None:
        from confluent_kafka import Consumer

        self.topic, self.partitions, self.every = topic, partitions, every
        self._consumer = Consumer({**bootstrap_config, "group.id": group_id,
                                   "enable.auto.commit": False})
        self.latest: dict[int, int] = {p: -1 for p in range(partitions)}
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="dojo-probe")
        self._thread.start()

    def _fetch(self) -> None:
        from confluent_kafka import TopicPartition

        try:
            with self._lock:
                parts = self._consumer.committed(
                    [TopicPartition(self.topic, p) for p in range(self.partitions)], timeout=5)
            self.latest = {tp.partition: (tp.offset if tp.offset >= 0 else -1) for tp in parts}
        except Exception:
            pass  # a slow or failed answer: keep the last one

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._fetch()
            self._stop.wait(self.every)

    def read(self, force: bool = False) -> dict[int, int]:
        if force:
            self._fetch()
        return dict(self.latest)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(6)
        with self._lock:
            self._consumer.close()


# -- headers ---------------------------------------------------------------------------------

BINARY_HEADERS = {"kafka_dlt-original-partition": 4, "kafka_dlt-original-offset": 8,
                  "kafka_dlt-original-timestamp": 8}


def java_int(value: bytes | None, size: int) -> int | None:
    """A Java int (4 bytes) or long (8 bytes), big-endian, as Spring Kafka writes them."""
    if value is None or len(value) != size:
        return None
    return struct.unpack(">i" if size == 4 else ">q", value)[0]


def show_header(name: str, value: bytes | None, width: int = 60) -> str:
    if value is None:
        return "(null)"
    size = BINARY_HEADERS.get(name)
    if size is not None:
        decoded = java_int(value, size)
        hexed = value.hex(" ")
        if decoded is not None:
            return f"{decoded}  (bytes {hexed})"
        return f"{value!r} — {len(value)} bytes, not a {size}-byte big-endian number"
    text_value = value.decode("utf-8", "replace").replace("\n", "⏎")
    return text_value if len(text_value) <= width else text_value[:width - 1] + "…"


def show_bytes(value: bytes | None, width: int = 70) -> str:
    if value is None:
        return "null"
    shown = repr(value)
    return shown if len(shown) <= width else shown[:width - 1] + "…"


def write_jsonl(path: str) -> Callable[[dict[str, Any]], None]:
    """An append-only log that survives kill -9 (one os.write per line)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def log(entry: dict[str, Any]) -> None:
        os.write(fd, (json.dumps(entry, default=str) + "\n").encode())

    return log


def read_jsonl(path: str) -> list[dict[str, Any]]:
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


def unique(items: Iterable[Any]) -> list[Any]:
    seen: set[Any] = set()
    out = []
    for item in items:
        if item not in seen:
            seen.add(item)
            out.append(item)
    return out


def partitions_of(records: Sequence[Record]) -> dict[int, list[Record]]:
    out: dict[int, list[Record]] = {}
    for record in records:
        out.setdefault(record.partition, []).append(record)
    return out
