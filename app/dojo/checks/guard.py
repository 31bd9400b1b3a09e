"""The safety guard: dojo creates and drops only what is its own.

A server is dojo's when dojo started it (embedded), when it carries dojo's marker (a database
named `dojo_owned`, a topic named `dojo.owned`), or when the user said so explicitly with
DOJO_ALLOW_EXTERNAL=1. Databases it creates are named `dojo_…`, topics `dojo.…`, and it drops
only the ones it created itself.
"""

from __future__ import annotations

import os

from dojo.services.manager import Endpoints

DB_PREFIX = "dojo_"
TOPIC_PREFIX = "dojo."
MARKER_TOPIC = "dojo.owned"


class GuardError(RuntimeError):
    """dojo was about to write somewhere that is not its own."""


def explicitly_allowed() -> bool:
    return os.environ.get("DOJO_ALLOW_EXTERNAL") == "1"


def check_database_server(endpoints: Endpoints) -> None:
    from dojo.services.postgres import MARKER_DB, has_marker

    if endpoints.database_owned or explicitly_allowed() or has_marker(endpoints.database_url):
        return
    raise GuardError(
        f"dojo did not create the PostgreSQL server at DOJO_DATABASE_URL and will not create or "
        f"drop databases on it. If this server is meant for dojo, create an empty database named "
        f"{MARKER_DB} on it (the docker compose setup does), or set DOJO_ALLOW_EXTERNAL=1."
    )


def check_database_name(name: str) -> None:
    if not name.startswith(DB_PREFIX):
        raise GuardError(
            f"refusing to touch database {name!r}: dojo's databases start with {DB_PREFIX}"
        )


def check_kafka_cluster(endpoints: Endpoints, topics: set[str]) -> None:
    if endpoints.kafka_backend != "external" or explicitly_allowed() or MARKER_TOPIC in topics:
        return
    raise GuardError(
        f"dojo did not start the Kafka cluster at DOJO_KAFKA_BOOTSTRAP and will not create or "
        f"delete topics on it. If it is meant for dojo, create a topic named {MARKER_TOPIC} on it "
        "(the docker compose setup does), or set DOJO_ALLOW_EXTERNAL=1."
    )


def check_topic_name(name: str) -> None:
    if not name.startswith(TOPIC_PREFIX):
        raise GuardError(
            f"refusing to touch topic {name!r}: dojo's topics start with {TOPIC_PREFIX}"
        )
