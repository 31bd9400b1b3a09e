"""A private logger with the learner's handler on it, for the checks of stage 1: every line it
wrote, parsed, and every error the handler hit while writing (logging swallows those)."""

from __future__ import annotations

import io
import json
import logging
import sys
import traceback
import uuid
from types import TracebackType
from typing import Any

from dojo.checks import call


class CapturedLog:
    """`log_handler(service, stream)` on a fresh logger; `.log` to write, `.lines()` to read."""

    def __init__(self, telemetry: Any, service: str = "orders-api") -> None:
        self.stream = io.StringIO()
        self.handler: logging.Handler = call(telemetry.log_handler, service, self.stream)
        self.errors: list[str] = []
        self.handler.handleError = self._handle_error
        self.log = logging.getLogger(f"dojo.check.logs.{uuid.uuid4().hex[:8]}")
        self.log.addHandler(self.handler)
        self.log.setLevel(logging.DEBUG)
        self.log.propagate = False

    def _handle_error(self, record: logging.LogRecord) -> None:
        kind, value, tb = sys.exc_info()
        if value is not None:
            self.errors.append(_last_frames(kind, value, tb))

    def raw_lines(self) -> list[str]:
        return [line for line in self.stream.getvalue().split("\n") if line.strip()]

    def parsed(self) -> list[dict[str, Any] | None]:
        """Each line as a dict, or None where it is not a JSON object."""
        out: list[dict[str, Any] | None] = []
        for raw in self.raw_lines():
            try:
                value = json.loads(raw)
            except ValueError:
                value = None
            out.append(value if isinstance(value, dict) else None)
        return out

    def close(self) -> None:
        self.log.removeHandler(self.handler)


def _last_frames(kind: type[BaseException] | None, value: BaseException,
                 tb: TracebackType | None) -> str:
    frames = traceback.format_exception(kind, value, tb)
    return "".join(frames[-3:]).strip()
