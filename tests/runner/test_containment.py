"""Containment of learner code: memory limits, detached processes, a scrubbed environment,
and a CLI killed mid-check leaving nothing running (issue 11)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dojo.content.labs import Lab
from dojo.runner.limits import Limits, lab_limits, sandbox_mode
from dojo.runner.sandbox import ALLOW_ENV, file_sandbox
from tests.runner.conftest import HANG_SECONDS, IMPLS, by_check, run

DEDUPE = ("duplicate_event_counted_once", "same_word_in_two_events_counts_twice")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def _wait_gone(pids: list[int], seconds: float = 5.0) -> list[int]:
    deadline = time.monotonic() + seconds
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [pid for pid in pids if _alive(pid)]


def test_three_gigabytes_do_not_pass_under_the_default_limit(tally: Lab) -> None:
    summary = run(tally, IMPLS / "hogs_memory", check_seconds=20, stages=("dedupe",))
    for check in DEDUPE:
        result = by_check(summary)[check]
        assert result.status == "error", f"a 3 GB allocation passed: {result}"
        assert "more than 1 GiB" in result.message, result.message
        assert "tally.py line 18" in result.message, result.message


def test_a_process_started_with_setsid_dies_with_the_check(
        tally: Lab, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pidfile = tmp_path / "report" / "escaped.txt"
    pidfile.parent.mkdir()
    monkeypatch.setenv("TALLY_ORPHAN_PIDFILE", str(pidfile))
    monkeypatch.setenv(ALLOW_ENV, str(pidfile.parent))  # the file sandbox lets the fixture report
    summary = run(tally, IMPLS / "escapes_setsid", check_seconds=HANG_SECONDS,
                  stages=("dedupe",))
    assert by_check(summary)[DEDUPE[0]].status == "error"
    pids = [int(line) for line in pidfile.read_text().split()]
    assert pids, "the implementation did not start its sleeper"
    assert not _wait_gone(pids), "a detached process outlived the run"


def test_learner_code_sees_no_data_dir_and_a_home_of_its_own(
        tally: Lab, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("DOJO_DATA_DIR", str(tmp_path / "data"))
    summary = run(tally, IMPLS / "snoops", stages=("dedupe",))
    message = by_check(summary)[DEDUPE[0]].message
    assert "'data_dir': ''" in message, f"learner code saw the data dir: {message}"
    assert f"'home': '{os.environ.get('HOME', '')}'" not in message, message
    assert "dojo-run-" in message, f"HOME should be inside the run's scratch dir: {message}"


def test_lab_yaml_limits_override_the_defaults() -> None:
    limits = lab_limits({"memory_mb": 2048, "processes": 32})
    assert limits.memory_bytes == 2 << 30
    assert limits.processes == 32
    assert limits.file_bytes == Limits().file_bytes
    assert lab_limits(None) == Limits()
    assert limits.describe_memory() == "2 GiB"


def test_the_sandbox_mode_is_named_with_a_reason() -> None:
    mode, why = sandbox_mode()
    assert mode in ("cgroup-v2", "rlimits")
    assert why


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGHUP])
def test_killing_the_cli_mid_check_leaves_nothing_running(
        content: Path, tmp_path: Path, sig: signal.Signals) -> None:
    """`dojo lab check` on a hanging implementation, killed once the learner code runs."""
    pidfile = tmp_path / "report" / "escaped.txt"
    pidfile.parent.mkdir()
    env = {**os.environ, "DOJO_CONTENT_ROOT": str(content),
           "DOJO_DATA_DIR": str(tmp_path / "data"), "TALLY_ORPHAN_PIDFILE": str(pidfile),
           ALLOW_ENV: str(pidfile.parent)}
    cli = subprocess.Popen(
        [sys.executable, "-m", "dojo.cli", "lab", "check", "tally", "--stage", "dedupe",
         "--impl", str(IMPLS / "escapes_setsid")],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not (pidfile.exists() and len(pidfile.read_text().split()) >= 2):
            assert time.monotonic() < deadline, "the check never started the learner code"
            assert cli.poll() is None, "the CLI ended before the learner code ran"
            time.sleep(0.1)
        pids = [int(line) for line in pidfile.read_text().split()]
        cli.send_signal(sig)
        # the CLI drops the run's database and role before it exits; on a machine loaded by
        # parallel runs that took more than 20 s once (CI of stop 19)
        cli.wait(timeout=90)
    finally:
        if cli.poll() is None:
            cli.kill()
    assert not _wait_gone(pids, 8), f"still running after {sig.name} of the CLI: {pids}"


def _dojo_databases() -> set[str]:
    import psycopg

    from dojo.services.manager import resolve
    from dojo.services.postgres import libpq_url

    url = libpq_url(resolve(start=True).database_url)
    with psycopg.connect(url, autocommit=True, connect_timeout=10) as conn:
        return {row[0] for row in conn.execute(
            "SELECT datname FROM pg_database WHERE datname LIKE 'dojo\\_%'")}


def test_a_check_killed_while_it_hangs_leaves_no_database_behind(tally: Lab) -> None:
    before = _dojo_databases()
    summary = run(tally, IMPLS / "hangs_in_database", check_seconds=HANG_SECONDS,
                  stages=("persist",), checks=("saving_twice_adds_up",))
    result = by_check(summary)["saving_twice_adds_up"]
    assert result.status == "error" and "did not finish" in result.message, result
    assert _dojo_databases() - before == set(), "the killed check's database was left behind"


def test_services_up_sweeps_what_a_killed_run_recorded(tmp_path: Path) -> None:
    import psycopg

    from dojo.runner import ledger
    from dojo.services.manager import resolve
    from dojo.services.postgres import libpq_url

    name = "dojo_sweep_" + os.urandom(5).hex()
    dead = subprocess.Popen(["true"])
    dead.wait()
    path = ledger.runs_dir() / f"{dead.pid}-feedbeef.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f'{{"kind": "role", "name": "{name}"}}\n'
                    f'{{"kind": "database", "name": "{name}"}}\n')
    admin = libpq_url(resolve(start=True).database_url)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE ROLE "{name}" LOGIN')
        conn.execute(f'CREATE DATABASE "{name}" OWNER "{name}"')
    out = subprocess.run([sys.executable, "-m", "dojo.cli", "services", "up"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert name in out.stdout, out.stdout
    assert name not in _dojo_databases()
    with psycopg.connect(admin) as conn:
        assert conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s",
                            (name,)).fetchone() is None, "the killed run's role was left behind"
    assert not path.exists()


def test_a_file_over_the_lab_file_limit_is_named(content: Path) -> None:
    from dojo.content.labs import load_lab

    lab_yaml = content / "labs" / "tally" / "lab.yaml"
    lab_yaml.write_text(lab_yaml.read_text() + "limits: {file_mb: 1}\n")
    lab = load_lab(content / "labs" / "tally", content)
    summary = run(lab, IMPLS / "writes_big_file", stages=("dedupe",))
    result = by_check(summary)[DEDUPE[0]]
    assert result.status == "error", result
    assert "wrote a file larger than 1 MiB" in result.message, result.message
    assert "tally.py line 19" in result.message, result.message


def test_learner_code_cannot_open_the_progress_store_or_the_services_state(
        tally: Lab, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    enforced, why = file_sandbox()
    if not enforced:
        pytest.skip(f"no file sandbox on this machine: {why}")
    from dojo.services.paths import state_dir
    from dojo.store.paths import database_path

    monkeypatch.setenv("DOJO_DATA_DIR", str(tmp_path / "data"))
    progress = database_path()
    progress.parent.mkdir(parents=True)
    progress.write_bytes(b"progress")
    secret = state_dir() / "runs" / "sandbox-probe.txt"  # beside the pg-password
    secret.parent.mkdir(parents=True, exist_ok=True)
    secret.write_text("state")
    readable = IMPLS / "reads_secrets" / "tally.py"
    probes = os.pathsep.join(map(str, (progress, secret, readable)))
    monkeypatch.setenv("TALLY_SECRET_FILES", probes)
    try:
        summary = run(tally, IMPLS / "reads_secrets", stages=("dedupe",))
    finally:
        secret.unlink()
    message = by_check(summary)[DEDUPE[0]].message
    assert f"PermissionError {progress}" in message, message
    assert f"PermissionError {secret}" in message, message
    assert f"READ {readable}" in message, f"its own code must stay readable: {message}"
    assert "TMP " in message and "dojo-run-" in message, f"no temp file in its scratch: {message}"
