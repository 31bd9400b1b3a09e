"""@transactional as a proxy (README, stage 6).

A bean post-processor wraps the beans that have @transactional methods in a proxy; the proxy
runs each marked method inside a transaction that the TransactionManager starts, joins or
suspends, and binds to the current context so that the bean's code finds its connection.
"""

from __future__ import annotations

from typing import Any

import markers


class NoTransactionError(RuntimeError):
    """connection() was called where no transaction is in progress."""


class TransactionManager:
    """Starts, joins, suspends and ends transactions on connections of one Engine."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    def connection(self) -> Any:
        """The connection of the transaction in progress here (README, stage 6)."""
        raise NotImplementedError("TransactionManager.connection (README, stage 6)")


class TransactionalPostProcessor(markers.BeanPostProcessor):
    """Wraps every bean with a @transactional method in a proxy (README, stage 6)."""

    def __init__(self, manager: TransactionManager) -> None:
        self.manager = manager

    def after_init(self, bean: Any, name: str) -> Any:
        raise NotImplementedError("TransactionalPostProcessor.after_init (README, stage 6)")
