"""Request scope: a ContextVar holds the stack of requests in progress (innermost last).

A request keeps, per context object, that context's request-scoped beans; the scoped proxy
re-resolves the bean on every attribute access through __getattribute__.
"""

from __future__ import annotations

import contextvars
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


class ScopeNotActiveError(RuntimeError):
    """A request-scoped bean was asked for where no request is in progress."""

    def __init__(self, bean: str) -> None:
        self.bean = bean
        super().__init__(f"bean {bean!r} is request-scoped and no request is active here")


class Request:
    def __init__(self) -> None:
        self._per_context: weakref.WeakKeyDictionary[Any, dict[str, Any]] = \
            weakref.WeakKeyDictionary()
        self._teardown: list[Callable[[], None]] = []

    def bean_of(self, context: Any, name: str,
                create: Callable[[], tuple[Any, Callable[[], None]]]) -> Any:
        beans = self._per_context.setdefault(context, {})
        if name not in beans:
            bean, destroy = create()
            beans[name] = bean
            self._teardown.append(destroy)
        return beans[name]

    def close(self) -> None:
        first: BaseException | None = None
        for destroy in reversed(self._teardown):
            try:
                destroy()
            except Exception as error:
                first = first or error
        self._teardown.clear()
        self._per_context.clear()
        if first is not None:
            raise first


_stack: contextvars.ContextVar[tuple[Request, ...]] = contextvars.ContextVar(
    "dojo_request_stack", default=())


@contextmanager
def request() -> Iterator[Request]:
    mine = Request()
    outer = _stack.get()
    _stack.set((*outer, mine))
    try:
        yield mine
    finally:
        _stack.set(outer)
        mine.close()


def current_request(bean: str) -> Request:
    stack = _stack.get()
    if not stack:
        raise ScopeNotActiveError(bean)
    return stack[-1]


class ScopedProxy:
    __slots__ = ("_sp_name", "_sp_resolve")

    def __init__(self, bean: str, resolve: Callable[[], Any]) -> None:
        object.__setattr__(self, "_sp_name", bean)
        object.__setattr__(self, "_sp_resolve", resolve)

    def __getattribute__(self, attr: str) -> Any:
        return getattr(object.__getattribute__(self, "_sp_resolve")(), attr)

    def __setattr__(self, attr: str, value: Any) -> None:
        setattr(object.__getattribute__(self, "_sp_resolve")(), attr, value)


__all__ = ["Request", "ScopeNotActiveError", "ScopedProxy", "current_request", "request"]
