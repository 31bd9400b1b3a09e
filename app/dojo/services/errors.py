"""Errors the services layer raises; every message carries the fix."""

from __future__ import annotations


class ServiceError(RuntimeError):
    """A service could not be started, reached or stopped. The message says how to fix it."""


class StateFileError(ServiceError):
    """The recorded state is unreadable."""
