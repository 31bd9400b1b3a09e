"""@transactional with a class-based proxy, the way CGLIB builds one.

For each wrapped bean a subclass of its class is made on the fly; every public method of the
subclass forwards to the target (so inside the target, self is the target), and the marked
ones forward inside a transaction. The manager keeps a per-thread stack of connections: a
REQUIRES_NEW call pushes a second connection and pops it when done, which resumes the caller.
"""

from __future__ import annotations

import threading
from typing import Any

import markers


class NoTransactionError(RuntimeError):
    """No transaction is in progress in this thread."""


class TransactionManager:
    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self._local = threading.local()

    def _stack(self) -> list[Any]:
        if not hasattr(self._local, "stack"):
            self._local.stack = []
        return self._local.stack

    def connection(self) -> Any:
        stack = self._stack()
        if not stack:
            raise NoTransactionError("this thread has no transaction")
        return stack[-1]

    def execute(self, propagation: str, no_rollback_for: tuple[type[BaseException], ...],
                target: Any, *args: Any, **kwargs: Any) -> Any:
        stack = self._stack()
        if stack and propagation == markers.REQUIRED:
            return target(*args, **kwargs)
        if propagation not in (markers.REQUIRED, markers.REQUIRES_NEW):
            raise ValueError(propagation)
        connection = self.engine.connect()
        transaction = connection.begin()
        stack.append(connection)
        outcome = "rollback"
        try:
            result = target(*args, **kwargs)
            outcome = "commit"
            return result
        except BaseException as error:
            if any(isinstance(error, kind) for kind in no_rollback_for):
                outcome = "commit"
            raise
        finally:
            stack.pop()
            try:
                if outcome == "commit":
                    transaction.commit()
                else:
                    transaction.rollback()
            finally:
                connection.close()


def _forward(name: str) -> Any:
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.__target__, name)(*args, **kwargs)
    method.__name__ = name
    return method


def _forward_in_transaction(name: str, attribute: Any) -> Any:
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        return self.__manager__.execute(attribute.propagation, attribute.no_rollback_for,
                                        getattr(self.__target__, name), *args, **kwargs)
    method.__name__ = name
    return method


_PROXY_CLASSES: dict[type, type] = {}


def _proxy_class(cls: type) -> type | None:
    if cls in _PROXY_CLASSES:
        return _PROXY_CLASSES[cls]
    namespace: dict[str, Any] = {}
    marked = False
    for klass in reversed(cls.__mro__[:-1]):
        for name, member in vars(klass).items():
            if name.startswith("__") or not callable(member):
                continue
            attribute = getattr(member, "__transactional__", None)
            if attribute is not None:
                marked = True
                namespace[name] = _forward_in_transaction(name, attribute)
            else:
                namespace[name] = _forward(name)
    if not marked:
        _PROXY_CLASSES[cls] = None  # type: ignore[assignment]
        return None
    namespace["__getattr__"] = lambda self, name: getattr(self.__target__, name)
    proxy = type(cls.__name__ + "$$TransactionalProxy", (cls,), namespace)
    _PROXY_CLASSES[cls] = proxy
    return proxy


class TransactionalPostProcessor(markers.BeanPostProcessor):
    def __init__(self, manager: TransactionManager) -> None:
        self.manager = manager

    def after_init(self, bean: Any, name: str) -> Any:
        proxy_class = _proxy_class(type(bean))
        if proxy_class is None:
            return bean
        proxy = object.__new__(proxy_class)        # no constructor: the target has the state
        proxy.__dict__["__target__"] = bean
        proxy.__dict__["__manager__"] = self.manager
        return proxy
