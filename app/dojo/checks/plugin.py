"""The pytest plugin every lab check and project test loads (`-p dojo.checks.plugin`).

Fixtures: `services` (session), `database`, `kafka`, `learner`. Marker
`needs_kafka("capability", …)`: on a broker without it the test is skipped with `NeedsBackend`
(a skip that carries the missing capabilities as data); dojo's runner reports it as
needs-backend, never as a pass.

Endpoints are resolved once per run: the runner resolves them in the parent and hands them to
this process in DOJO_ENDPOINTS (JSON); only without it (plain `pytest`) does this process
resolve, and start, the services itself.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path

import pytest

from dojo.checks.database import Database, create_database, drop_database
from dojo.checks.kafka import KafkaEnv
from dojo.checks.learner import Learner
from dojo.services.manager import ENDPOINTS_ENV, Endpoints

NEEDS_BACKEND = "needs-backend:"  # the skip reason's prefix (read by older reports too)


class NeedsBackend(pytest.skip.Exception):  # type: ignore[name-defined]
    """The check needs broker semantics this backend lacks: a skip, reported as needs-backend.

    Attributes:
        capabilities: what is missing (e.g. ("transactions",)).
        backend: the broker that lacks it.
    """

    def __init__(self, capabilities: tuple[str, ...], backend: str,
                 message: str | None = None) -> None:
        """`message` says what is missing and how to get it, for a need that is not a Kafka
        broker's (a PostgreSQL server started without a library); the default names Apache
        Kafka."""
        self.capabilities, self.backend = capabilities, backend
        super().__init__(
            f"{NEEDS_BACKEND} "
            + (message or f"needs Apache Kafka ({', '.join(capabilities)}); the {backend} "
               "broker lacks it. Run `dojo services up --kafka apache`."),
            allow_module_level=False)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("dojo")
    group.addoption("--dojo-impl", default=os.environ.get("DOJO_IMPL_DIR"),
                    help="directory with the learner code under test (workspace, solution, mutant)")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "stage(id): the lab stage a check belongs to")
    config.addinivalue_line(
        "markers", "needs_kafka(*capabilities): broker semantics the check depends on"
    )
    config.addinivalue_line("markers", "kafka: uses a Kafka broker (added automatically)")
    config.addinivalue_line("markers", "postgres: uses PostgreSQL (added automatically)")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        names = getattr(item, "fixturenames", ())
        if "kafka" in names or item.get_closest_marker("needs_kafka"):
            item.add_marker(pytest.mark.kafka)
        if "database" in names:
            item.add_marker(pytest.mark.postgres)


@lru_cache(maxsize=1)
def _endpoints() -> Endpoints:
    handed = os.environ.get(ENDPOINTS_ENV)
    if handed:
        return Endpoints.from_json(handed)
    from dojo.services.manager import resolve

    return resolve(start=True)


def pytest_runtest_setup(item: pytest.Item) -> None:
    marker = item.get_closest_marker("needs_kafka")
    if marker is None:
        return
    endpoints = _endpoints()
    missing = tuple(cap for cap in marker.args if cap not in endpoints.kafka_capabilities)
    if missing:
        raise NeedsBackend(missing, endpoints.kafka_backend)


@pytest.fixture(scope="session")
def services() -> Endpoints:
    """Where PostgreSQL and Kafka are; started on demand when nothing runs."""
    return _endpoints()


@pytest.fixture
def database(services: Endpoints, request: pytest.FixtureRequest) -> Iterator[Database]:
    """A fresh database `dojo_<hex>` for this test, dropped afterwards."""
    db = create_database(services, hint=request.node.name[:20])
    try:
        yield db
    finally:
        drop_database(services, db)


@pytest.fixture
def kafka(services: Endpoints) -> Iterator[KafkaEnv]:
    """Kafka configs tuned to the backend, and a factory of topics deleted afterwards."""
    env = KafkaEnv(services)
    try:
        yield env
    finally:
        env.close()


@pytest.fixture
def learner(request: pytest.FixtureRequest) -> Iterator[Learner]:
    """The code under test, from --dojo-impl (or DOJO_IMPL_DIR)."""
    impl = request.config.getoption("--dojo-impl")
    if not impl:
        pytest.fail("no learner code given: pass --dojo-impl DIR (dojo lab check does this)")
    learner = Learner(Path(impl))
    learner.purge()
    try:
        yield learner
    finally:
        learner.purge()
