"""Bring services up, take them down, and say what runs: the engine behind `dojo services`.

Environment:
  DOJO_DATABASE_URL     use this PostgreSQL instead of the embedded one
  DOJO_KAFKA_BOOTSTRAP  use this Kafka instead of an embedded broker
  DOJO_KAFKA_BACKEND    tansu (default) | apache: which embedded broker to start on demand
  DOJO_PG_PORT, DOJO_KAFKA_PORT  fixed ports for the embedded services
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from dojo.services import apache_kafka, postgres, tansu
from dojo.services.errors import ServiceError
from dojo.services.kafka_common import capabilities_for, check_external
from dojo.services.paths import state_dir
from dojo.services.spawn import terminate
from dojo.services.state import ServiceRecord, load_records, remove_record, update_record

KAFKA_BACKENDS = ("tansu", "apache")
ENDPOINTS_ENV = "DOJO_ENDPOINTS"  # the runner hands resolved endpoints to its check child
Log = Callable[[str], None]


@dataclass(frozen=True)
class Endpoints:
    """Where the services are, as the tests and labs need them."""

    database_url: str  # SQLAlchemy URL of the server's `postgres` database (admin connection)
    database_source: str  # embedded | external
    kafka_bootstrap: str
    kafka_backend: str  # tansu | apache | external

    @property
    def kafka_capabilities(self) -> frozenset[str]:
        return capabilities_for(self.kafka_backend)

    @property
    def database_owned(self) -> bool:
        """Whether dojo may create and drop databases on this server without being told."""
        return self.database_source == "embedded"

    def to_json(self) -> str:
        """The endpoints as JSON (what the runner puts in DOJO_ENDPOINTS)."""
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Endpoints:
        """Endpoints from `to_json`'s text; ValueError when it is something else."""
        try:
            raw = json.loads(text)
            return cls(**{f.name: str(raw[f.name]) for f in fields(cls)})
        except (ValueError, TypeError, KeyError) as exc:
            raise ValueError(f"not a services description: {text[:200]!r}") from exc


@dataclass(frozen=True)
class ServiceStatus:
    name: str
    backend: str
    state: str  # up | dead | stopped | external | unreachable
    url: str = ""
    pid: int | None = None
    detail: str = ""

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


LOCK_SECONDS = 120.0  # a Maven download under `up --kafka apache` can hold it a while


@contextmanager
def _locked() -> Iterator[None]:
    """One `up`/`down` at a time across processes (parallel test runs start services on demand).

    The holder writes its pid into the lock file; a waiter gives up after LOCK_SECONDS
    (DOJO_SERVICES_LOCK_SECONDS) with a ServiceError naming that pid."""
    limit = float(os.environ.get("DOJO_SERVICES_LOCK_SECONDS") or LOCK_SECONDS)
    path = state_dir() / "services.lock"
    with open(path, "a+") as handle:
        deadline = time.monotonic() + limit
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise ServiceError(_lock_holder_message(path, limit)) from None
                time.sleep(0.1)
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        try:
            yield
        finally:
            handle.seek(0)
            handle.truncate()
            handle.flush()
            fcntl.flock(handle, fcntl.LOCK_UN)


def _lock_holder_message(path: Path, waited: float) -> str:
    import psutil

    text = path.read_text().strip()
    holder = f"pid {text}" if text.isdigit() else "another process"
    if text.isdigit():
        try:
            holder += f" ({' '.join(psutil.Process(int(text)).cmdline())[:120]})"
        except psutil.Error:
            pass
    return (f"the services lock {path} is held by {holder}; waited {waited:g} s. Fix: let it "
            "finish, or stop it, then run the command again.")


def _quiet(_: str) -> None:
    pass


def default_kafka_backend() -> str:
    backend = os.environ.get("DOJO_KAFKA_BACKEND", "tansu")
    if backend not in KAFKA_BACKENDS:
        raise ServiceError(
            f"DOJO_KAFKA_BACKEND={backend!r} is not one of {', '.join(KAFKA_BACKENDS)}."
        )
    return backend


