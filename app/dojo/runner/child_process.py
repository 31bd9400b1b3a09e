"""One child process running checks: start it, read its JSON lines, stop it, say where it was.

The child runs in its own process group, so killing the group also ends whatever the learner's
code started (subprocesses, multiprocessing workers). Services are not in that group: the
service manager starts them detached.
"""

from __future__ import annotations

import json
import linecache
import os
import re
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dojo.runner.ledger import LEDGER_ENV
from dojo.runner.limits import FILE_LIMIT_ENV, MEMORY_LIMIT_ENV, Limits, preexec, sweep_descendants
from dojo.runner.sandbox import PRIVATE_ENV
from dojo.services.manager import ENDPOINTS_ENV, Endpoints
from dojo.services.paths import state_dir
from dojo.store.paths import data_dir

_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')
DUMP_WAIT_SECONDS = 1.0


@dataclass
class ChildProcess:
    """A running `python -m dojo.runner.child`, with its results pipe and trace file."""

    proc: subprocess.Popen[bytes]
    results_fd: int
    trace_file: Path
    log_file: Path
    _buffer: bytes = b""
    _eof: bool = False
    started: float = field(default_factory=time.monotonic)

    @classmethod
    def spawn(cls, child_args: list[str], scratch: Path, serial: int,
              limits: Limits | None = None, ledger: Path | None = None,
              endpoints: Endpoints | None = None) -> ChildProcess:
        """Start the child with `child_args` (after --results/--trace-file) in `scratch`,
        under `limits`, with a scrubbed environment (see `learner_env`) and the services
        the parent resolved (`endpoints`, so the child does not resolve them again)."""
        read_fd, write_fd = os.pipe()
        trace = scratch / f"trace-{serial}.txt"
        log = scratch / f"output-{serial}.txt"
        trace.touch()
        argv = [sys.executable, "-m", "dojo.runner.child", "--results", f"fd:{write_fd}",
                "--trace-file", str(trace), *child_args]
        limits = limits or Limits()
        env = {**learner_env(scratch), MEMORY_LIMIT_ENV: limits.describe_memory(),
               FILE_LIMIT_ENV: f"{limits.file_bytes >> 20} MiB"}
        if ledger is not None:
            env[LEDGER_ENV] = str(ledger)
        if endpoints is not None:
            env[ENDPOINTS_ENV] = endpoints.to_json()
        try:
            with open(log, "wb") as out:
                proc = subprocess.Popen(
                    argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                    pass_fds=(write_fd,), start_new_session=True, cwd=scratch, env=env,
                    preexec_fn=preexec(limits, os.getpid()))
        finally:
            os.close(write_fd)
        return cls(proc, read_fd, trace, log)

    def read_events(self, timeout: float) -> list[dict[str, Any]]:
        """The complete lines that arrive within `timeout` s, decoded; [] when none did."""
        if self._eof:
            time.sleep(min(timeout, 0.05))
            return []
        ready, _, _ = select.select([self.results_fd], [], [], max(timeout, 0.0))
        if not ready:
            return []
        chunk = os.read(self.results_fd, 1 << 16)
        if not chunk:
            self._eof = True
        self._buffer += chunk
        *lines, self._buffer = self._buffer.split(b"\n")
        events = []
        for line in lines:
            if not line.strip():
                continue
            try:
                event = json.loads(line)
            except ValueError:
                continue  # a torn line from a child killed mid-write
            if isinstance(event, dict):
                events.append(event)
        return events

    @property
    def finished(self) -> bool:
        """The child exited and every line it wrote has been read (or the pipe is held open
        by a grandchild, in which case there is nothing more worth waiting for)."""
        return self.proc.poll() is not None and (self._eof or not self._readable())

    def _readable(self) -> bool:
        ready, _, _ = select.select([self.results_fd], [], [], 0)
        return bool(ready)

    @property
    def exit_code(self) -> int | None:
        return self.proc.poll()

    def where_stuck(self, impl: Path) -> str:
        """Ask faulthandler for every thread's stack (SIGUSR1) and name the learner's line."""
        before = self.trace_file.stat().st_size
        try:
            os.kill(self.proc.pid, signal.SIGUSR1)
        except ProcessLookupError:
            return ""
        deadline = time.monotonic() + DUMP_WAIT_SECONDS
        size = before
        while time.monotonic() < deadline:
            time.sleep(0.05)
            now = self.trace_file.stat().st_size
            if now > before and now == size:
                break  # it grew and stopped growing: the dump is complete
            size = now
        return learner_frame(self.trace_text(offset=before), impl)

    def trace_text(self, offset: int = 0) -> str:
        try:
            with open(self.trace_file, encoding="utf-8", errors="replace") as handle:
                handle.seek(offset)
                return handle.read()
        except OSError:
            return ""

    def output_tail(self, lines: int = 15) -> str:
        """The last lines the child printed outside any check (pytest usage errors and such)."""
        try:
            text = self.log_file.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
        return "\n".join(text.strip().splitlines()[-lines:])

    def kill(self) -> None:
        """SIGKILL the whole process group (the child and what learner code started), and
        every descendant that left the group (setsid, double fork while still a child)."""
        if self.proc.poll() is None:
            sweep_descendants([self.proc.pid])
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass

    def close(self) -> None:
        """Kill what is left of the group and release the pipe."""
        self.kill()
        try:
            os.close(self.results_fd)
        except OSError:
            pass


