"""Services by identity: `down --force` stops what dojo started (found by its marker, not by
command-line text) and leaves a process that merely names the state dir alone; the embedded
PostgreSQL runs without root's groups."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest


def _dojo(state: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("DOJO_DATABASE_URL", "DOJO_KAFKA_BOOTSTRAP")}
    env["DOJO_STATE_DIR"] = str(state)
    return subprocess.run([sys.executable, "-m", "dojo.cli", *args], env=env,
                          capture_output=True, text=True, timeout=180)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def _marked(state: Path) -> list[int]:
    import psutil

    out = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get("DOJO_SERVICE_OF") == str(state.resolve()):
                out.append(proc.pid)
        except psutil.Error:
            continue
    return out


def test_down_force_stops_only_what_dojo_started(service_state: Path) -> None:
    state = service_state
    # names the state dir on its command line, and is not dojo's
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", str(state)])
    try:
        assert _dojo(state, "services", "up").returncode == 0
        ours = _marked(state)
        assert len(ours) >= 2, "postgres and the broker should both carry the marker"
        (state / "services.json").write_text("{ not json")  # the records are lost
        forced = _dojo(state, "services", "down", "--force")
        assert forced.returncode == 0, forced.stderr
        deadline = time.monotonic() + 10
        while any(_alive(pid) for pid in ours) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [pid for pid in ours if _alive(pid)], "a service outlived down --force"
        assert _alive(bystander.pid), "down --force killed a process it did not start"
    finally:
        bystander.kill()
        bystander.wait()
        _dojo(state, "services", "down", "--force")


@pytest.mark.skipif(os.geteuid() != 0, reason="the privilege drop only happens as root")
def test_embedded_postgres_runs_without_root_groups(service_state: Path) -> None:
    import psycopg

    state = service_state
    try:
        up = _dojo(state, "services", "up")
        assert up.returncode == 0, up.stderr
        url = json.loads((state / "services.json").read_text())["postgres"]["url"]
        from dojo.services.postgres import libpq_url

        with psycopg.connect(libpq_url(url), autocommit=True) as conn:
            conn.execute("CREATE TEMP TABLE ident (line text)")
            conn.execute("COPY ident FROM PROGRAM 'id'")
            ident = conn.execute("SELECT line FROM ident").fetchone()[0]
        assert "gid=0(" not in ident and "groups=0(" not in ident, ident
        assert "uid=0(" not in ident, ident
    finally:
        _dojo(state, "services", "down", "--force")
