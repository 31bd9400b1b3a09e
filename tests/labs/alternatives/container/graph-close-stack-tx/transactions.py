"""@transactional with a stack of connections per context and a __getattr__ proxy."""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import markers


class NoTransactionError(RuntimeError):
    """connection() was called where no transaction is in progress."""


class TransactionManager:
    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self._stack: contextvars.ContextVar[tuple[Any, ...]] = contextvars.ContextVar(
            f"tx_stack_{id(self)}", default=())

    def connection(self) -> Any:
        stack = self._stack.get()
        if not stack:
            raise NoTransactionError("no transaction in progress here")
        return stack[-1]

    @contextmanager
    def transaction(self, attribute: markers.TransactionAttribute) -> Iterator[Any]:
        stack = self._stack.get()
        if attribute.propagation == markers.REQUIRED and stack:
            yield stack[-1]
            return
        if attribute.propagation not in (markers.REQUIRED, markers.REQUIRES_NEW):
            raise ValueError(attribute.propagation)
        with self.engine.connect() as conn:
            tx = conn.begin()
            token = self._stack.set((*stack, conn))
            try:
                yield conn
            except BaseException as error:
                if isinstance(error, attribute.no_rollback_for):
                    tx.commit()
                else:
                    tx.rollback()
                raise
            else:
                tx.commit()
            finally:
                self._stack.reset(token)


def _marked(cls: type) -> dict[str, markers.TransactionAttribute]:
    found: dict[str, markers.TransactionAttribute] = {}
    for name in dir(cls):
        attribute = getattr(getattr(cls, name, None), "__transactional__", None)
        if isinstance(attribute, markers.TransactionAttribute):
            found[name] = attribute
    return found


class _Proxy:
    __slots__ = ("_tx_target", "_tx_manager", "_tx_marked")

    def __init__(self, target: Any, manager: TransactionManager,
                 marked: dict[str, markers.TransactionAttribute]) -> None:
        object.__setattr__(self, "_tx_target", target)
        object.__setattr__(self, "_tx_manager", manager)
        object.__setattr__(self, "_tx_marked", marked)

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._tx_target, name)
        attribute = self._tx_marked.get(name)
        if attribute is None or not callable(value):
            return value
        manager = self._tx_manager

        def call(*args: Any, **kwargs: Any) -> Any:
            with manager.transaction(attribute):
                return value(*args, **kwargs)
        call.__name__ = name
        return call

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._tx_target, name, value)


class TransactionalPostProcessor(markers.BeanPostProcessor):
    def __init__(self, manager: TransactionManager) -> None:
        self.manager = manager

    def after_init(self, bean: Any, name: str) -> Any:
        marked = _marked(type(bean))
        return _Proxy(bean, self.manager, marked) if marked else bean


__all__ = ["NoTransactionError", "TransactionManager", "TransactionalPostProcessor"]
