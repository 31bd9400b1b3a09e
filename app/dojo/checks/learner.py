"""The learner's code: importing it fresh (`learner` fixture), and calling it.

    relay = learner.module("relay")
    ids = call(relay.claim_batch, engine, batch_size=4, lease_seconds=30)
    error = raised(accounts.withdraw, engine, account, Decimal("500"))
    job = in_thread(relay.relay_once, engine, producer, topic)   # runs while the check looks

A function the learner has not written yet raises NotImplementedError (the starter's stubs
do). Every way of calling learner code here turns that into `NotWritten`, a CheckFailure that
names `module.function()` and quotes its to-do, instead of a traceback; the runner does the
same for a NotImplementedError that escapes a check any other way.
"""

from __future__ import annotations

import functools
import importlib
import sys
import threading
import traceback
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from dojo.checks.failure import CheckFailure


class Learner:
    """Imports modules from one directory, fresh for each test."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory.resolve()

    def purge(self) -> None:
        """Forget modules imported from this directory, so the next import reads the files again."""
        for name, module in list(sys.modules.items()):
            file = getattr(module, "__file__", None)
            if file and _inside(file, self.dir):
                del sys.modules[name]
        importlib.invalidate_caches()

    def module(self, name: str) -> ModuleType:
        """Import `name` (e.g. "relay" for relay.py) from the directory under test."""
        path = str(self.dir)
        if path in sys.path:
            sys.path.remove(path)
        sys.path.insert(0, path)
        if not (self.dir / f"{name}.py").exists() and not (self.dir / name).is_dir():
            raise FileNotFoundError(
                f"{name}.py is missing from {self.dir}: the lab expects it (see the lab README)."
            )
        module = importlib.import_module(name)
        origin = getattr(module, "__file__", None)
        if origin is None or not Path(origin).resolve().is_relative_to(self.dir):
            raise ImportError(f"{name} resolved to {origin}, not to a file in {self.dir}")
        return module


@functools.lru_cache(maxsize=8192)
def _inside(file: str, directory: Path) -> bool:
    """Whether module file `file` lies in `directory` (resolved). Cached: a check run purges
    before and after every check, and resolving the ~500 files of sys.modules each time cost
    0.15-0.2 s per purge on a loaded 2-core machine. A path's answer cannot change while the
    run lasts: the learner directory and the installed packages stay where they are."""
    return Path(file).resolve().is_relative_to(directory)


class NotWritten(CheckFailure):
    """A learner function that is still the starter's stub (it raised NotImplementedError).

    Attributes:
        function: `module.function()`, where the NotImplementedError was raised.
        todo: the stub's own message (its to-do), "" when it had none.
        where: `file.py line N`, when known.
    """

    def __init__(self, function: str, todo: str, where: str = "") -> None:
        self.function, self.todo, self.where = function, todo, where
        super().__init__(
            f"{function} is not written yet.",
            expected=f"{function} written as the lab README describes",
            actual="it raises NotImplementedError" + (f" at {where}" if where else "")
                   + (f": {todo}" if todo else ""))

    def __reduce__(self) -> Any:
        return (NotWritten, (self.function, self.todo, self.where))


def not_written(exc: NotImplementedError) -> NotWritten:
    """The failure for a stub: where it raised and what its message asks for.

    Args:
        exc: the NotImplementedError a learner function raised.

    Returns:
        A NotWritten to raise (`raise not_written(exc) from exc`).
    """
    frames = traceback.extract_tb(exc.__traceback__)
    todo = " ".join(str(exc).split())
    if not frames:
        return NotWritten("a function", todo)
    frame = frames[-1]
    return NotWritten(f"{Path(frame.filename).stem}.{frame.name}()", todo,
                      f"{Path(frame.filename).name} line {frame.lineno}")


def call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call a learner function.

    Args:
        fn: the learner's function (or class).
        args, kwargs: its arguments.

    Returns:
        What it returned.

    Raises:
        NotWritten: it is still a stub. Anything else it raises propagates unchanged.
    """
    try:
        return fn(*args, **kwargs)
    except NotImplementedError as exc:
        raise not_written(exc) from exc


def raised(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Exception | None:
    """Call a learner function that may refuse by raising, and return what it raised.

    Args:
        fn: the learner's function.
        args, kwargs: its arguments.

    Returns:
        The exception it raised (any Exception: the learner's refusal, whatever its class),
        or None when it returned.

    Raises:
        NotWritten: it is still a stub (never returned as a refusal).
    """
    try:
        fn(*args, **kwargs)
    except NotImplementedError as exc:
        raise not_written(exc) from exc
    except CheckFailure:
        raise  # a check's verdict from a callback the check handed in, not a refusal
    except Exception as exc:
        return exc
    return None


class Running:
    """Learner code running in a background thread (see `in_thread`).

    Attributes:
        value: what the function returned, once it has.
        error: what it raised (a NotImplementedError already turned into NotWritten), or None.
    """

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...],
                 kwargs: dict[str, Any], name: str) -> None:
        self.value: Any = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(fn, args, kwargs), daemon=True,
                                        name=name)
        self._thread.start()

    def _run(self, fn: Callable[..., Any], args: tuple[Any, ...],
             kwargs: dict[str, Any]) -> None:
        try:
            self.value = fn(*args, **kwargs)
        except NotImplementedError as exc:
            failure = not_written(exc)
            failure.__cause__ = exc
            self.error = failure
        except BaseException as exc:  # handed to the check by result()
            self.error = exc

    @property
    def alive(self) -> bool:
        """Still running."""
        return self._thread.is_alive()

    def join(self, timeout: float | None = None) -> bool:
        """Wait at most `timeout` seconds; True when the function has finished."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def result(self, timeout: float | None = None) -> Any:
        """Wait for the function and return its value.

        Args:
            timeout: seconds to wait at most (None: as long as it takes).

        Returns:
            What the function returned.

        Raises:
            TimeoutError: it is still running after `timeout` seconds.
            Whatever the function raised (NotWritten for a stub).
        """
        if not self.join(timeout):
            raise TimeoutError(f"{self._thread.name} still running after {timeout} s")
        if self.error is not None:
            raise self.error
        return self.value


def in_thread(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Running:
    """Start `fn(*args, **kwargs)` in a daemon thread, so the check can look at the database
    or the broker while it runs (a lock held, a transaction left open, a send in flight).

    Args:
        fn: the learner's function.
        args, kwargs: its arguments.

    Returns:
        A `Running`: `join(timeout)`, `alive`, `result(timeout)`, `value`, `error`.
    """
    return Running(fn, args, kwargs, name=f"dojo-learner-{getattr(fn, '__name__', 'call')}")