def _start_kafka(backend: str, recorded_port: int | None) -> ServiceRecord:
    if backend == "apache":
        return apache_kafka.start_apache(recorded_port)
    return tansu.start_tansu(recorded_port)


def up(kafka_backend: str | None = None, *, postgres_wanted: bool = True,
       kafka_wanted: bool = True, log: Log = _quiet) -> Endpoints:
    """Start what is neither configured externally nor already running; return the endpoints.

    Running `up` twice is harmless. Asking for another Kafka backend than the one running
    stops the running one first.
    """
    with _locked():
        records = load_records()
        external_db = os.environ.get("DOJO_DATABASE_URL")
        external_kafka = os.environ.get("DOJO_KAFKA_BOOTSTRAP")

        if external_db:
            postgres.check_reachable(external_db, f"DOJO_DATABASE_URL={external_db}")
            db_url, db_source = postgres.sqlalchemy_url(external_db), "external"
            log(f"postgres  external  {redact(external_db)}")
        elif postgres_wanted or "postgres" in records:
            rec = records.get("postgres")
            if rec and rec.is_alive():
                log(f"postgres  embedded  already up on port {rec.port} (pid {rec.pid})")
            else:
                if rec:
                    log(f"postgres  embedded  was dead (pid {rec.pid}); starting again")
                rec = postgres.start_embedded(rec.port if rec else None)
                update_record(rec)
                log(f"postgres  embedded  started on port {rec.port} (pid {rec.pid})")
            db_url, db_source = rec.url, "embedded"
        else:
            db_url, db_source = "", "none"

        if external_kafka:
            check_external(external_kafka)
            bootstrap, backend = external_kafka, "external"
            log(f"kafka     external  {external_kafka}")
        elif kafka_wanted or "kafka" in records:
            wanted = kafka_backend or (records["kafka"].backend if "kafka" in records
                                       else default_kafka_backend())
            rec = records.get("kafka")
            if rec and rec.is_alive() and rec.backend != wanted:
                log(f"kafka     {rec.backend}  stopping (switching to {wanted})")
                terminate(rec.pid)
                remove_record("kafka")
                rec = None
            if rec and rec.is_alive():
                log(f"kafka     {rec.backend}  already up on {rec.url} (pid {rec.pid})")
            else:
                if rec:
                    log(f"kafka     {rec.backend}  was dead (pid {rec.pid}); starting again")
                recorded_port = rec.port if rec and rec.backend == wanted else None
                log(f"kafka     {wanted}  starting…")
                rec = _start_kafka(wanted, recorded_port)
                update_record(rec)
                log(f"kafka     {wanted}  started on {rec.url} (pid {rec.pid})")
            bootstrap, backend = rec.url, rec.backend
        else:
            bootstrap, backend = "", "none"

        return Endpoints(db_url, db_source, bootstrap, backend)


def down(*, force: bool = False, log: Log = _quiet) -> None:
    """Stop what dojo started (never an external service). `force` also copes with a corrupt
    state file, finding dojo's processes by their data directories."""
    with _locked():
        if force:
            _force_stop(log)
            return
        records = load_records()
        if not records:
            log("nothing dojo started is recorded as running")
        for name, rec in records.items():
            if not rec.is_alive():
                log(f"{name:<9} {rec.backend}  was already dead (pid {rec.pid})")
            elif name == "postgres":
                postgres.stop_embedded(rec)
                log(f"postgres  embedded  stopped (pid {rec.pid})")
            else:
                terminate(rec.pid)
                log(f"{name:<9} {rec.backend}  stopped (pid {rec.pid})")
            remove_record(name)


