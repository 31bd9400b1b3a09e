"""A held services lock makes `dojo services up` give up with the holder's pid, not hang."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def test_a_held_lock_times_out_naming_the_holder(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import fcntl, os, sys, time\n"
         f"h = open({str(state / 'services.lock')!r}, 'a+')\n"
         "fcntl.flock(h, fcntl.LOCK_EX); h.write(f'{os.getpid()}\\n'); h.flush()\n"
         "print('held', flush=True); time.sleep(60)\n"],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        env = {**os.environ, "DOJO_STATE_DIR": str(state), "DOJO_SERVICES_LOCK_SECONDS": "1"}
        result = subprocess.run([sys.executable, "-m", "dojo.cli", "services", "up"], env=env,
                                capture_output=True, text=True, timeout=60)
    finally:
        holder.kill()
        holder.wait()
    assert result.returncode == 1
    assert f"held by pid {holder.pid}" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    assert not (state / "services.json").exists(), "nothing may start while the lock is held"
