"""Request scope, another way: the request in progress is a ContextVar holding a plain store.

The store is a dict of beans by key and a list of destroy callbacks; the context fills both
(see context.py), and `request()` calls the callbacks, the last registered first, once the
block ends.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any


class ScopeNotActiveError(RuntimeError):
    """A request-scoped bean was asked for where no request is in progress."""

    def __init__(self, bean: str) -> None:
        self.bean = bean
        super().__init__(f"bean {bean!r} is request-scoped and no request is active here; "
                         "use it inside `with scopes.request():`")


@dataclass
class Store:
    beans: dict[Any, Any] = field(default_factory=dict)
    on_end: list[Callable[[], None]] = field(default_factory=list)


_store: ContextVar[Store] = ContextVar("request_store")


@contextmanager
def request() -> Iterator[None]:
    store = Store()
    token = _store.set(store)
    try:
        yield
    finally:
        _store.reset(token)
        while store.on_end:
            try:
                store.on_end.pop()()
            except Exception:           # logged; the request's other beans still go
                logging.getLogger(__name__).exception("ending a request bean failed")


def store_for(bean: str) -> Store:
    """The current request's store, or ScopeNotActiveError for `bean`."""
    try:
        return _store.get()
    except LookupError:
        raise ScopeNotActiveError(bean) from None
