"""The embedded PostgreSQL asks every client for a password (SCRAM), and dojo never prints it."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import psycopg
import pytest

from tests.services.conftest import run_dojo


def _recorded_url(state: Path) -> str:
    return str(json.loads((state / "services.json").read_text())["postgres"]["url"])


def _port(state: Path) -> int:
    return int(json.loads((state / "services.json").read_text())["postgres"]["port"])


def test_a_client_without_the_password_is_refused(private_state: Path) -> None:
    up = run_dojo("services", "up")
    assert up.returncode == 0, up.stderr
    with pytest.raises(psycopg.OperationalError, match="password"):
        psycopg.connect(f"postgresql://postgres@127.0.0.1:{_port(private_state)}/postgres",
                        connect_timeout=5)
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        psycopg.connect(f"postgresql://postgres:guess@127.0.0.1:{_port(private_state)}/postgres",
                        connect_timeout=5)


def test_the_recorded_url_connects_and_its_files_are_owner_only(private_state: Path) -> None:
    assert run_dojo("services", "up").returncode == 0
    from dojo.services.postgres import libpq_url

    with psycopg.connect(libpq_url(_recorded_url(private_state)), connect_timeout=5) as conn:
        assert conn.execute("SELECT current_user").fetchone() == ("postgres",)
        # the incident lab's slow-query stage reads pg_stat_statements
        libraries = conn.execute("SHOW shared_preload_libraries").fetchone()
        assert libraries is not None and "pg_stat_statements" in str(libraries[0])
    for name in ("pg-password", "services.json"):
        mode = stat.S_IMODE((private_state / name).stat().st_mode)
        assert mode == 0o600, f"{name} is {oct(mode)}: the superuser's password would be readable"


def test_the_password_is_never_printed(private_state: Path) -> None:
    up = run_dojo("services", "up")
    password = (private_state / "pg-password").read_text().strip()
    status = run_dojo("services", "status")
    status_json = run_dojo("services", "status", "--json")
    for out in (up.stdout, up.stderr, status.stdout, status_json.stdout):
        assert password not in out
    assert "postgres:***@127.0.0.1" in up.stdout


def test_a_cluster_made_with_trust_is_switched_to_passwords(private_state: Path) -> None:
    """A state dir from an older dojo (initdb --auth=trust) asks for a password after `up`."""
    assert run_dojo("services", "up").returncode == 0
    assert run_dojo("services", "down").returncode == 0
    hba = private_state / "pgdata" / "pg_hba.conf"
    hba.write_text(hba.read_text().replace("scram-sha-256", "trust"))
    (private_state / "pg-password").unlink()
    up = run_dojo("services", "up")
    assert up.returncode == 0, up.stderr
    assert "trust" not in hba.read_text().split("# TYPE", 1)[-1]
    with pytest.raises(psycopg.OperationalError, match="password"):
        psycopg.connect(f"postgresql://postgres@127.0.0.1:{_port(private_state)}/postgres",
                        connect_timeout=5)
    from dojo.services.postgres import libpq_url

    with psycopg.connect(libpq_url(_recorded_url(private_state)), connect_timeout=5) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
