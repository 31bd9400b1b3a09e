"""Resource limits for a check child, applied between fork and exec.

The child (and everything learner code starts from it) gets rlimits on address space, file
size, CPU time and process count, and asks the kernel to SIGKILL it when its parent dies
(PR_SET_PDEATHSIG), so a `kill -9` of the CLI or the TUI never leaves a check running.

cgroup v2 would be stronger (real memory, and one kill for the whole group however a process
detached itself); `sandbox_mode()` says whether this machine offers it. Until the runner uses
it, rlimits plus a process-group kill and a sweep of descendants (`sweep_descendants`) are the
containment.
"""

from __future__ import annotations

import ctypes
import os
import resource
import signal
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MiB = 1 << 20
GiB = 1 << 30
PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
CGROUP_ROOT = Path("/sys/fs/cgroup")
# set in the child's environment: the memory limit in words, for the MemoryError message
MEMORY_LIMIT_ENV = "DOJO_CHECK_MEMORY_LIMIT"
FILE_LIMIT_ENV = "DOJO_CHECK_FILE_LIMIT"


@dataclass(frozen=True)
class Limits:
    """What one check child may use. Memory is address space (RLIMIT_AS) under rlimits."""

    memory_bytes: int = GiB
    processes: int = 256
    file_bytes: int = 256 * MiB
    cpu_seconds: int = 600

    def describe_memory(self) -> str:
        if self.memory_bytes % GiB == 0:
            return f"{self.memory_bytes // GiB} GiB"
        return f"{self.memory_bytes // MiB} MiB"


def _set(kind: int, value: int) -> None:
    _, hard = resource.getrlimit(kind)
    if hard != resource.RLIM_INFINITY:
        value = min(value, hard)
    try:
        resource.setrlimit(kind, (value, hard if hard != resource.RLIM_INFINITY else value))
    except (ValueError, OSError):
        pass  # a limit this system refuses to set is not a reason to run no check at all


def preexec(limits: Limits, parent_pid: int) -> Callable[[], None]:
    """The function Popen runs in the child before exec: limits and parent-death signal."""

    def apply() -> None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        except (OSError, AttributeError):
            pass
        if os.getppid() != parent_pid:
            os._exit(70)  # the parent died before the signal was armed
        _set(resource.RLIMIT_AS, limits.memory_bytes)
        _set(resource.RLIMIT_FSIZE, limits.file_bytes)
        _set(resource.RLIMIT_CPU, limits.cpu_seconds)
        # RLIMIT_NPROC counts every process of the user, so as root it would be meaningless
        # and as a user it counts their shell too: it is set high enough not to bite those.
        if os.geteuid() != 0:
            _set(resource.RLIMIT_NPROC, limits.processes + _user_processes())

    return apply


def die_with_descendants() -> None:
    """In the check child: adopt orphaned descendants (so a double fork stays findable) and,
    on SIGTERM or SIGHUP (the parent-death signal, or a stop), kill them all, then exit."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass

    def stop(signum: int, frame: object) -> None:
        sweep_descendants([child.pid for child in _children()])
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGHUP, stop)


def _children() -> list[Any]:
    import psutil

    try:
        return list(psutil.Process().children(recursive=False))
    except psutil.Error:
        return []


def _user_processes() -> int:
    try:
        import psutil

        uid = os.geteuid()
        return sum(1 for p in psutil.process_iter(["uids"]) if p.info["uids"].real == uid)
    except Exception:  # noqa: BLE001 - a count is a nicety; never fail a run over it
        return 512


def sweep_descendants(pids: list[int]) -> int:
    """SIGKILL every process in `pids` and their descendants; how many were killed."""
    import psutil

    found: dict[int, psutil.Process] = {}
    for pid in pids:
        try:
            proc = psutil.Process(pid)
        except psutil.Error:
            continue
        found[pid] = proc
        try:
            for child in proc.children(recursive=True):
                found[child.pid] = child
        except psutil.Error:
            pass
    for proc in found.values():
        try:
            proc.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(list(found.values()), timeout=5)
    return len(found)


def sandbox_mode() -> tuple[str, str]:
    """("cgroup-v2" | "rlimits", why): which containment this machine allows."""
    controllers = CGROUP_ROOT / "cgroup.controllers"
    if not controllers.exists():
        return "rlimits", f"no cgroup v2 hierarchy at {CGROUP_ROOT} (cgroup v1 or hybrid)"
    wanted = {"memory", "pids"}
    have = set(controllers.read_text().split())
    if not wanted <= have:
        return "rlimits", f"cgroup v2 lacks the {', '.join(sorted(wanted - have))} controller"
    if not os.access(CGROUP_ROOT, os.W_OK):
        return "rlimits", f"{CGROUP_ROOT} is not writable by this user"
    return "cgroup-v2", "cgroup v2 with memory and pids controllers"


def lab_limits(raw: object) -> Limits:
    """Limits from a lab.yaml `limits:` mapping (memory_mb, processes, file_mb, cpu_seconds)."""
    if not isinstance(raw, dict):
        return Limits()
    base = Limits()
    return Limits(
        memory_bytes=int(raw.get("memory_mb", base.memory_bytes // MiB)) * MiB,
        processes=int(raw.get("processes", base.processes)),
        file_bytes=int(raw.get("file_mb", base.file_bytes // MiB)) * MiB,
        cpu_seconds=int(raw.get("cpu_seconds", base.cpu_seconds)),
    )
