"""Start a long-lived service process detached from the terminal that started it."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

# Every service process dojo starts carries this variable, set to its state dir: `down --force`
# finds them by it (a process's environment, not a command line anyone could share).
MARKER_ENV = "DOJO_SERVICE_OF"


def service_marker() -> str:
    from dojo.services.paths import state_dir

    return str(state_dir().resolve())


def spawn_detached(argv: list[str], log: Path, env: dict[str, str] | None = None,
                   cwd: Path | None = None) -> int:
    """Start `argv` in its own session with output appended to `log`; return its pid."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # survives the CLI that started it, and Ctrl-C in it
            env={**os.environ, **(env or {}), MARKER_ENV: service_marker()},
            cwd=str(cwd) if cwd else None,
        )
    return proc.pid


def terminate(pid: int, timeout: float = 10.0) -> None:
    """SIGTERM, wait, then SIGKILL; a process already gone is fine."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _exists(pid):
            return
        time.sleep(0.05)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return


def _exists(pid: int) -> bool:
    try:
        # reap it if it is our child (the CLI that started it may still be alive in tests)
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    except ChildProcessError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
