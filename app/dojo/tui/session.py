"""What every screen shares: the content root, the catalog, the progress store, the clocks.

The heavy parts (the catalog takes ~0.5 s to parse, SQLAlchemy and fsrs ~0.3 s to import) load
lazily through `load()`, which a worker calls after the first frame; nothing here is imported
at start-up but the content models. Tests pass their own clocks, services and random source,
so snapshots are the same on every run.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from dojo.content import Catalog
    from dojo.quiz import ReviewScheduler
    from dojo.services.manager import ServiceStatus
    from dojo.store import ProgressStore


class Services(Protocol):
    """The two calls the TUI makes on `dojo.services.manager`."""

    def status(self) -> list[ServiceStatus]: ...

    def up(self, log: Callable[[str], None]) -> None: ...


class ManagerServices:
    """The real services, through `dojo.services.manager` (imported on first use)."""

    def status(self) -> list[ServiceStatus]:
        from dojo.services import manager

        return manager.status()

    def up(self, log: Callable[[str], None]) -> None:
        from dojo.services import manager

        manager.up(log=log)


def _utc_now() -> datetime:
    return datetime.now(UTC)


@dataclass
class Session:
    """The engine objects the screens render, loaded once.

    Args:
        root: the content root (default `dojo.content.content_root()`).
        clock: the monotonic clock the quiz countdown reads.
        now: the wall clock for "due today" and "next review".
        rng: picks mock interview questions.
        services: status and start of PostgreSQL and Kafka.
        quiz_seconds: time per answer.
    """

    root: Path | None = None
    clock: Callable[[], float] = time.monotonic
    now: Callable[[], datetime] = _utc_now
    rng: random.Random = field(default_factory=random.Random)
    services: Services = field(default_factory=ManagerServices)
    quiz_seconds: float = 60.0
    _catalog: Catalog | None = field(default=None, init=False, repr=False)
    _store: ProgressStore | None = field(default=None, init=False, repr=False)
    _scheduler: ReviewScheduler | None = field(default=None, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def load(self) -> None:
        """Load the catalog and open the store (blocking: call it from a worker)."""
        with self._lock:
            if self._catalog is not None:
                return
            from dojo.content import content_root, load_catalog
            from dojo.quiz import ReviewScheduler
            from dojo.store import ProgressStore

            self.root = (self.root or content_root()).resolve()
            store = ProgressStore()
            self._scheduler = ReviewScheduler(store)
            self._store = store
            self._catalog = load_catalog(self.root)

    @property
    def loaded(self) -> bool:
        return self._catalog is not None

    @property
    def content_root(self) -> Path:
        if self.root is None:
            from dojo.content import content_root

            self.root = content_root().resolve()
        return self.root

    @property
    def catalog(self) -> Catalog:
        if self._catalog is None:
            self.load()
        assert self._catalog is not None
        return self._catalog

    @property
    def store(self) -> ProgressStore:
        if self._store is None:
            self.load()
        assert self._store is not None
        return self._store

    @property
    def scheduler(self) -> ReviewScheduler:
        if self._scheduler is None:
            self.load()
        assert self._scheduler is not None
        return self._scheduler

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
