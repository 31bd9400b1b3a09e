"""`dojo lessons`: the catalogue by track with read state, mastery and lab stages, in aligned
columns; titles whole when piped; `--json` for scripts."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from dojo.quiz import ReviewScheduler, SelfGrade
from dojo.store import ProgressStore
from tests.quiz.cli_helpers import FIXTURES, run_dojo


def row(out: str, title: str) -> str:
    return next(line for line in out.splitlines() if title in line)


def columns(line: str) -> list[str]:
    return re.split(r"\s{2,}", line.strip())


def test_lessons_are_listed_by_track_with_no_progress_yet(tmp_path: Path) -> None:
    done = run_dojo(["lessons"], tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines.index("The interview") < lines.index("What they ask next")
    assert columns(lines[0]) == ["#", "lesson", "read", "mastery", "cards", "labs"]
    assert columns(row(done.stdout, "Dead letter queues")) == [
        "01", "Dead letter queues", "unread", "0%", "0/4", "dlq 0/2"]


def test_columns_line_up_and_titles_are_whole_when_piped(tmp_path: Path) -> None:
    done = run_dojo(["lessons"], tmp_path)
    header, *rest = done.stdout.splitlines()
    rows = [line for line in rest if re.match(r"\s+\d\d\s", line)]
    assert len(rows) == 2

    def spans(line: str) -> list[tuple[int, int]]:
        return [match.span() for match in re.finditer(r"\S+(?: \S+)*", line)]

    for line in rows:  # text columns start under their heading, numbers end under it
        for column, ((start, end), (h_start, h_end)) in enumerate(
                zip(spans(line), spans(header), strict=True)):
            if column in (3, 4):
                assert end == h_end, f"column {column} is not right-aligned: {line!r}"
            else:
                assert start == h_start, f"column {column} does not line up: {line!r}"
    assert "…" not in done.stdout  # a pipe gets every title whole


def test_a_lab_that_is_not_on_disk_is_shown_as_coming(tmp_path: Path) -> None:
    content = tmp_path / "content"
    shutil.copytree(FIXTURES, content)
    shutil.rmtree(content / "labs" / "dlq")
    done = run_dojo(["lessons"], tmp_path, content=content)
    assert columns(row(done.stdout, "Dead letter queues"))[-1] == "dlq (coming)"


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
    # one of four cards, just reviewed: a quarter of the lesson's mastery
    assert columns(row(done.stdout, "Dead letter queues")) == [
        "01", "Dead letter queues", "read", "25%", "1/4", "dlq 1/2"]
    assert columns(row(done.stdout, "Idempotent consumers"))[2] == "reading"
    assert done.stdout.rstrip().splitlines()[-1].endswith(
        "next, question 1 of 1: drill “Dead letter queues”: 3 cards to go — "
        "dojo quiz --lesson 01"), "the guided path's next step, with the command for it"
    lessons = {lesson["id"]: lesson for lesson in
               json.loads(run_dojo(["lessons", "--json"], tmp_path, content=content).stdout)}
    dlq = lessons["dead-letter-queue"]
    assert (dlq["number"], dlq["read"], dlq["reviewed"], dlq["cards"]) == ("01", "read", 1, 4)
    assert dlq["mastery"] == 0.25
    assert dlq["labs"] == [{"lab": "dlq", "ready": True, "passed": 1, "stages": 2}]
    assert lessons["idempotent-consumer"]["read"] == "reading"
