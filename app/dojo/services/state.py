"""The services state file: what dojo started, where it listens, and whether it still runs.

One JSON document, written atomically (temp file + rename) so a kill mid-write leaves either the
old or the new state, never half of one.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil

from dojo.services.errors import StateFileError
from dojo.services.paths import state_dir

# psutil derives create_time from the kernel's boot time, which moves whenever the wall clock
# is adjusted (seen on a VM: 1 s steps, 3 s within an hour), so an exact match calls a live
# service dead. A recycled pid belongs to a process started much later than ours.
CREATE_TIME_TOLERANCE = 120.0


@dataclass
class ServiceRecord:
    """One service dojo started: enough to find it again, check it and stop it."""

    name: str  # "postgres" | "kafka"
    backend: str  # "embedded" | "tansu" | "apache"
    pid: int
    port: int
    url: str  # SQLAlchemy URL for postgres, bootstrap servers for kafka
    started_at: float
    create_time: float  # process start time: a recycled pid is not our process
    log: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def is_alive(self) -> bool:
        """True when the recorded process still runs and is the one we started."""
        try:
            proc = psutil.Process(self.pid)
            if proc.status() == psutil.STATUS_ZOMBIE:
                return False
            return abs(proc.create_time() - self.create_time) < CREATE_TIME_TOLERANCE
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            return False


def state_file() -> Path:
    return state_dir() / "services.json"


def load_records() -> dict[str, ServiceRecord]:
    """Read the state file; an absent file means nothing was started."""
    path = state_file()
    if not path.exists():
        return {}
    try:
        raw = json.loads(path.read_text() or "{}")
        if not isinstance(raw, dict):
            raise ValueError("top level is not an object")
        records = {name: ServiceRecord(**rec) for name, rec in raw.items()}
        for name, record in records.items():
            _check_types(name, record)
        return records
    except (ValueError, TypeError) as exc:
        raise StateFileError(
            f"The services state file {path} is corrupted ({exc}). "
            "Fix: run `dojo services down --force`: it stops every process dojo started "
            "(found by the marker it gives them) and removes the file."
        ) from exc


_TYPES: dict[str, tuple[type, ...]] = {
    "name": (str,), "backend": (str,), "pid": (int,), "port": (int,), "url": (str,),
    "started_at": (int, float), "create_time": (int, float), "log": (str,), "extra": (dict,),
}


def _check_types(name: str, record: ServiceRecord) -> None:
    """A record whose fields have the wrong types (hand-edited, another version's) is a
    corrupt file, said once here rather than a TypeError deep in psutil later."""
    for field_name, kinds in _TYPES.items():
        value = getattr(record, field_name)
        if isinstance(value, bool) or not isinstance(value, kinds):
            raise TypeError(f"{name}.{field_name} should be {kinds[0].__name__}, "
                            f"got {type(value).__name__} {value!r}")


def save_records(records: dict[str, ServiceRecord]) -> None:
    path = state_file()
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    # the PostgreSQL URL carries the superuser's password: owner-only, like pg-password
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(json.dumps({k: asdict(v) for k, v in records.items()}, indent=2))
    os.replace(tmp, path)


def update_record(record: ServiceRecord) -> None:
    records = load_records()
    records[record.name] = record
    save_records(records)


def remove_record(name: str) -> None:
    records = load_records()
    if records.pop(name, None) is not None:
        save_records(records)


def process_create_time(pid: int) -> float:
    return float(psutil.Process(pid).create_time())
