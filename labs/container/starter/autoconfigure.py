"""Auto-configurations shipped with the container, listed in auto_configuration.imports.

They are not under any application's base package and are never scanned: the context reads
the imports file and applies each class after the application's own beans are registered.
Name the libraries as strings and import them inside the @bean methods, so that this module
imports whether they are installed or not (README, stage 4).
"""

from __future__ import annotations

from markers import (  # noqa: F401  (you will need them)
    Environment,
    bean,
    conditional_on_class,
    conditional_on_missing_bean,
    conditional_on_property,
    configuration,
)

# To do (README, stage 4):
# - DataSourceAutoConfiguration: an SQLAlchemy Engine from dojo.datasource.url, only when
#   sqlalchemy can be imported, the property is set and the application has no Engine bean;
# - KafkaAutoConfiguration: a confluent-kafka Producer for dojo.kafka.bootstrap-servers with
#   every dojo.kafka.producer.* property, only when confluent_kafka can be imported, the
#   property is set and the application has no Producer bean.
#
# Stage 5: close() must release what these beans hold: @bean(destroy_method="...") names the
# method the context calls on the bean when it closes (the Engine's pool, the Producer's buffer).
