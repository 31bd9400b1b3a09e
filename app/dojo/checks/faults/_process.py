"""Child processes, and proxies that SIGKILL their own process at an exact call."""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
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

    Raises:
        NotWritten: the target reached a learner function that is still a stub.
    """
    with tempfile.TemporaryDirectory(prefix="dojo-child-") as tmp:
        spec = Path(tmp, "spec.json")
        result_file = Path(tmp, "result.json")
        spec.write_text(json.dumps({"target": target, "args": list(args),
                                    "path": [str(p) for p in path],
                                    "result": str(result_file)}))
        started = time.monotonic()
        proc = subprocess.Popen(
            [sys.executable, "-m", "dojo.checks.faults", str(spec)],
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
            if outcome.get("stub"):
                from dojo.checks.learner import NotWritten

                raise NotWritten(*outcome["stub"])
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
    except NotImplementedError as exc:  # a stub: the parent raises NotWritten
        from dojo.checks.learner import not_written

        stub = not_written(exc)
        outcome = {"error": traceback.format_exc(),
                   "stub": [stub.function, stub.todo, stub.where]}
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


