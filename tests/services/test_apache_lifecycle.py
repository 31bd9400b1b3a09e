"""The Apache Kafka backend: up, status, a kill by hand, down — in a private state dir."""

from __future__ import annotations

import json
import os
import signal
import time

from tests.services.conftest import run_dojo


def test_apache_backend_starts_reports_dies_and_stops(private_state):
    up = run_dojo("services", "up", "--kafka", "apache", timeout=600)
    assert up.returncode == 0, up.stdout + up.stderr
    rows = {r["name"]: r for r in json.loads(run_dojo("services", "status", "--json").stdout)}
    assert rows["kafka"]["backend"] == "apache" and rows["kafka"]["state"] == "up"

    from dojo.services.kafka_common import broker_answers

    assert broker_answers(str(rows["kafka"]["url"]), timeout=10) is None

    os.kill(int(rows["kafka"]["pid"]), signal.SIGKILL)
    time.sleep(0.5)
    rows = {r["name"]: r for r in json.loads(run_dojo("services", "status", "--json").stdout)}
    assert rows["kafka"]["state"] == "dead"

    assert run_dojo("services", "down").returncode == 0
    rows = {r["name"]: r for r in json.loads(run_dojo("services", "status", "--json").stdout)}
    assert rows["kafka"]["state"] == "stopped"