# Variables learner code must not see: where the progress database lives, and the like.
SCRUBBED = ("DOJO_DATA_DIR", "DOJO_PROGRESS_DB", "DOJO_ENDPOINTS")


def learner_env(scratch: Path) -> dict[str, str]:
    """The child's environment: the parent's minus `SCRUBBED`, with a HOME and a TMPDIR of its
    own inside `scratch` (removed with it), so learner code neither reads nor litters the
    user's home or /tmp."""
    env = {key: value for key, value in os.environ.items() if key not in SCRUBBED}
    home = scratch / "home"
    home.mkdir(exist_ok=True)
    # compiled files would appear as stray __pycache__ folders in solutions and mutants
    tmp = scratch / "tmp"
    tmp.mkdir(exist_ok=True)
    env.update(PYTHONDONTWRITEBYTECODE="1", PYTHONFAULTHANDLER="1", HOME=str(home),
               TMPDIR=str(tmp), MALLOC_ARENA_MAX="2")  # glibc's arenas reserve address space
    # the folders the file sandbox keeps out of reach (see dojo.runner.sandbox)
    env[PRIVATE_ENV] = os.pathsep.join(str(p) for p in (data_dir(), state_dir()))
    return env


def learner_frame(dump: str, impl: Path) -> str:
    """The most recent frame inside `impl` in a faulthandler dump, as `file line N, in f: code`.

    faulthandler lists the current (main) thread last and each stack most recent call first;
    the main thread is where the check runs, so it is searched first.
    """
    sections = re.split(r"\n(?=(?:Current thread|Thread) 0x)", dump)
    sections.sort(key=lambda text: not text.lstrip().startswith("Current thread"))
    impl = impl.resolve()
    for section in sections:
        for line in section.splitlines():
            match = _FRAME.match(line)
            if not match:
                continue
            path = Path(match["file"])
            try:
                relative = path.resolve().relative_to(impl)
            except (ValueError, OSError):
                continue
            number = int(match["line"])
            code = linecache.getline(str(path), number).strip()
            where = f"{relative} line {number}"
            if match["func"] != "<module>":
                where += f", in {match['func']}"
            return f"{where}: {code}" if code else where
    return ""


def describe_exit(code: int | None) -> str:
    """How the child ended, in words a learner can act on."""
    if code is None:
        return "the test process stopped responding"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        why = {
            "SIGSEGV": "a crash in native code",
            "SIGKILL": "killed from outside: out of memory, or your code killed its own process",
            "SIGABRT": "an abort in native code",
            "SIGXFSZ": "your code wrote a file larger than the check's file-size limit",
            "SIGXCPU": "your code used more CPU time than the check's limit",
        }.get(name, "a signal")
        return f"the test process was killed by {name} ({why})"
    return (f"the test process exited with code {code} in the middle of the check "
            "(did your code call os._exit() or sys.exit() from a thread?)")
