"""Fixtures for the tracing checks (on top of the kit's database, kafka and learner)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
from _support import Answer, AppServer, Inventory, Logs, RecordingExecutor, Spans, awaited
from confluent_kafka import OFFSET_BEGINNING, TopicPartition
from sqlalchemy import text

from dojo.checks import apply_schema, call
from dojo.checks.database import Database, create_database, drop_database

T = TypeVar("T")
TICK_S = 0.02  # how often post_async(ticks=) looks whether the event loop is free


@pytest.fixture
def spans() -> Iterator[Spans]:
    """A tracer for the learner's code; every finished span is kept in memory."""
    collected = Spans()
    yield collected
    collected.shutdown()


@pytest.fixture
def logs(learner: Any) -> Iterator[Logs]:
    """The learner's log handler on `orders.api` (orders-api) and `orders.consumer`
    (shipping), writing to memory."""
    captured = Logs(learner).install()
    yield captured
    captured.uninstall()


@pytest.fixture
def inventory(spans: Spans) -> Iterator[Inventory]:
    """The inventory service the API calls, on 127.0.0.1."""
    service = Inventory(spans).start()
    yield service
    service.close()


@dataclass
class Shop:
    """One test's order service: the learner's modules and the Deps handed to them."""

    deps: Any
    module: Any
    api: Any
    consumer: Any
    telemetry: Any
    kafka: Any
    spans: Spans
    inventory: Inventory
    logs: Logs
    _server: AppServer | None = None
    jobs_submitted: int = 0

    @property
    def server(self) -> AppServer:
        """The WSGI app (`api.create_app(deps)`) served on 127.0.0.1, started on first use."""
        if self._server is None:
            self._server = AppServer(call(self.api.create_app, self.deps))
        return self._server

    def drain_executor(self) -> None:
        """Wait for the work handed to the thread pool, then give the shop a fresh pool."""
        self.deps.executor.shutdown(wait=True)
        self.deps.executor = RecordingExecutor(2)

    def consumer_for(self, topic: str) -> Any:
        """A consumer assigned to `topic` from the start (no group join to wait for)."""
        consumer = self.kafka.consumer()
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        return consumer

    def consume(self, count: int, topic: str | None = None, timeout: float = 15.0,
                **kwargs: Any) -> int:
        consumer = self.consumer_for(topic or self.deps.topic)
        try:
            return int(call(self.consumer.consume, self.deps, consumer, max_records=count,
                            timeout_seconds=timeout, **kwargs))
        finally:
            consumer.close()

    def run_async(self, make: Callable[[], Awaitable[T]], threads: int = 64) -> T:
        """Run a coroutine on a fresh event loop whose default executor has `threads` threads,
        with `deps.jobs` started on it; wait for every background job and task it left."""
        jobs_class = self.module.BackgroundJobs

        async def main() -> T:
            loop = asyncio.get_running_loop()
            loop.set_default_executor(ThreadPoolExecutor(threads, thread_name_prefix="loop"))
            self.deps.jobs = jobs = jobs_class()
            jobs.start()
            submit = jobs.submit

            def counted(job: Any) -> None:
                self.jobs_submitted += 1
                submit(job)

            jobs.submit = counted
            started = set(asyncio.all_tasks())  # the jobs worker: it never ends by itself
            try:
                result = await make()
                if self.deps.jobs is not None:
                    await asyncio.wait_for(self.deps.jobs.drain(), 15)
                others = [t for t in asyncio.all_tasks() - started
                          if t is not asyncio.current_task()]
                if others:
                    await asyncio.wait(others, timeout=15)
                return result
            finally:
                if self.deps.jobs is not None:
                    await self.deps.jobs.stop()
                    self.deps.jobs = None

        return asyncio.run(main())

    def post_async(self, body: dict[str, Any] | bytes, headers: dict[str, str],
                   ticks: list[float] | None = None) -> Answer:
        """One request through `api.handle_order_async` on a fresh event loop (whose default
        executor has threads of its own), its background jobs and pool work waited for. With
        `ticks`, a task of the check's appends the real time to it every TICK_S while the
        handler runs: a gap says the loop ran nothing else meanwhile (it was blocked)."""

        async def tick() -> None:
            assert ticks is not None
            while True:
                ticks.append(time.monotonic())
                await asyncio.sleep(TICK_S)

        async def one() -> Answer:
            ticker = asyncio.create_task(tick()) if ticks is not None else None
            if ticker is not None:
                await asyncio.sleep(0)  # its first tick, before the handler can block the loop
            try:
                raw = body if isinstance(body, bytes) else json.dumps(body).encode()
                response = await awaited(self.api.handle_order_async(self.deps, headers, raw))
            finally:
                if ticker is not None:
                    ticker.cancel()
                    ticks.append(time.monotonic())  # type: ignore[union-attr]
            return Answer(int(response.status), dict(response.body))

        answer = self.run_async(one)
        self.drain_executor()
        return answer

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
        self.deps.executor.shutdown(wait=True)


@pytest.fixture(scope="session")
def shop_database(services: Any, request: pytest.FixtureRequest) -> Iterator[Database]:
    """One database for the run's checks, schema.sql applied once: CREATE DATABASE costs
    0.2-1 s on a loaded machine, and the tables are the lab's own (given, not written by the
    learner), so emptying them between checks isolates the checks as well."""
    db = create_database(services, hint="tracing")
    try:
        apply_schema(db.engine, Path(request.config.getoption("--dojo-impl")).resolve())
        yield db
    finally:
        drop_database(services, db)


@pytest.fixture
def database(shop_database: Database) -> Iterator[Database]:
    """The run's database, its tables emptied; engines made here are disposed after the
    check, so nothing of one check's connections reaches the next."""
    with shop_database.engine.begin() as conn:
        conn.execute(text("TRUNCATE orders, shipments"))
    made = len(shop_database._engines)
    yield shop_database
    for engine in shop_database._engines[made:]:
        engine.dispose()
    del shop_database._engines[made:]


@pytest.fixture
def shop(database: Any, kafka: Any, learner: Any, spans: Spans, inventory: Inventory,
         logs: Logs) -> Iterator[Shop]:
    """The learner's service wired to the run's database (schema.sql applied, tables empty),
    a fresh topic and dead letter topic, the check's tracer, a thread pool and the inventory
    service."""
    shop_module = learner.module("shop")
    deps = shop_module.Deps(
        engine=database.make_engine(pool_size=10, max_overflow=60, pool_timeout=20),
        producer=kafka.producer(**{"linger.ms": 2}),
        topic=kafka.topic(1, hint="orders"),
        tracer=spans.tracer,
        executor=RecordingExecutor(2),
        inventory_url=inventory.url,
        dlt_topic=kafka.topic(1, hint="orders-dlt"),
    )
    built = Shop(deps=deps, module=shop_module, api=learner.module("api"),
                 consumer=learner.module("consumer"), telemetry=learner.module("telemetry"),
                 kafka=kafka, spans=spans, inventory=inventory, logs=logs)
    yield built
    built.close()
    deps.producer.flush(5)


@pytest.fixture
def logs_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "logs"
    folder.mkdir()
    return folder
