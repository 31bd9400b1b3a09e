"""Workers released together by a barrier, and duplicate, out-of-order delivery."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from dojo.checks.learner import NotWritten, not_written

T = TypeVar("T")

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
    except NotImplementedError as exc:  # a stub: the parent raises it as NotWritten
        queue.put((index, None, not_written(exc), time.monotonic() - started))
    except BaseException as exc:  # reported to the parent
        queue.put((index, None, f"{type(exc).__name__}: {exc}", time.monotonic() - started))


def _raise_stub(outcomes: list[Outcome]) -> None:
    """A worker that reached a stub makes the race meaningless: fail with NotWritten."""
    for outcome in outcomes:
        if isinstance(outcome.error, NotWritten):
            raise outcome.error
        if isinstance(outcome.error, NotImplementedError):
            raise not_written(outcome.error) from outcome.error


def run_concurrently(fn: Callable[[int], Any], n: int, *, processes: bool = False,
                     timeout: float = 30.0) -> list[Outcome]:
    """Start `n` workers that wait at one barrier and then call `fn(index)` together.

    Threads by default (the learner's code shares nothing but what it is given); with
    `processes=True`, spawned processes (fn and results must pickle; errors come back as text
    in a RuntimeError). Workers still running after `timeout` are reported as TimeoutError.
    Worker threads are named `dojo-worker-<index>` (`record_sql` shows them as "worker 3").

    Returns:
        One Outcome per worker, in index order.

    Raises:
        NotWritten: a worker reached a learner function that is still a stub.
    """
    if processes:
        done = _run_processes(fn, n, timeout)
        _raise_stub(done)
        return done
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
    found = [outcomes.get(i, Outcome(i, error=TimeoutError(f"worker {i} still running after "
                                                           f"{timeout} s")))
             for i in range(n)]
    _raise_stub(found)
    return found


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
        outcomes[index] = Outcome(
            index, value=value, duration=duration,
            error=error if isinstance(error, BaseException) else
            RuntimeError(error) if error else None)
    for proc in procs:
        proc.join(max(0.0, deadline - time.monotonic()))
        if proc.is_alive():
            proc.kill()  # one of the workers we started
            proc.join()
    return [outcomes.get(i, Outcome(i, error=TimeoutError(f"worker {i} still running after "
                                                          f"{timeout} s")))
            for i in range(n)]


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


