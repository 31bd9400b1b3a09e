"""`dojo quiz score` / `dojo quiz cards`, the piped checklist line, --aloud, the mock report."""

from __future__ import annotations

import json
from pathlib import Path

from tests.quiz.cli_helpers import run_dojo

REPO = Path(__file__).resolve().parents[2]
PARTIAL_DLQ = ("A DLQ is where the consumer parks a message it cannot process, so the stream "
               "keeps moving.\nWe retry timeouts with exponential backoff.\n")


def test_score_prints_points_evidence_and_json(tmp_path: Path) -> None:
    answer = ("A DLQ is a side topic where we park poison messages so the partition keeps "
              "moving. We never retry timeouts; we retry every failure a few times first.")
    done = run_dojo(["quiz", "score", "dlq-what"], tmp_path, answer, content=REPO)
    assert done.returncode == 0, done.stderr
    assert "✓ It parks a message" in done.stdout and "Your answer" in done.stdout
    assert "you said the opposite" in done.stdout
    done = run_dojo(["quiz", "score", "dlq-what", "--json"], tmp_path, answer, content=REPO)
    data = json.loads(done.stdout)
    assert data["card"] == "dlq-what" and data["percent"] <= 20
    assert "parks-without-blocking" in data["matched"]
    assert data["contradicted"], data
    parks = next(p for p in data["points"] if p["id"] == "parks-without-blocking")
    assert parks["evidence"] and parks["evidence"][0]["text"] in answer


def test_score_an_unknown_card_says_how_to_list_them(tmp_path: Path) -> None:
    done = run_dojo(["quiz", "score", "no-such-card"], tmp_path, "x", content=REPO)
    assert done.returncode == 2 and "dojo quiz cards" in done.stderr


def test_cards_lists_every_card(tmp_path: Path) -> None:
    done = run_dojo(["quiz", "cards", "--json"], tmp_path, content=REPO)
    rows = json.loads(done.stdout)
    assert len(rows) >= 100 and len({row["id"] for row in rows}) == len(rows)
    dlq = next(row for row in rows if row["id"] == "dlq-what")
    assert dlq["format"] == 2 and 4 <= dlq["essentials"] <= 6
    plain = run_dojo(["quiz", "cards", "--lesson", "dead-letter-queue"], tmp_path, content=REPO)
    assert plain.stdout.split()[0] == "dlq-what"


def test_a_piped_checklist_line_ticks_points_before_the_grade(tmp_path: Path) -> None:
    done = run_dojo(["quiz", "-n", "1"], tmp_path, PARTIAL_DLQ + "\npoints: 3 4 5\n\n")
    assert done.returncode == 0, done.stderr
    assert "Coverage 100%  (5 of 5 essentials)  · your checklist" in done.stdout
    assert "[Enter = 3 Good" in done.stdout  # the suggestion follows the checklist


def test_aloud_from_a_pipe_reads_only_the_checklist(tmp_path: Path) -> None:
    done = run_dojo(["quiz", "--aloud", "-n", "1"], tmp_path, "points: 1 2\n\n")
    assert done.returncode == 0, done.stderr
    assert "Tick what you said" in done.stdout
    assert "Coverage 40%  (2 of 5 essentials)  · your checklist" in done.stdout


def test_the_mock_report_shows_each_question_answer_and_model_answer(tmp_path: Path) -> None:
    answers = (PARTIAL_DLQ + "\n") * 4
    done = run_dojo(["quiz", "--mock", "2", "--seed", "3"], tmp_path, answers)
    assert done.returncode == 0, done.stderr
    report = done.stdout.split("Question by question", 1)[1]
    assert report.count("Model answer") == 4 and report.count("Your answer") == 4
    assert "retry timeouts with exponential backoff" in " ".join(report.split())
