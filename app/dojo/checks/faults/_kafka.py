"""Kafka faults as the caller sees them: death right after an acknowledgement, a slow broker,
a broker that is not there."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from dojo.checks.faults._process import _die, _Proxy

T = TypeVar("T")

_CALLBACK_POSITION = 4  # produce(topic, value, key, partition, on_delivery, ...)


def _split_callback(args: tuple[Any, ...], kwargs: dict[str, Any]
                    ) -> tuple[tuple[Any, ...], dict[str, Any], Callable[..., Any] | None]:
    """Take the delivery callback out of a produce() call, wherever the caller put it."""
    kwargs = dict(kwargs)
    callback = kwargs.pop("on_delivery", None) or kwargs.pop("callback", None)
    if callback is None and len(args) > _CALLBACK_POSITION:
        callback = args[_CALLBACK_POSITION]
        args = args[:_CALLBACK_POSITION] + (None,) + args[_CALLBACK_POSITION + 1:]
    return args, kwargs, callback


class _KillAfterAck(_Proxy):
    def __init__(self, producer: Any, acks: int) -> None:
        super().__init__(producer)
        object.__setattr__(self, "_acks_wanted", acks)
        object.__setattr__(self, "_acks", 0)

    def produce(self, *args: Any, **kwargs: Any) -> Any:
        args, kwargs, callback = _split_callback(args, kwargs)

        def on_delivery(err: Any, msg: Any) -> None:
            if callback is not None:
                callback(err, msg)
            if err is None:
                object.__setattr__(self, "_acks", self._acks + 1)
                if self._acks >= self._acks_wanted:
                    _die(f"right after the broker's acknowledgement #{self._acks} reached the "
                         "caller (before anything else it would do next)")

        return self._target.produce(*args, on_delivery=on_delivery, **kwargs)


def kill_after_ack(producer: T, acks: int = 1) -> T:
    """A confluent-kafka producer proxy that SIGKILLs its process as soon as the `acks`-th
    successful delivery report reached the caller: after the caller's own delivery callback
    returned, or, when it passed none, inside the poll()/flush() that served the report.

    This is the window between "the broker has it" and "the database knows it", whatever way
    the caller waits for acknowledgements (flush(), poll() loop, callbacks).
    """
    return _KillAfterAck(producer, acks)  # type: ignore[return-value]


# -- a slow broker ----------------------------------------------------------------------------


class SlowProducer(_Proxy):
    """A confluent-kafka producer whose acknowledgements reach the caller `delay` seconds after
    produce() at the earliest: a slow or distant broker, as the caller experiences it.

    produce() returns at once; poll() and flush() hold delivery reports back until they are
    due (flush() blocks until then, as it would on a slow broker). `first_send` is set when
    produce() is first called, so a check can look at the database while the send is in flight.
    """

    def __init__(self, producer: Any, delay: float) -> None:
        super().__init__(producer)
        object.__setattr__(self, "delay", delay)
        object.__setattr__(self, "first_send", threading.Event())
        object.__setattr__(self, "produced", 0)
        object.__setattr__(self, "_due", [])  # (due, callback, err, msg) reports held back
        object.__setattr__(self, "_pending", 0)  # produced, report not yet handed over
        object.__setattr__(self, "_lock", threading.Lock())

    def __len__(self) -> int:
        return self._pending

    def produce(self, *args: Any, **kwargs: Any) -> Any:
        args, kwargs, callback = _split_callback(args, kwargs)
        due = time.monotonic() + self.delay

        def on_delivery(err: Any, msg: Any) -> None:
            with self._lock:
                self._due.append((due, callback, err, msg))

        result = self._target.produce(*args, on_delivery=on_delivery, **kwargs)
        with self._lock:
            object.__setattr__(self, "_pending", self._pending + 1)
            object.__setattr__(self, "produced", self.produced + 1)
        self.first_send.set()
        return result

    def _hand_over(self) -> int:
        now = time.monotonic()
        with self._lock:
            ready = [r for r in self._due if r[0] <= now]
            self._due[:] = [r for r in self._due if r[0] > now]
            object.__setattr__(self, "_pending", self._pending - len(ready))
        for _, callback, err, msg in ready:
            if callback is not None:
                callback(err, msg)
        return len(ready)

    def _next_due(self) -> float | None:
        with self._lock:
            return min((r[0] for r in self._due), default=None)

    def poll(self, timeout: float | None = None) -> int:
        deadline = time.monotonic() + (timeout if timeout is not None and timeout >= 0 else 1e9)
        while True:
            self._target.poll(0)
            served = self._hand_over()
            now = time.monotonic()
            if served or now >= deadline:
                return served
            due = self._next_due()  # None: the real broker has not answered yet
            wake = min(deadline, due if due is not None else now + 0.01)
            time.sleep(max(0.0, wake - now))

    def flush(self, timeout: float | None = None) -> int:
        deadline = time.monotonic() + (timeout if timeout is not None and timeout >= 0 else 1e9)
        while self._pending and time.monotonic() < deadline:
            self._target.flush(max(0.0, min(0.05, deadline - time.monotonic())))
            self._hand_over()
            if self._pending:
                time.sleep(min(0.005, max(0.0, deadline - time.monotonic())))
        return self._pending


# -- a broker that is not there ---------------------------------------------------------------

_RESERVED: list[socket.socket] = []


def unreachable_bootstrap() -> str:
    """A `127.0.0.1:<port>` where nothing listens: the port stays bound (never listening) by
    this process, so no other program can take it and connections are refused at once."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    _RESERVED.append(sock)
    return f"127.0.0.1:{sock.getsockname()[1]}"


