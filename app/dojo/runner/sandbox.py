"""Files a check child may touch, enforced by the kernel (Landlock, Linux 5.13+).

Learner code runs in the check child, so whatever the child can open, learner code can open.
Before pytest starts, the child restricts itself (and every process it starts) to:

- read and execute: the system's directories (/usr, /lib, /etc, /proc, ...), the Python
  installation and every `sys.path` entry, dojo's own package, the lab and the code under test;
- read and write: its scratch folder (its cwd, HOME and TMPDIR), /dev, and the run's ledger.

Everything else, notably the learner's progress (the data dir) and the services' state dir
(the PostgreSQL superuser's password, the clusters' files), is out of reach: opening it fails
with PermissionError. A path to allow that contains one of the parent's private folders
(`PRIVATE_ENV`) is left out rather than allowed.

Where the kernel has no Landlock (older kernels, some container runtimes) the child runs
without it, and `file_sandbox()` says why; the rlimits of `dojo.runner.limits` still apply.
"""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Iterable
from pathlib import Path

# set by the parent: the folders learner code must never reach, joined with os.pathsep
PRIVATE_ENV = "DOJO_SANDBOX_PRIVATE"
# set by the parent to "off" to run a child without the file sandbox (debugging only)
SANDBOX_ENV = "DOJO_FILE_SANDBOX"
# set by whoever starts dojo (never learner code): more folders to allow, read and write,
# joined with os.pathsep; the engine's tests use it to let a misbehaving fixture report back
ALLOW_ENV = "DOJO_SANDBOX_ALLOW"

_SYS_CREATE_RULESET, _SYS_ADD_RULE, _SYS_RESTRICT_SELF = 444, 445, 446
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1
_PR_SET_NO_NEW_PRIVS = 38

EXECUTE, WRITE_FILE, READ_FILE, READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
REMOVE_DIR, REMOVE_FILE, MAKE_CHAR, MAKE_DIR = 1 << 4, 1 << 5, 1 << 6, 1 << 7
MAKE_REG, MAKE_SOCK, MAKE_FIFO, MAKE_BLOCK, MAKE_SYM = 1 << 8, 1 << 9, 1 << 10, 1 << 11, 1 << 12
REFER, TRUNCATE = 1 << 13, 1 << 14
_ABI1 = (1 << 13) - 1
FILE_ONLY = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE
READ = EXECUTE | READ_FILE | READ_DIR
READ_WRITE = -1  # every right the kernel handles

SYSTEM_DIRS = ("/usr", "/lib", "/lib32", "/lib64", "/libx32", "/bin", "/sbin", "/etc", "/opt",
               "/proc", "/sys", "/run", "/nix", "/gnu")


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def landlock_abi() -> int:
    """The kernel's Landlock ABI version, 0 when it has none (or forbids it here)."""
    if not sys.platform.startswith("linux"):
        return 0
    try:
        version = _libc().syscall(_SYS_CREATE_RULESET, None, ctypes.c_size_t(0),
                                  ctypes.c_uint32(_CREATE_RULESET_VERSION))
    except (OSError, AttributeError):
        return 0
    return max(int(version), 0)


def file_sandbox() -> tuple[bool, str]:
    """(enforced, why): whether check children run inside the file sandbox on this machine."""
    if os.environ.get(SANDBOX_ENV) == "off":
        return False, f"turned off by {SANDBOX_ENV}=off"
    abi = landlock_abi()
    if abi < 1:
        return False, "the kernel offers no Landlock (Linux 5.13+ with landlock in the LSM list)"
    return True, f"Landlock ABI {abi}: progress and service state are out of learner code's reach"


def _inside(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def allowed_paths(lab: Path, impl: Path, scratch: Path, ledger: str | None,
                  private: Iterable[Path], extra: Iterable[Path] = ()) -> list[tuple[Path, int]]:
    """(path, access) pairs of the child's ruleset, minus any that would open a private one."""
    read_only = [Path(p) for p in SYSTEM_DIRS]
    read_only += [Path(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix,
                                    os.path.dirname(os.path.realpath(sys.executable)))]
    read_only += [Path(p) for p in sys.path if p]
    read_only += [Path(__file__).resolve().parents[2], lab, impl]
    pairs = [(p, READ) for p in read_only] + [(scratch, READ_WRITE), (Path("/dev"), READ_WRITE)]
    pairs += [(p, READ_WRITE) for p in extra]
    if ledger:
        pairs.append((Path(ledger), FILE_ONLY))
    hidden = [p.resolve() for p in private]
    kept: list[tuple[Path, int]] = []
    for path, access in pairs:
        try:
            real = path.resolve()
        except OSError:
            continue
        if not real.exists() or any(_inside(secret, real) for secret in hidden):
            continue
        kept.append((real, access))
    return kept


def restrict(pairs: list[tuple[Path, int]], abi: int) -> None:
    """Allow only `pairs` to this process and its descendants, for good. Raises OSError."""
    handled = _ABI1 | (REFER if abi >= 2 else 0) | (TRUNCATE if abi >= 3 else 0)
    libc = _libc()
    attr = ctypes.c_uint64(handled)
    ruleset = libc.syscall(_SYS_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(8),
                           ctypes.c_uint32(0))
    if ruleset < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset failed")
    try:
        for path, access in pairs:
            access = handled if access == READ_WRITE else access & handled
            if not path.is_dir():
                access &= FILE_ONLY
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            try:
                rule = _PathBeneath(access, fd)
                if libc.syscall(_SYS_ADD_RULE, ruleset, _RULE_PATH_BENEATH,
                                ctypes.byref(rule), ctypes.c_uint32(0)) < 0:
                    raise OSError(ctypes.get_errno(), f"landlock_add_rule failed for {path}")
            finally:
                os.close(fd)
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
        if libc.syscall(_SYS_RESTRICT_SELF, ruleset, ctypes.c_uint32(0)) < 0:
            raise OSError(ctypes.get_errno(), "landlock_restrict_self failed")
    finally:
        os.close(ruleset)


def enter(lab: Path, impl: Path, ledger: str | None) -> str:
    """In the check child, before any learner code: restrict the files it may touch.
    Returns a line saying what happened (the child prints it to its log)."""
    enforced, why = file_sandbox()
    if not enforced:
        return f"file sandbox: off ({why})"
    if ledger:
        Path(ledger).touch()  # a rule needs the file to exist; it is appended to later
    private, extra = (
        [Path(p) for p in os.environ.get(name, "").split(os.pathsep) if p]
        for name in (PRIVATE_ENV, ALLOW_ENV))
    try:
        restrict(allowed_paths(lab, impl, Path.cwd(), ledger, private, extra), landlock_abi())
    except OSError as error:
        return f"file sandbox: off ({error})"
    return f"file sandbox: on ({why})"
