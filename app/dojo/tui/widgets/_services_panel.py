"""`ServicesPanel`: PostgreSQL and Kafka, up or down, and starting them with visible progress."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from textual import on, work
from textual.content import Content
from textual.message import Message
from textual.reactive import var
from textual.widgets import Static

if TYPE_CHECKING:
    from dojo.services.manager import ServiceStatus
    from dojo.tui.session import Services

STATE_STYLES = {"up": ("●", "$text-success"), "external": ("●", "$text-success"),
                "stopped": ("○", "$text-muted"), "dead": ("✗", "$text-error"),
                "unreachable": ("✗", "$text-error")}
REFRESH_SECONDS = 5.0
SPINNER = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"


class ServicesPanel(Static):
    """Status is checked in a worker (every few seconds, never blocking); `start()` brings
    the services up in a worker, showing each line the service manager logs.

    Posts `ServicesPanel.Changed` whenever a status check completes.
    """

    DEFAULT_CSS = """
    ServicesPanel {
        height: auto;
        border: round $foreground 30%;
        border-title-color: $text-primary;
        padding: 0 1;
    }
    """

    @dataclass
    class Changed(Message):
        panel: ServicesPanel
        statuses: list[ServiceStatus]
        all_up: bool

    @dataclass
    class _Checked(Message):
        statuses: list[ServiceStatus] | None
        error: str = ""

    @dataclass
    class _Log(Message):
        line: str

    @dataclass
    class _Started(Message):
        error: str

    starting: var[bool] = var(False)

    def __init__(self, services: Services, *, id: str | None = None) -> None:
        super().__init__("checking services…", id=id)
        self.services = services
        self.border_title = "Services"
        self._statuses: list[ServiceStatus] | None = None
        self._error = ""
        self._log_line = ""
        self._frame = 0

    def on_mount(self) -> None:
        self.check()
        self.set_interval(REFRESH_SECONDS, self.check)
        self._spinner = self.set_interval(0.1, self._spin, pause=True)

    @property
    def all_up(self) -> bool:
        return bool(self._statuses) and all(
            status.state in ("up", "external") for status in self._statuses or [])

    def check(self) -> None:
        if not self.starting:
            self._check()

    @work(thread=True, exclusive=True, group="services-status")
    def _check(self) -> None:
        try:
            self.post_message(self._Checked(self.services.status()))
        except Exception as exc:  # a broken state file must not take the app down
            self.post_message(self._Checked(None, str(exc)))

    def start(self) -> None:
        """Start what is not running; progress shows in the panel."""
        if self.starting:
            return
        self.starting = True
        self._log_line = "starting…"
        self._spinner.resume()
        self._start()

    @work(thread=True, exclusive=True, group="services-start")
    def _start(self) -> None:
        try:
            self.services.up(log=self._relay)
        except Exception as exc:
            self.post_message(self._Started(str(exc)))
        else:
            self.post_message(self._Started(""))

    def _relay(self, line: str) -> None:
        self.post_message(self._Log(line))

    @on(_Checked)
    def _checked(self, message: _Checked) -> None:
        message.stop()
        self._statuses, self._error = message.statuses, message.error
        self._draw()
        self.post_message(self.Changed(self, list(self._statuses or []), self.all_up))

    @on(_Log)
    def _logged(self, message: _Log) -> None:
        message.stop()
        self._log_line = " ".join(message.line.split())
        self._draw()

    @on(_Started)
    def _started(self, message: _Started) -> None:
        message.stop()
        self.starting = False
        self._spinner.pause()
        self._log_line = ""
        if message.error:
            self._error = message.error
            self.notify(message.error, title="Services did not start", severity="error",
                        timeout=15)
        else:
            self.notify("PostgreSQL and Kafka are up", timeout=3)
        self._check()

    def _spin(self) -> None:
        self._frame = (self._frame + 1) % len(SPINNER)
        self._draw()

    def _draw(self) -> None:
        parts: list[Content | str | tuple[str, str]] = []
        if self._statuses is None and not self.starting:
            parts.append(("cannot read the services state: " + self._error, "$text-error")
                         if self._error else ("checking…", "$text-muted"))
        for status in self._statuses or []:
            mark, style = STATE_STYLES.get(status.state, ("?", "$text-warning"))
            # the embedded PostgreSQL is the default and needs no label; Kafka's backend
            # matters (tansu lacks some semantics, checks then say "needs Apache Kafka")
            name = "PostgreSQL" if status.name == "postgres" else "Kafka"
            backend = "" if status.backend == "embedded" else f" · {status.backend}"
            parts += [(mark, style), f" {name}", (backend, "$text-muted"),
                      " " * max(1, 17 - len(name) - len(backend)), (status.state, style), "\n"]
        if self.starting:
            parts.append((f"{SPINNER[self._frame]} {self._log_line}", "$text-accent"))
        elif self._statuses and not self.all_up:
            parts.append(("press u to start them", "$text-muted"))
        elif self._error and self._statuses is not None:
            parts.append((self._error[:200], "$text-error"))
        self.update(Content.assemble(*parts).rstrip())
