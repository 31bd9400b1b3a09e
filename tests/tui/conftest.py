"""TUI tests: a private copy of a small content root, a progress store in tmp, fixed clocks,
fake services and a seeded random source, so every run (and every snapshot) is the same."""

from __future__ import annotations

import random
import shutil
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import pytest
from textual.pilot import Pilot

from dojo.services.manager import ServiceStatus
from dojo.tui.app import DojoApp
from dojo.tui.session import Session

FIXTURE_CONTENT = Path(__file__).parent / "fixtures" / "content"
REPO = Path(__file__).resolve().parents[2]
NOW = datetime(2026, 3, 2, 9, 30, tzinfo=UTC)


class FakeClock:
    """A monotonic clock that only moves when a test says so."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@dataclass
class FakeServices:
    """Services that answer at once; `up()` records the call and brings both up."""

    state: str = "up"
    started: int = 0
    log_lines: list[str] = field(default_factory=lambda: ["postgres  embedded  started",
                                                          "kafka     tansu  started"])

    def status(self) -> list[ServiceStatus]:
        return [ServiceStatus("postgres", "embedded", self.state),
                ServiceStatus("kafka", "tansu", self.state)]

    def up(self, log: Callable[[str], None]) -> None:
        self.started += 1
        for line in self.log_lines:
            log(line)
        self.state = "up"


@pytest.fixture
def anyio_backend() -> str:
    """Async tests run under anyio's pytest plugin (anyio ships with Textual's deps)."""
    return "asyncio"


@pytest.fixture
def content_root(tmp_path: Path) -> Path:
    root = tmp_path / "content"
    shutil.copytree(FIXTURE_CONTENT, root)
    return root


@pytest.fixture
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "data"
    monkeypatch.setenv("DOJO_DATA_DIR", str(path))
    return path


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def services() -> FakeServices:
    return FakeServices()


@pytest.fixture
def make_app(content_root: Path, data_dir: Path, clock: FakeClock, services: FakeServices
             ) -> Iterator[Callable[..., DojoApp]]:
    """Build the app over the fixture content; keyword arguments go to the Session."""
    apps: list[DojoApp] = []

    def build(**session_args: object) -> DojoApp:
        options: dict[str, object] = {"root": content_root, "clock": clock,
                                      "now": lambda: NOW, "rng": random.Random(7),
                                      "services": services}
        options.update(session_args)
        app = DojoApp(Session(**options), cursor_blink=False)  # type: ignore[arg-type]
        apps.append(app)
        return app

    yield build
    for app in apps:
        app.session.close()


async def wait_for(pilot: Pilot[None], condition: Callable[[], object], timeout: float = 10.0,
                   what: str = "the condition") -> None:
    """Let the app run until `condition()` is true (workers post their results)."""
    steps = int(timeout / 0.05)
    for _ in range(steps):
        if condition():
            return
        await pilot.pause(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


async def home_ready(pilot: Pilot[None]) -> None:
    """Home has loaded the catalog and checked the services."""
    from dojo.tui.screens import HomeScreen
    from dojo.tui.widgets import ServicesPanel

    app = pilot.app
    await wait_for(pilot, lambda: isinstance(app.screen, HomeScreen)
                   and app.screen.overview is not None
                   and app.screen.query_one(ServicesPanel)._statuses is not None,
                   what="Home to load")
    await pilot.pause()


async def document_ready(pilot: Pilot[None], selector: str = "DocumentView") -> None:
    from dojo.tui.widgets import DocumentView

    await wait_for(pilot, lambda: pilot.app.screen.query_one(selector, DocumentView)
                   .laid_out, what="the page to be laid out")
    await pilot.pause()


Step = Callable[[Pilot[None]], Awaitable[None]]
