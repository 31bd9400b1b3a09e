"""What a check run created, written down before it is created, so it can be dropped however
the run ended (a hang killed, a crash, a kill -9 of the whole app).

The runner gives each run a ledger file under the state dir (`runs/<pid>-<id>.jsonl`, named by
DOJO_RUN_LEDGER in the child's environment). The `database` and `kafka` fixtures append a line
before each CREATE; the runner drops what is listed after every child ends, and
`dojo services up` sweeps the ledgers of runs whose process is gone.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path

LEDGER_ENV = "DOJO_RUN_LEDGER"


def runs_dir() -> Path:
    from dojo.services.paths import state_dir

    return state_dir() / "runs"


def new_ledger() -> Path:
    """A fresh ledger path for a run of this process (the file appears on first record)."""
    folder = runs_dir()
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"{os.getpid()}-{uuid.uuid4().hex[:8]}.jsonl"


def record(kind: str, name: str) -> None:
    """In the child: note that a `kind` (database | role | topic) called `name` is about to
    exist."""
    path = os.environ.get(LEDGER_ENV)
    if not path:
        return
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps({"kind": kind, "name": name}) + "\n")
        handle.flush()
        os.fsync(handle.fileno())


def entries(path: Path) -> list[tuple[str, str]]:
    """(kind, name) pairs in `path`; torn or foreign lines are skipped."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        try:
            raw = json.loads(line)
            out.append((str(raw["kind"]), str(raw["name"])))
        except (ValueError, KeyError, TypeError):
            continue
    return out


def drop_recorded(path: Path, log: Callable[[str], None] = lambda _: None) -> list[str]:
    """Drop every database and topic in `path` that still exists; what was dropped.

    The ledger is removed once everything in it is gone; kept when a service was unreachable,
    so the next sweep tries again."""
    items = entries(path)
    if not items:
        path.unlink(missing_ok=True)
        return []
    dropped: list[str] = []
    complete = True
    databases = [name for kind, name in items if kind == "database"]
    roles = [name for kind, name in items if kind == "role"]
    topics = [name for kind, name in items if kind == "topic"]
    try:
        dropped += _drop_databases(databases, roles)
    except Exception as exc:  # noqa: BLE001 - a sweep reports, the run's result stands
        complete = False
        log(f"could not drop databases {', '.join(databases)}: {exc}")
    try:
        dropped += _delete_topics(topics)
    except Exception as exc:  # noqa: BLE001
        complete = False
        log(f"could not delete topics {', '.join(topics)}: {exc}")
    if complete:
        path.unlink(missing_ok=True)
    return dropped


def _drop_databases(names: list[str], roles: Sequence[str] = ()) -> list[str]:
    """Drop the databases, then the roles that owned them (a role goes after its database)."""
    if not names and not roles:
        return []
    import psycopg

    from dojo.runner.guard import check_database_name
    from dojo.services.manager import resolve
    from dojo.services.postgres import libpq_url

    endpoints = resolve(start=False)
    done = []
    with psycopg.connect(libpq_url(endpoints.database_url), autocommit=True,
                         connect_timeout=10) as conn:
        present = {row[0] for row in conn.execute("SELECT datname FROM pg_database")}
        for name in names:
            check_database_name(name)
            if name in present:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
                done.append(name)
        existing = {row[0] for row in conn.execute("SELECT rolname FROM pg_roles")}
        for role in roles:
            check_database_name(role)  # roles carry their database's dojo_… name
            if role in existing:
                conn.execute(f'DROP ROLE IF EXISTS "{role}"')
                done.append(f"role {role}")
    return done


def _delete_topics(names: list[str]) -> list[str]:
    if not names:
        return []
    from confluent_kafka.admin import AdminClient

    from dojo.runner.guard import check_topic_name
    from dojo.services.manager import resolve

    endpoints = resolve(start=False)
    admin = AdminClient({"bootstrap.servers": endpoints.kafka_bootstrap})
    present = set(admin.list_topics(timeout=10).topics)
    wanted = [name for name in names if name in present]
    for name in wanted:
        check_topic_name(name)
    if wanted:
        for future in admin.delete_topics(wanted, operation_timeout=10).values():
            future.result(timeout=20)
    return wanted


def sweep_dead_runs(log: Callable[[str], None] = lambda _: None) -> list[str]:
    """Drop what the ledgers of finished or killed runs list (their pid is gone)."""
    import psutil

    folder = runs_dir()
    if not folder.is_dir():
        return []
    dropped: list[str] = []
    for path in sorted(folder.glob("*.jsonl")):
        try:
            pid = int(path.name.split("-", 1)[0])
        except ValueError:
            continue
        if psutil.pid_exists(pid):
            continue  # a run in progress
        dropped += drop_recorded(path, log)
    return dropped