def _force_stop(log: Log) -> None:
    """Stop what dojo started for this state dir, known by identity only: a recorded pid whose
    start time still matches, or a process carrying the service marker in its environment.
    A process that merely mentions the state dir on its command line is left alone."""
    from dojo.services.state import state_file

    for pid, name in sorted(_own_service_processes().items()):
        log(f"stopping {name} (pid {pid})")
        terminate(pid)
    path = state_file()
    if path.exists():
        path.unlink()
        log(f"removed {path}")


def _own_service_processes() -> dict[int, str]:
    import psutil

    from dojo.services.spawn import MARKER_ENV, service_marker

    found: dict[int, str] = {}
    try:
        records = load_records()
    except ServiceError:
        records = {}
    for record in records.values():
        if record.is_alive():
            found[record.pid] = f"{record.name} ({record.backend})"
    marker = service_marker()
    for proc in psutil.process_iter(["pid", "name"]):
        if proc.pid == os.getpid() or proc.pid in found:
            continue
        try:
            if proc.environ().get(MARKER_ENV) == marker:
                found[proc.pid] = str(proc.info.get("name"))
        except psutil.Error:
            continue
    return found


def status() -> list[ServiceStatus]:
    """What runs now, checked live: a recorded process that died is `dead`, not `up`."""
    records = load_records()
    out: list[ServiceStatus] = []
    external_db = os.environ.get("DOJO_DATABASE_URL")
    if external_db:
        try:
            postgres.check_reachable(external_db, "DOJO_DATABASE_URL", timeout=3)
            out.append(ServiceStatus("postgres", "external", "external", redact(external_db)))
        except ServiceError as exc:
            out.append(ServiceStatus("postgres", "external", "unreachable",
                                     redact(external_db), detail=str(exc)))
    else:
        out.append(_record_status("postgres", records.get("postgres"), "embedded"))
    external_kafka = os.environ.get("DOJO_KAFKA_BOOTSTRAP")
    if external_kafka:
        try:
            check_external(external_kafka)
            out.append(ServiceStatus("kafka", "external", "external", external_kafka))
        except ServiceError as exc:
            out.append(ServiceStatus("kafka", "external", "unreachable", external_kafka,
                                     detail=str(exc)))
    else:
        out.append(_record_status("kafka", records.get("kafka"), default_kafka_backend()))
    return out


def _record_status(name: str, rec: ServiceRecord | None, default_backend: str) -> ServiceStatus:
    if rec is None:
        return ServiceStatus(name, default_backend, "stopped",
                             detail="start it with `dojo services up`")
    if not rec.is_alive():
        return ServiceStatus(name, rec.backend, "dead", _shown(rec), rec.pid,
                             detail=f"pid {rec.pid} is gone; see {rec.log}; "
                                    "`dojo services up` starts it again")
    return ServiceStatus(name, rec.backend, "up", _shown(rec), rec.pid)


def _shown(rec: ServiceRecord) -> str:
    """The record's URL as dojo prints it: PostgreSQL's password masked."""
    return redact(rec.url) if rec.name == "postgres" else rec.url


def resolve(*, start: bool = True) -> Endpoints:
    """The endpoints to use now: external ones, else running ones, else started on demand."""
    records = load_records()
    db = records.get("postgres")
    kafka = records.get("kafka")
    db_ok = bool(os.environ.get("DOJO_DATABASE_URL")) or bool(db and db.is_alive())
    kafka_ok = bool(os.environ.get("DOJO_KAFKA_BOOTSTRAP")) or bool(kafka and kafka.is_alive())
    if not (db_ok and kafka_ok) and not start:
        raise ServiceError("Services are not running. Fix: `dojo services up`.")
    # Starts what is missing; when everything runs it only re-checks and returns the endpoints.
    return up(kafka.backend if kafka else None)


def redact(url: str) -> str:
    """A database URL with its password masked, for what dojo prints."""
    from sqlalchemy.engine import make_url

    try:
        return make_url(postgres.sqlalchemy_url(url)).render_as_string(hide_password=True)
    except Exception:
        return url
