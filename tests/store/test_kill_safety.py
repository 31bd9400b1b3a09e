"""kill -9 at any moment never corrupts the store, and every commit made before survives."""

from __future__ import annotations

import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from dojo.store import ProgressStore

WRITER = Path(__file__).with_name("writer_process.py")
ROUNDS = 12


def test_sigkill_mid_write_leaves_a_consistent_database_with_earlier_commits(
        tmp_path: Path) -> None:
    db = tmp_path / "progress.sqlite3"
    rng = random.Random(20261202)
    committed: list[str] = []
    for round_no in range(ROUNDS):
        writer = subprocess.Popen([sys.executable, str(WRITER), str(db), str(round_no)],
                                  stdout=subprocess.PIPE, text=True, env=os.environ.copy())
        assert writer.stdout is not None
        # Let it commit a few writes, then kill it at a random instant, usually mid-write.
        for _ in range(rng.randint(1, 15)):
            line = writer.stdout.readline().strip()
            assert line, f"writer died early with code {writer.wait()}"
            committed.append(line)
        time.sleep(rng.uniform(0, 0.01))
        writer.send_signal(signal.SIGKILL)
        writer.wait()
        assert writer.returncode == -signal.SIGKILL
        committed.extend(line.strip() for line in writer.stdout if line.strip())

        with sqlite3.connect(db) as conn:
            assert conn.execute("pragma integrity_check").fetchone() == ("ok",)
            stored = {answer for (answer,) in conn.execute("select answer from quiz_answers")}
            lost = [seq for seq in committed if seq not in stored]
            assert not lost, f"commits reported before the kill are gone: {lost[:5]}"
            # A review is a state update plus a log row in one transaction: never half of it.
            for card_id, reviews in conn.execute("select card_id, review_count "
                                                 "from card_states"):
                (logs,) = conn.execute("select count(*) from review_logs where card_id = ?",
                                       (card_id,)).fetchone()
                assert logs == reviews, f"{card_id}: {reviews} reviews counted, {logs} logs"

    with ProgressStore(db) as store:  # and the store itself opens and writes afterwards
        store.record_stage_result("outbox", "schema", "pass")
        assert store.passed_stages("outbox") == {"schema"}
        assert sum(store.review_count(f"card-{i}") for i in range(3)) >= len(committed)
