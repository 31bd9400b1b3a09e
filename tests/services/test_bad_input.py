"""Bad input gets a clear error with the fix in it, and nothing is left half-started."""

from __future__ import annotations

import json
import socket

from dojo.services.ports import free_port
from tests.services.conftest import run_dojo


def test_wrong_database_url_is_named_with_the_fix(private_state):
    url = f"postgresql://nobody@127.0.0.1:{free_port()}/nowhere"
    out = run_dojo("services", "up", env={"DOJO_DATABASE_URL": url})
    assert out.returncode == 1
    assert "DOJO_DATABASE_URL" in out.stderr and "does not answer" in out.stderr
    assert "unset DOJO_DATABASE_URL" in out.stderr


def test_a_url_that_is_not_postgres_is_refused(private_state):
    out = run_dojo("services", "up", env={"DOJO_DATABASE_URL": "mysql://x@localhost/db"})
    assert out.returncode == 1
    assert "is not a PostgreSQL URL" in out.stderr


def test_unreachable_kafka_bootstrap_is_named_with_the_fix(private_state):
    bootstrap = f"127.0.0.1:{free_port()}"
    out = run_dojo("services", "up", env={"DOJO_KAFKA_BOOTSTRAP": bootstrap})
    assert out.returncode == 1
    assert f"DOJO_KAFKA_BOOTSTRAP={bootstrap} does not answer" in out.stderr
    status = run_dojo("services", "status", "--json", env={"DOJO_KAFKA_BOOTSTRAP": bootstrap})
    kafka = [row for row in json.loads(status.stdout) if row["name"] == "kafka"][0]
    assert kafka["state"] == "unreachable"


def test_a_taken_port_names_its_holder_and_the_variable_to_change(private_state):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        out = run_dojo("services", "up", env={"DOJO_KAFKA_PORT": str(port)})
    assert out.returncode == 1
    assert f"Port {port}" in out.stderr and "already in use" in out.stderr
    assert "DOJO_KAFKA_PORT" in out.stderr


def test_missing_java_for_apache_says_how_to_install_it(private_state, tmp_path):
    empty_bin = tmp_path / "bin"
    empty_bin.mkdir()
    import sys
    from pathlib import Path

    # Keep python reachable, hide java: PATH holds only the interpreter's directory.
    python_dir = str(Path(sys.executable).parent)
    out = run_dojo("services", "up", "--kafka", "apache",
                   env={"PATH": f"{empty_bin}:{python_dir}", "JAVA_HOME": ""})
    assert out.returncode == 1
    assert "needs Java 17" in out.stderr
    assert "--kafka tansu" in out.stderr


def test_a_corrupted_state_file_is_explained_and_down_force_recovers(private_state):
    private_state.mkdir(parents=True, exist_ok=True)
    (private_state / "services.json").write_text("{ this is not json")
    status = run_dojo("services", "status")
    assert status.returncode == 1
    assert "corrupted" in status.stderr and "dojo services down --force" in status.stderr
    forced = run_dojo("services", "down", "--force")
    assert forced.returncode == 0, forced.stderr
    assert not (private_state / "services.json").exists()
    assert run_dojo("services", "up").returncode == 0


def test_a_stale_state_file_from_a_dead_run_is_reported_dead_not_up(private_state):
    private_state.mkdir(parents=True, exist_ok=True)
    stale = {"kafka": {"name": "kafka", "backend": "tansu", "pid": 999_999, "port": 1,
                       "url": "127.0.0.1:1", "started_at": 0.0, "create_time": 0.0}}
    (private_state / "services.json").write_text(json.dumps(stale))
    rows = json.loads(run_dojo("services", "status", "--json").stdout)
    kafka = [row for row in rows if row["name"] == "kafka"][0]
    assert kafka["state"] == "dead"


def test_a_state_file_with_wrong_types_is_explained_not_a_traceback(private_state):
    private_state.mkdir(parents=True, exist_ok=True)
    (private_state / "services.json").write_text(
        '{"postgres": {"name": "postgres", "backend": "embedded", "pid": "12x", "port": 5432,'
        ' "url": "u", "started_at": 0, "create_time": 0}}')
    status = run_dojo("services", "status")
    assert status.returncode == 1
    assert "Traceback" not in status.stderr
    assert "postgres.pid should be int" in status.stderr, status.stderr
    assert "dojo services down --force" in status.stderr
    assert run_dojo("services", "down", "--force").returncode == 0
