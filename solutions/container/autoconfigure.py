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
        url = environment.get("dojo.datasource.url") or ""
        pool_size = int(environment.get("dojo.datasource.pool-size") or 5)
        return create_engine(url, pool_size=pool_size, pool_pre_ping=True)


@configuration
@conditional_on_class("confluent_kafka")
@conditional_on_property("dojo.kafka.bootstrap-servers")
class KafkaAutoConfiguration:
    """A confluent-kafka Producer for dojo.kafka.bootstrap-servers, unless one is defined."""

    @bean(destroy_method="flush")             # close() delivers what is still buffered
    @conditional_on_missing_bean("confluent_kafka.Producer")
    def producer(self, environment: Environment) -> confluent_kafka.Producer:  # type: ignore[name-defined]  # noqa: F821
        from confluent_kafka import Producer
        config: dict[str, Any] = dict(environment.with_prefix("dojo.kafka.producer."))
        if not {"acks", "request.required.acks"} & set(config):
            config["acks"] = "all"
        acks = str(config.get("acks", config.get("request.required.acks"))).lower()
        # idempotence needs acks=all, at most 5 requests in flight and retries: a default
        # only where the application's own keys leave it room (the Producer would refuse them)
        if acks in ("all", "-1") and not _IDEMPOTENCE_BOUNDS & set(config):
            config.setdefault("enable.idempotence", True)
        config["bootstrap.servers"] = environment.get("dojo.kafka.bootstrap-servers")
        return Producer(config)


_IDEMPOTENCE_BOUNDS = {"max.in.flight.requests.per.connection", "max.in.flight", "retries",
                       "message.send.max.retries"}
