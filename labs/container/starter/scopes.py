"""Scopes beyond singleton and prototype (README, stage 7).

A request is a `with scopes.request():` block. Each thread and each asyncio task sees its own
request in progress; a request-scoped bean lives as long as its request and is destroyed when
the request ends; injected into a longer-lived bean, it is a scoped proxy that finds the
current request's bean on every use.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


class ScopeNotActiveError(RuntimeError):
    """A request-scoped bean was asked for where no request is in progress."""

    def __init__(self, bean: str) -> None:
        self.bean = bean
        super().__init__(f"bean {bean!r} is request-scoped and no request is active here; "
                         "use it inside `with scopes.request():`")


@contextmanager
def request() -> Iterator[Any]:
    """A request: its request-scoped beans live until the block ends (README, stage 7)."""
    raise NotImplementedError("scopes.request (README, stage 7)")
    yield  # a generator, like the finished function
