"""`dojo doctor`: every finding names its area, broken ones say what to fix, and the exit code
says whether anything is broken."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path


def _doctor(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dojo.cli", "doctor", "--json"], env=env,
                          capture_output=True, text=True, timeout=120)


def test_a_dead_recorded_service_is_broken_with_the_command_that_fixes_it(
        tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    dead = subprocess.Popen(["true"])
    dead.wait()
    (state / "services.json").write_text(json.dumps({"postgres": {
        "name": "postgres", "backend": "embedded", "pid": dead.pid, "port": 1,
        "url": "postgresql+psycopg://postgres@127.0.0.1:1/postgres",
        "started_at": time.time(), "create_time": time.time(), "log": "", "extra": {}}}))
    env = {key: value for key, value in os.environ.items()
           if key not in ("DOJO_DATABASE_URL", "DOJO_KAFKA_BOOTSTRAP")}
    env.update(DOJO_STATE_DIR=str(state), DOJO_DATA_DIR=str(tmp_path / "data"))
    result = _doctor(env)
    findings = [json.loads(line) for line in result.stdout.splitlines()]
    assert result.returncode == 1, result.stdout + result.stderr
    postgres = next(f for f in findings if f["area"] == "services" and "postgres" in f["what"])
    assert postgres["level"] == "broken"
    assert "dojo services up" in postgres["fix"]
    areas = {f["area"] for f in findings}
    assert {"python", "services", "apache-kafka", "sandbox", "disk", "content"} <= areas
    sandbox = next(f for f in findings if f["area"] == "sandbox")
    assert "rlimits" in sandbox["what"] or "cgroup v2" in sandbox["what"]
