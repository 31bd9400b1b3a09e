"""`dojo services up | status | down` with the embedded backends, in a private state dir."""

from __future__ import annotations

import json
import os
import signal
import time

import psutil

from tests.services.conftest import run_dojo


def _status(private_state: object) -> dict[str, dict[str, object]]:
    out = run_dojo("services", "status", "--json")
    return {row["name"]: row for row in json.loads(out.stdout)}


def test_up_starts_postgres_and_tansu_and_status_reports_them_up(private_state):
    up = run_dojo("services", "up")
    assert up.returncode == 0, up.stderr
    rows = _status(private_state)
    assert rows["postgres"]["state"] == "up" and rows["postgres"]["backend"] == "embedded"
    assert rows["kafka"]["state"] == "up" and rows["kafka"]["backend"] == "tansu"
    assert str(rows["postgres"]["url"]).startswith("postgresql+psycopg://postgres:***@127.0.0.1:")


def test_up_twice_is_harmless_and_keeps_the_same_processes(private_state):
    assert run_dojo("services", "up").returncode == 0
    first = _status(private_state)
    again = run_dojo("services", "up")
    assert again.returncode == 0, again.stderr
    assert "already up" in again.stdout
    second = _status(private_state)
    assert [first[n]["pid"] for n in ("postgres", "kafka")] == \
        [second[n]["pid"] for n in ("postgres", "kafka")]


def test_a_broker_killed_by_hand_is_reported_dead_and_up_restarts_it(private_state):
    assert run_dojo("services", "up").returncode == 0
    pid = int(_status(private_state)["kafka"]["pid"])  # type: ignore[call-overload]
    os.kill(pid, signal.SIGKILL)
    time.sleep(0.3)
    status = run_dojo("services", "status")
    assert status.returncode != 0, "status must not exit 0 while a service is dead"
    assert "dead" in status.stdout and f"pid {pid} is gone" in status.stdout
    assert _status(private_state)["kafka"]["state"] == "dead"
    restarted = run_dojo("services", "up")
    assert restarted.returncode == 0, restarted.stderr
    assert "was dead" in restarted.stdout
    assert _status(private_state)["kafka"]["state"] == "up"


def test_down_stops_what_dojo_started_and_status_says_stopped(private_state):
    assert run_dojo("services", "up").returncode == 0
    pids = [int(r["pid"]) for r in _status(private_state).values()]  # type: ignore[call-overload]
    down = run_dojo("services", "down")
    assert down.returncode == 0, down.stderr
    rows = _status(private_state)
    assert {r["state"] for r in rows.values()} == {"stopped"}
    time.sleep(0.2)
    for pid in pids:
        try:
            alive = psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            alive = False
        assert not alive, f"pid {pid} still runs after `dojo services down`"


def test_down_never_touches_an_external_service(private_state, services):
    """With DOJO_DATABASE_URL set, `down` stops nothing: the server there is not dojo's."""
    env = {"DOJO_DATABASE_URL": services.database_url,
           "DOJO_KAFKA_BOOTSTRAP": services.kafka_bootstrap}
    assert run_dojo("services", "up", env=env).returncode == 0
    down = run_dojo("services", "down", env=env)
    assert down.returncode == 0
    assert "nothing dojo started" in down.stdout
    rows = json.loads(run_dojo("services", "status", "--json", env=env).stdout)
    assert {r["state"] for r in rows} == {"external"}
