"""Fault tools for lab checks: crash a process at an exact point, slow a broker or a database,
race workers behind a barrier, point a client at nothing, deliver twice and out of order.

Every tool works through the same objects the learner's code receives (a producer, an engine,
a function), so a check attacks the code through its documented API and never its internals.

    producer = kill_after_ack(Producer(config))       # SIGKILL right after the first ack
    result = run_in_subprocess("checks/_support.py:relay_child", ..., path=[learner.dir])
    assert result.killed
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

# -- processes ------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProcessResult:
    """How a child process ended, and what it said."""

    exit_code: int | None  # None when it had to be killed on timeout
    signal: int | None  # the signal that ended it (SIGKILL for kill_after and friends)
    timed_out: bool
    value: Any  # the target's return value (JSON), when it returned
    error: str | None  # the traceback, when the target raised
    stdout: str
    stderr: str
    duration: float

    @property
    def killed(self) -> bool:
        """True when the process died of SIGKILL (and not of our timeout)."""
        return self.signal == signal.SIGKILL and not self.timed_out

    @property
    def returned(self) -> bool:
        return self.exit_code == 0 and self.error is None

    def describe(self) -> str:
        """One paragraph for a failure message: how it ended and the tail of its output."""
        if self.timed_out:
            how = f"was still running after {self.duration:.1f} s and was stopped"
        elif self.signal is not None:
            how = f"died of signal {signal.Signals(self.signal).name}"
        elif self.error:
            how = "raised:\n" + _tail(self.error, 12)
        else:
            how = f"exited with code {self.exit_code}, returning {self.value!r}"
        out = _tail(self.stderr, 8)
        return f"the child process {how}" + (f"\n  its stderr ends with:\n{out}" if out else "")


def _tail(text: str, lines: int) -> str:
    return "\n".join("    " + line for line in text.strip().splitlines()[-lines:])


def run_in_subprocess(target: str, *args: Any, timeout: float = 30.0,
                      path: Sequence[str | Path] = (), env: Mapping[str, str] | None = None,
                      cwd: str | Path | None = None) -> ProcessResult:
    """Run `target(*args)` in a fresh Python process and report how it ended.

    Args:
        target: `"package.module:function"` or `"/path/to/file.py:function"`.
        args: JSON-serialisable arguments.
        timeout: seconds before the process (and its children) are killed; `timed_out` says so.
        path: directories put first on the child's sys.path (the learner directory, say).
        env: extra environment variables for the child.
        cwd: the child's working directory.

    Returns:
        A ProcessResult; `value` is the target's return value decoded from JSON.
    """
    with tempfile.TemporaryDirectory(prefix="dojo-child-") as tmp:
        spec = Path(tmp, "spec.json")
        result_file = Path(tmp, "result.json")
        spec.write_text(json.dumps({"target": target, "args": list(args),
                                    "path": [str(p) for p in path],
                                    "result": str(result_file)}))
        started = time.monotonic()
        proc = subprocess.Popen(
            [sys.executable, "-m", "dojo.runner.faults", str(spec)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
            env={**os.environ, **(env or {})}, cwd=cwd, start_new_session=True, text=True,
        )
        timed_out = False
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            os.killpg(proc.pid, signal.SIGKILL)  # our own child's session, nothing else
            stdout, stderr = proc.communicate()
        duration = time.monotonic() - started
        value, error = None, None
        if result_file.exists():
            outcome = json.loads(result_file.read_text())
            value, error = outcome.get("value"), outcome.get("error")
        code = proc.returncode
        return ProcessResult(
            exit_code=None if timed_out else (code if code >= 0 else None),
            signal=-code if code < 0 else None,
            timed_out=timed_out, value=value, error=error,
            stdout=stdout, stderr=stderr, duration=duration,
        )


def _load_target(target: str) -> Callable[..., Any]:
    where, _, name = target.rpartition(":")
    if not where or not name:
        raise ValueError(f"target must be 'module:function' or 'file.py:function', not {target!r}")
    if where.endswith(".py"):
        spec = importlib.util.spec_from_file_location(Path(where).stem, where)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot load {where}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    else:
        module = importlib.import_module(where)
    return getattr(module, name)


def _child_main(spec_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    for entry in reversed(spec["path"]):
        sys.path.insert(0, entry)
    outcome: dict[str, Any]
    try:
        value = _load_target(spec["target"])(*spec["args"])
        outcome = {"value": value}
    except BaseException:  # the parent wants to see whatever happened
        outcome = {"error": traceback.format_exc()}
    Path(spec["result"]).write_text(json.dumps(outcome, default=str))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0 if "value" in outcome else 1)  # skip atexit hooks a crashed library may hang in


# -- killing at an exact point ----------------------------------------------------------------


def _die(reason: str) -> None:
    sys.stderr.write(f"dojo.faults: SIGKILL {reason}\n")
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)


class _Proxy:
    """Forwards everything to the wrapped object except the methods a subclass overrides."""

    def __init__(self, target: Any) -> None:
        object.__setattr__(self, "_target", target)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._target, name)

    def __len__(self) -> int:
        return len(self._target)


class _KillAround(_Proxy):
    def __init__(self, target: Any, method: str, calls: int, before: bool) -> None:
        super().__init__(target)
        if calls < 1:
            raise ValueError("calls must be at least 1")
        object.__setattr__(self, "_method", method)
        object.__setattr__(self, "_calls", calls)
        object.__setattr__(self, "_before", before)
        object.__setattr__(self, "_seen", 0)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._target, name)
        if name != self._method:
            return attr

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            object.__setattr__(self, "_seen", self._seen + 1)
            label = f"{type(self._target).__name__}.{name}() (call {self._seen})"
            if self._before and self._seen >= self._calls:
                _die(f"as {label} was called, before it ran")
            result = attr(*args, **kwargs)
            if not self._before and self._seen >= self._calls:
                _die(f"right after {label} returned")
            return result

        return wrapper


def kill_after(obj: T, method: str, calls: int = 1) -> T:
    """A proxy around `obj` that SIGKILLs its own process right after `method` returned for
    the `calls`-th time: no finally blocks, no atexit, no flush, like `kill -9`.

    Example: `kill_after(producer, "flush")` dies after the broker acknowledged and before the
    caller's next line (the mark in the database). Only use it in a child process.
    """
    return _KillAround(obj, method, calls, before=False)  # type: ignore[return-value]


def kill_before(obj: T, method: str, calls: int = 1) -> T:
    """Like kill_after, but dies as the `calls`-th call of `method` starts, before it runs."""
    return _KillAround(obj, method, calls, before=True)  # type: ignore[return-value]


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


# -- races ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    """What one concurrent worker returned or raised."""

    index: int
    value: Any = None
    error: BaseException | None = None
    duration: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error is None


def _process_worker(fn: Callable[[int], Any], index: int, barrier: Any, queue: Any) -> None:
    barrier.wait()
    started = time.monotonic()
    try:
        queue.put((index, fn(index), None, time.monotonic() - started))
    except BaseException as exc:  # reported to the parent
        queue.put((index, None, f"{type(exc).__name__}: {exc}", time.monotonic() - started))


def run_concurrently(fn: Callable[[int], Any], n: int, *, processes: bool = False,
                     timeout: float = 30.0) -> list[Outcome]:
    """Start `n` workers that wait at one barrier and then call `fn(index)` together.

    Threads by default (the learner's code shares nothing but what it is given); with
    `processes=True`, spawned processes (fn and results must pickle; errors come back as text
    in a RuntimeError). Workers still running after `timeout` are reported as TimeoutError.

    Returns:
        One Outcome per worker, in index order.
    """
    if processes:
        return _run_processes(fn, n, timeout)
    barrier = threading.Barrier(n)
    outcomes: dict[int, Outcome] = {}

    def work(index: int) -> None:
        try:
            barrier.wait(timeout)
        except threading.BrokenBarrierError as exc:
            outcomes[index] = Outcome(index, error=exc)
            return
        started = time.monotonic()
        try:
            outcomes[index] = Outcome(index, value=fn(index),
                                      duration=time.monotonic() - started)
        except BaseException as exc:
            outcomes[index] = Outcome(index, error=exc, duration=time.monotonic() - started)

    threads = [threading.Thread(target=work, args=(i,), daemon=True, name=f"dojo-worker-{i}")
               for i in range(n)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + timeout
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    return [outcomes.get(i, Outcome(i, error=TimeoutError(f"worker {i} still running after "
                                                          f"{timeout} s")))
            for i in range(n)]


def _run_processes(fn: Callable[[int], Any], n: int, timeout: float) -> list[Outcome]:
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    barrier, queue = ctx.Barrier(n), ctx.Queue()
    procs = [ctx.Process(target=_process_worker, args=(fn, i, barrier, queue), daemon=True)
             for i in range(n)]
    for proc in procs:
        proc.start()
    outcomes: dict[int, Outcome] = {}
    deadline = time.monotonic() + timeout
    while len(outcomes) < n and time.monotonic() < deadline:
        try:
            index, value, error, duration = queue.get(timeout=max(0.01, deadline -
                                                                  time.monotonic()))
        except Exception:
            break
        outcomes[index] = Outcome(index, value=value, duration=duration,
                                  error=RuntimeError(error) if error else None)
    for proc in procs:
        proc.join(max(0.0, deadline - time.monotonic()))
        if proc.is_alive():
            proc.kill()  # one of the workers we started
            proc.join()
    return [outcomes.get(i, Outcome(i, error=TimeoutError(f"worker {i} still running after "
                                                          f"{timeout} s")))
            for i in range(n)]


# -- a slow or failing database ---------------------------------------------------------------


@contextmanager
def slow_sql(engine: Any, delay: float, match: str = r".") -> Iterator[list[str]]:
    """Sleep `delay` seconds right after every statement whose SQL matches `match` (a regex,
    case-insensitive) runs on `engine`, before the caller gets the result: a slow database that
    widens every race window. Yields the list of statements it slowed.

    Works on SQLAlchemy engines (cursor events); code that bypasses the engine is not seen.
    """
    from sqlalchemy import event

    pattern = re.compile(match, re.IGNORECASE)
    slowed: list[str] = []

    def after(conn: Any, cursor: Any, statement: str, *rest: Any) -> None:
        if pattern.search(statement):
            slowed.append(statement)
            time.sleep(delay)

    event.listen(engine, "after_cursor_execute", after)
    try:
        yield slowed
    finally:
        event.remove(engine, "after_cursor_execute", after)


class InjectedFault(RuntimeError):
    """The error fail_sql raises: an exception at a chosen statement, like a crash mid-write."""


@contextmanager
def fail_sql(engine: Any, match: str, *, times: int = 1,
             error: Callable[[str], BaseException] | None = None) -> Iterator[list[str]]:
    """Raise (InjectedFault by default) instead of running the first `times` statements whose
    SQL matches `match` (regex, case-insensitive). Yields the statements it failed.
    """
    from sqlalchemy import event

    pattern = re.compile(match, re.IGNORECASE)
    failed: list[str] = []

    def before(conn: Any, cursor: Any, statement: str, *rest: Any) -> None:
        if len(failed) < times and pattern.search(statement):
            failed.append(statement)
            raise (error(statement) if error else
                   InjectedFault(f"injected failure at: {' '.join(statement.split())[:120]}"))

    event.listen(engine, "before_cursor_execute", before)
    try:
        yield failed
    finally:
        event.remove(engine, "before_cursor_execute", before)


# -- duplicate and out-of-order delivery ------------------------------------------------------


def duplicate_and_reorder(items: Sequence[T], *, copies: int = 2, shuffle: bool = True,
                          seed: int = 0, key: Callable[[T], Hashable] | None = None) -> list[T]:
    """Every item `copies` times, in a shuffled order (deterministic for a given `seed`).

    With `key`, items that share a key keep their relative order (what Kafka keeps inside a
    partition) while copies still follow one another; without it, anything goes.
    """
    if copies < 1:
        raise ValueError("copies must be at least 1")
    rng = random.Random(seed)
    repeated = [item for item in items for _ in range(copies)]
    if not shuffle:
        return repeated
    if key is None:
        rng.shuffle(repeated)
        return repeated
    lanes: dict[Hashable, list[T]] = {}
    for item in repeated:
        lanes.setdefault(key(item), []).append(item)
    queues = [list(lane) for lane in lanes.values()]
    out: list[T] = []
    while queues:
        lane = rng.choice(queues)
        out.append(lane.pop(0))
        if not lane:
            queues.remove(lane)
    return out


if __name__ == "__main__":
    _child_main(sys.argv[1])
