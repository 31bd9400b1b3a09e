"""Scopes beyond singleton and prototype: the request scope and its scoped proxy.

A request is a `with scopes.request():` block. The request in progress lives in a ContextVar,
so every thread, and every asyncio task (each runs in a copy of its creator's context), sees
its own; a request-scoped bean is kept in the request that made it and destroyed when that
request ends. A request-scoped bean injected into a longer-lived one is a `ScopedProxy`: it
holds no bean, and finds the current request's one on every attribute access.
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from typing import Any


class ScopeNotActiveError(RuntimeError):
    """A request-scoped bean was asked for where no request is in progress."""

    def __init__(self, bean: str) -> None:
        self.bean = bean
        super().__init__(f"bean {bean!r} is request-scoped and no request is active here; "
                         "use it inside `with scopes.request():`")


class Request:
    """The beans of one request and what to call when it ends."""

    def __init__(self) -> None:
        self._beans: dict[Hashable, Any] = {}
        self._destroy: list[Callable[[], None]] = []

    def get(self, key: Hashable, create: Callable[[], tuple[Any, Callable[[], None]]]) -> Any:
        """The request's bean under `key`, made by `create()` (bean, destroy) the first time."""
        if key not in self._beans:
            bean, destroy = create()
            self._beans[key] = bean
            self._destroy.append(destroy)
        return self._beans[key]

    def end(self) -> None:
        """Destroy the request's beans, the last made first."""
        errors: list[BaseException] = []
        while self._destroy:
            try:
                self._destroy.pop()()
            except Exception as error:  # one bean's failure must not keep the others alive
                errors.append(error)
        self._beans.clear()
        for error in errors:
            logging.getLogger(__name__).warning("request bean destroy failed", exc_info=error)


_current: contextvars.ContextVar[Request | None] = contextvars.ContextVar(
    "dojo_request", default=None)


@contextmanager
def request() -> Iterator[Request]:
    """A request: its request-scoped beans live until the block ends, then are destroyed."""
    started = Request()
    token = _current.set(started)
    try:
        yield started
    finally:
        _current.reset(token)
        started.end()


def current_request(bean: str) -> Request:
    """The request in progress here, or ScopeNotActiveError naming the bean asked for."""
    found = _current.get()
    if found is None:
        raise ScopeNotActiveError(bean)
    return found


class ScopedProxy:
    """Stands in for a request-scoped bean: every attribute comes from the current request's."""

    __slots__ = ("_dojo_bean", "_dojo_resolve")

    def __init__(self, bean: str, resolve: Callable[[], Any]) -> None:
        object.__setattr__(self, "_dojo_bean", bean)
        object.__setattr__(self, "_dojo_resolve", resolve)

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._dojo_resolve(), attr)

    def __setattr__(self, attr: str, value: Any) -> None:
        setattr(self._dojo_resolve(), attr, value)

    def __repr__(self) -> str:
        return f"<scoped proxy of request bean {self._dojo_bean!r}>"


__all__ = ["Request", "ScopeNotActiveError", "ScopedProxy", "current_request", "request"]
