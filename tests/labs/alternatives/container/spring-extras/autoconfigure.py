"""Auto-configurations shipped with the container, listed in auto_configuration.imports.

They are not under any application's base package and are never scanned: the context reads
the imports file and applies each class after the application's own beans are registered, so
`@conditional_on_missing_bean` sees the user's beans and backs off. The libraries are named
as strings and imported inside the @bean methods, only once `@conditional_on_class` (which
uses find_spec, not import) has matched: this module imports whether they exist or not.
"""

from __future__ import annotations

from typing import Any

from markers import (
    Environment,
    bean,
    conditional_on_class,
    conditional_on_missing_bean,
    conditional_on_property,
    configuration,
)


@configuration
@conditional_on_class("sqlalchemy")
@conditional_on_property("dojo.datasource.url")
class DataSourceAutoConfiguration:
    """An SQLAlchemy Engine from dojo.datasource.url, unless the application defines one."""

    @bean(destroy_method="dispose")           # close() closes the pool's connections
    @conditional_on_missing_bean("sqlalchemy.Engine")
    def engine(self, environment: Environment) -> sqlalchemy.Engine:  # type: ignore[name-defined]  # noqa: F821
        from sqlalchemy import create_engine
        from sqlalchemy.pool import NullPool
        return create_engine(environment.get("dojo.datasource.url") or "", poolclass=NullPool)


@configuration
@conditional_on_class("confluent_kafka")
@conditional_on_property("dojo.kafka.bootstrap-servers")
class KafkaAutoConfiguration:
    """A confluent-kafka Producer for dojo.kafka.bootstrap-servers, unless one is defined."""

    @bean(destroy_method="flush")             # close() delivers what is still buffered
    @conditional_on_missing_bean("confluent_kafka.Producer")
    def producer(self, environment: Environment) -> confluent_kafka.Producer:  # type: ignore[name-defined]  # noqa: F821
        from confluent_kafka import Producer
        return Producer({"bootstrap.servers": environment.get("dojo.kafka.bootstrap-servers"),
                         **environment.with_prefix("dojo.kafka.producer.")})


_IDEMPOTENCE_BOUNDS = {"max.in.flight.requests.per.connection", "max.in.flight", "retries",
                       "message.send.max.retries"}
