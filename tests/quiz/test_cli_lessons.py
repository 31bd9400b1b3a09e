"""`dojo lessons`: the catalogue by track with read state, mastery and lab stages."""

from __future__ import annotations

import shutil
from pathlib import Path

from dojo.quiz import ReviewScheduler, SelfGrade
from dojo.store import ProgressStore
from tests.quiz.cli_helpers import FIXTURES, run_dojo


def row(out: str, title: str) -> str:
    return next(line for line in out.splitlines() if title in line)


def test_lessons_are_listed_by_track_with_no_progress_yet(tmp_path: Path) -> None:
    done = run_dojo(["lessons"], tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines.index("The interview") < lines.index("What they ask next")
    assert "unread   mastery   0% (0/4 cards)  labs: dlq 0/2" in row(done.stdout,
                                                                      "Dead letter queues")


def test_a_lab_that_is_not_on_disk_is_shown_as_coming(tmp_path: Path) -> None:
    content = tmp_path / "content"
    shutil.copytree(FIXTURES, content)
    shutil.rmtree(content / "labs" / "dlq")
    done = run_dojo(["lessons"], tmp_path, content=content)
    assert "labs: dlq (coming)" in row(done.stdout, "Dead letter queues")


def test_progress_shows_read_lessons_mastery_and_lab_stages(tmp_path: Path) -> None:
    content = tmp_path / "content"
    shutil.copytree(FIXTURES, content)
    with ProgressStore(tmp_path / "progress.sqlite3") as store:
        store.record_lesson_read("dead-letter-queue", "sources", 80, finished=True)
        store.record_lesson_read("idempotent-consumer", "deep-dive", 10)
        store.record_stage_result("dlq", "classify", "pass")
        store.record_stage_result("dlq", "replay", "fail")
        ReviewScheduler(store).review("fx-dlq-what", SelfGrade.GOOD)
    done = run_dojo(["lessons"], tmp_path, content=content)
    dlq = row(done.stdout, "Dead letter queues")
    assert "read " in dlq and "(1/4 cards)" in dlq and "labs: dlq 1/2" in dlq
    assert "mastery  25%" in dlq  # one of four cards, just reviewed
    assert "reading" in row(done.stdout, "Idempotent consumers")
