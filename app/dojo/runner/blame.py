"""Whose fault is it? A connection error is the learner's only while the service still runs.

When a check ends with a database or broker connection error and the service is unreachable
right now, the service broke, not the learner's code: the check is `infra`, with the service
named and the command that fixes it. A live service means the learner's code is to blame (a
wrong URL, a connection it closed itself), and the normal diagnosis stands.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from dojo.services.manager import Endpoints

FIX = "`dojo services up`"
PROBE_SECONDS = 2.0


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _is_database_connection_error(exc: BaseException) -> bool:
    kinds: list[type[BaseException]] = []
    try:
        import psycopg

        kinds += [psycopg.OperationalError, psycopg.InterfaceError]
    except ImportError:
        pass
    try:
        import sqlalchemy.exc

        kinds += [sqlalchemy.exc.OperationalError, sqlalchemy.exc.InterfaceError]
    except ImportError:
        pass
    return isinstance(exc, tuple(kinds))


def _is_broker_connection_error(exc: BaseException) -> bool:
    try:
        from confluent_kafka import KafkaError, KafkaException
    except ImportError:
        return False
    if not isinstance(exc, KafkaException) or not exc.args:
        return False
    error = exc.args[0]
    return isinstance(error, KafkaError) and error.code() in (
        KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN, KafkaError._TIMED_OUT)


def _reachable(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=PROBE_SECONDS):
            return True
    except OSError:
        return False


def _handed() -> Endpoints | None:
    """The endpoints the runner handed its check child (the child cannot read the state dir:
    dojo.runner.sandbox keeps it out of reach)."""
    from dojo.services.manager import ENDPOINTS_ENV, Endpoints

    text = os.environ.get(ENDPOINTS_ENV)
    return Endpoints.from_json(text) if text else None


def _recorded_url(service: str) -> str:
    """The URL of `service` in the services' record, alive or not ("" when none)."""
    from dojo.services.state import load_records

    record = load_records().get(service)
    return record.url if record else ""


def _database_address() -> tuple[str, int] | None:
    """Where PostgreSQL should be, from the environment or the record (alive or not)."""
    handed = _handed()
    url = os.environ.get("DOJO_DATABASE_URL") or (
        handed.database_url if handed else _recorded_url("postgres"))
    if not url:
        return None
    parts = urlsplit(url)
    return (parts.hostname or "127.0.0.1", parts.port or 5432)


def _broker_address() -> tuple[str, int] | None:
    """Where the first Kafka broker should be, from the environment or the record."""
    handed = _handed()
    bootstrap = os.environ.get("DOJO_KAFKA_BOOTSTRAP") or (
        handed.kafka_bootstrap if handed else _recorded_url("kafka"))
    if not bootstrap:
        return None
    host, _, port = bootstrap.split(",")[0].rpartition(":")
    return (host or "127.0.0.1", int(port))


def infra_failure(exc: BaseException) -> str:
    """The message for a check that `exc` ended because a service broke, or "" if it did not."""
    for link in _chain(exc):
        if _is_database_connection_error(link):
            service, where = "PostgreSQL", _safe(_database_address)
        elif _is_broker_connection_error(link):
            service, where = "Kafka", _safe(_broker_address)
        else:
            continue
        if where is None or _reachable(*where):
            return ""
        first = (str(link).strip().splitlines() or [type(link).__name__])[0]
        return (f"{service} at {where[0]}:{where[1]} stopped answering during the check "
                f"({first}). This is not your code: run {FIX}, then check again. "
                "Earlier passes are kept.")
    return ""


def _safe(find: Callable[[], tuple[str, int] | None]) -> tuple[str, int] | None:
    try:
        return find()
    except Exception:  # noqa: BLE001 - no address known: leave the blame to the normal path
        return None
