"""What every Kafka backend shares: readiness polling, reachability checks, capabilities."""

from __future__ import annotations

import time
from typing import Any

from dojo.services.errors import ServiceError

# What a check may require of a broker. Apache Kafka (and an external cluster) has all of them;
# embedded Tansu lacks all but auto-creation, as measured in tests/kafka/test_backend_gaps.py.
ALL_CAPABILITIES = frozenset(
    {
        "transactions",  # read_committed hides aborted transactional records
        "create_partitions",  # CreatePartitions
        "delete_records",  # DeleteRecords
        "describe_configs",  # full DescribeConfigs
        "compaction",  # cleanup.policy=compact
        "retention",  # time/size retention deletes old segments
        "auto_create_topics",
        "fast_group_join",  # a new group gets its first record well under a second
        "exact_high_watermark",  # ListOffsets(latest) is last offset + 1, also after a batch
    }
)
TANSU_CAPABILITIES: frozenset[str] = frozenset({"auto_create_topics"})  # measured


def capabilities_for(backend: str) -> frozenset[str]:
    return TANSU_CAPABILITIES if backend == "tansu" else ALL_CAPABILITIES


def broker_answers(bootstrap: str, timeout: float) -> str | None:
    """None when the broker answers a metadata request in time, else the error text."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    config: dict[str, Any] = {"bootstrap.servers": bootstrap, "socket.timeout.ms": 2000,
                              "log_level": 0, "logger": _silent_logger()}
    admin = AdminClient(config)
    try:
        admin.list_topics(timeout=timeout)
        return None
    except KafkaException as exc:
        return str(exc.args[0]) if exc.args else str(exc)


def wait_until_ready(bootstrap: str, timeout: float, is_alive: object = None) -> None:
    """Poll with an admin client until the broker answers, or raise with what it said last."""
    deadline = time.monotonic() + timeout
    last = "no answer"
    while time.monotonic() < deadline:
        if callable(is_alive) and not is_alive():
            raise ServiceError(f"The broker at {bootstrap} exited while starting.")
        err = broker_answers(bootstrap, timeout=1.0)
        if err is None:
            return
        last = err
        time.sleep(0.1)
    raise ServiceError(f"The broker at {bootstrap} did not answer within {timeout:.0f} s: {last}")


def check_external(bootstrap: str) -> None:
    err = broker_answers(bootstrap, timeout=5.0)
    if err is not None:
        raise ServiceError(
            f"DOJO_KAFKA_BOOTSTRAP={bootstrap} does not answer: {err}. Fix: start that broker "
            "(for the compose setup: `docker compose up -d kafka`), correct the address, or "
            "unset DOJO_KAFKA_BOOTSTRAP to use the embedded broker (`dojo services up`)."
        )


def _silent_logger() -> object:
    """librdkafka logs connection refusals while we poll for readiness; those are expected."""
    import logging

    logger = logging.getLogger("dojo.kafka.poll")
    logger.addHandler(logging.NullHandler())
    logger.propagate = False
    return logger
