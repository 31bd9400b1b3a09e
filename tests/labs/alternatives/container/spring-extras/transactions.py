"""@transactional as a proxy: a bean post-processor wraps the beans that have marked methods.

The proxy is what the context keeps, injects and returns; a call to a marked method goes
through `TransactionManager.run`, which binds the transaction's connection to the current
context (a contextvar, like Spring's TransactionSynchronizationManager binds it to the thread).
REQUIRED joins a bound transaction; REQUIRES_NEW binds a second connection until it returns,
then puts the caller's back. Inside the target, `self` is the target itself, so a call through
`self` never reaches the proxy: that is the blind spot the README explains.
"""

from __future__ import annotations

import contextvars
import functools
from typing import Any

import markers


class NoTransactionError(RuntimeError):
    """connection() was called where no transaction is in progress."""


class UnexpectedRollbackError(RuntimeError):
    """The starter would have committed, but a joined method marked the transaction."""


class TransactionManager:
    """Starts, joins, suspends and ends transactions on connections of one Engine."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self._bound: contextvars.ContextVar[Any] = contextvars.ContextVar(
            f"transaction_{id(self)}", default=None)

    def connection(self) -> Any:
        """The connection of the transaction in progress here."""
        bound = self._bound.get()
        if bound is None:
            raise NoTransactionError("no transaction in progress: only a call through the "
                                     "proxy to a @transactional method starts one")
        return bound[0]

    def run(self, attribute: markers.TransactionAttribute, fn: Any, *args: Any,
            **kwargs: Any) -> Any:
        """Call fn inside the transaction the attribute asks for."""
        if attribute.propagation not in (markers.REQUIRED, markers.REQUIRES_NEW):
            raise ValueError(f"unknown propagation {attribute.propagation!r}")
        joined = self._bound.get()
        if attribute.propagation == markers.REQUIRED and joined is not None:
            try:
                return fn(*args, **kwargs)   # join: the method that started it decides...
            except BaseException as error:   # ...but its own rules may mark it rollback-only
                if not isinstance(error, attribute.no_rollback_for):
                    joined[1] = True
                raise
        conn = self.engine.connect()         # a connection of its own: the caller's is suspended
        state = [conn, False]                # [connection, rollback-only]
        token = self._bound.set(state)
        try:
            conn.begin()
            try:
                result = fn(*args, **kwargs)
            except BaseException as error:
                if isinstance(error, attribute.no_rollback_for) and not state[1]:
                    conn.commit()
                else:
                    conn.rollback()
                raise
            if state[1]:
                conn.rollback()
                raise UnexpectedRollbackError("a method that joined marked it rollback-only")
            conn.commit()
            return result
        finally:
            self._bound.reset(token)         # resume the caller's transaction, if any
            conn.close()


def transactional_methods(cls: type) -> dict[str, markers.TransactionAttribute]:
    """The marked methods of a class and its bases, by name."""
    found: dict[str, markers.TransactionAttribute] = {}
    for klass in reversed(cls.__mro__):
        for name, member in vars(klass).items():
            attribute = getattr(member, "__transactional__", None)
            if isinstance(attribute, markers.TransactionAttribute):
                found[name] = attribute
            else:
                found.pop(name, None)
    return found


class TransactionalProxy:
    """Stands in for the target: marked methods run through the manager, the rest delegate.

    Every attribute read goes to the target (`__getattribute__`, not `__getattr__`), so the
    proxy's own state, kept in slots and read with `object.__getattribute__`, never hides an
    attribute of the bean that happens to share its name.
    """

    __slots__ = ("_dojo_target", "_dojo_manager", "_dojo_methods")

    def __init__(self, target: Any, manager: TransactionManager,
                 methods: dict[str, markers.TransactionAttribute]) -> None:
        object.__setattr__(self, "_dojo_target", target)
        object.__setattr__(self, "_dojo_manager", manager)
        object.__setattr__(self, "_dojo_methods", methods)

    def __getattribute__(self, name: str) -> Any:
        target = _own(self, "_dojo_target")
        value = getattr(target, name)         # a bound method of the target: self is the target
        attribute = _own(self, "_dojo_methods").get(name)
        if attribute is None or not callable(value):
            return value
        manager = _own(self, "_dojo_manager")

        @functools.wraps(value)
        def through_the_proxy(*args: Any, **kwargs: Any) -> Any:
            return manager.run(attribute, value, *args, **kwargs)
        return through_the_proxy

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(_own(self, "_dojo_target"), name, value)

    def __repr__(self) -> str:
        return f"TransactionalProxy({_own(self, '_dojo_target')!r})"


_own = object.__getattribute__      # the proxy's own slots, past its __getattribute__


class TransactionalPostProcessor(markers.BeanPostProcessor):
    """Wraps every bean with a @transactional method in a proxy; others stay as they are."""

    def __init__(self, manager: TransactionManager) -> None:
        self.manager = manager

    def after_init(self, bean: Any, name: str) -> Any:
        methods = transactional_methods(type(bean))
        if not methods:
            return bean
        return TransactionalProxy(bean, self.manager, methods)


__all__ = ["NoTransactionError", "TransactionManager", "TransactionalPostProcessor",
           "TransactionalProxy"]
