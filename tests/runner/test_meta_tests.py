"""The meta-tests (tests/labs/) themselves, run on a private content root: they pass on a good
lab, fail on a mutant its check does not catch, and carry the `kafka` mark CI selects."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _meta(content: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "tests/labs", "-p", "no:cacheprovider", "-rA",
         "-q", *args], cwd=REPO, capture_output=True, text=True, timeout=300,
        env={**os.environ, "DOJO_CONTENT_ROOT": str(content)})


def test_a_good_lab_passes_all_meta_tests(content: Path) -> None:
    result = _meta(content)
    assert result.returncode == 0, result.stdout[-3000:]
    assert "5 passed" in result.stdout, "solution, starter, two mutants and the alternative"


def test_a_mutant_its_check_misses_fails_with_a_teaching_message(content: Path) -> None:
    mutant = content / "labs/tally/mutants/case-sensitive"
    (mutant / "mutant.yaml").write_text(
        "mistake: counts words by case\nstage: count\ncheck: counts_each_word\n"
        "mentions: [case]\n")
    result = _meta(content, "-k", "case-sensitive")
    assert result.returncode == 1
    assert "got past check 'counts_each_word'" in result.stdout


def test_a_message_without_the_mentions_fails(content: Path) -> None:
    manifest = content / "labs/tally/mutants/case-sensitive/mutant.yaml"
    manifest.write_text(manifest.read_text().replace('"KAFKA"', '"lower()"'))
    result = _meta(content, "-k", "case-sensitive")
    assert result.returncode == 1
    assert "does not mention ['lower()']" in result.stdout


def test_a_solved_starter_fails_the_meta_tests(content: Path) -> None:
    solution = (content / "solutions/tally/tally.py").read_text()
    (content / "labs/tally/starter/tally.py").write_text(solution)
    result = _meta(content, "-k", "starter")
    assert result.returncode == 1
    assert "the untouched starter must fail stage 1" in result.stdout


def test_only_labs_that_use_kafka_carry_the_kafka_mark(content: Path) -> None:
    assert "no tests collected (5 deselected)" in _meta(content, "-m", "kafka", "--co").stdout
    manifest = content / "labs/tally/lab.yaml"
    manifest.write_text(manifest.read_text().replace("services: [postgres]",
                                                     "services: [postgres, kafka]"))
    listed = _meta(content, "-m", "kafka", "--co").stdout
    assert "test_solution_passes_every_check[tally]" in listed
    assert "test_alternative_design_passes_every_check[tally/plain-loops]" in listed
    # a mutant is rerun on Apache Kafka only when its check reaches the broker
    assert "tally/case-sensitive" not in listed and "tally/dedupe-by-word" not in listed
    checks = content / "labs/tally/checks/test_01_count.py"
    checks.write_text(checks.read_text().replace("def test_ignores_case(learner)",
                                                 "def test_ignores_case(learner, kafka)"))
    listed = _meta(content, "-m", "kafka", "--co").stdout
    assert "test_mutant_is_rejected_by_its_check[tally/case-sensitive]" in listed
    assert "tally/dedupe-by-word" not in listed


def test_an_alternative_a_check_rejects_fails_naming_the_check(content: Path) -> None:
    design = content / "tests/labs/alternatives/tally/plain-loops/tally.py"
    design.write_text(design.read_text().replace("text.lower().split()", "text.split()"))
    result = _meta(content, "-k", "plain-loops")
    assert result.returncode == 1
    assert "is a correct design (see its NOTE.md), but these checks" in result.stdout
    assert "ignores_case" in result.stdout


def test_a_message_that_drifts_from_its_golden_fails_with_a_diff(content: Path) -> None:
    golden = content / "labs/tally/mutants/case-sensitive/expected.txt"
    golden.write_text(golden.read_text().replace("are one word", "are three words"))
    result = _meta(content, "-k", "case-sensitive")
    assert result.returncode == 1
    assert "with another message than its golden one" in result.stdout
    assert "-'Kafka', 'kafka' and 'KAFKA' are three words" in result.stdout
    assert "+'Kafka', 'kafka' and 'KAFKA' are one word" in result.stdout


def test_a_golden_wildcard_matches_what_differs(content: Path) -> None:
    golden = content / "labs/tally/mutants/case-sensitive/expected.txt"
    golden.write_text(golden.read_text().replace("{'Kafka': 1, 'kafka': 1, 'KAFKA': 1}", "<…>"))
    assert _meta(content, "-k", "case-sensitive").returncode == 0


def test_a_mutant_without_a_golden_fails(content: Path) -> None:
    (content / "labs/tally/mutants/case-sensitive/expected.txt").unlink()
    result = _meta(content, "-k", "case-sensitive")
    assert result.returncode == 1
    assert "expected.txt is missing: record the golden message with `dojo dev golden tally " \
           "--mutant case-sensitive`" in result.stdout


def test_a_mutant_whose_overlay_went_stale_fails(content: Path) -> None:
    solution = content / "solutions/tally/tally.py"
    solution.write_text(solution.read_text().replace("word.lower() for word", "w.lower() for w"))
    result = _meta(content, "-k", "case-sensitive")
    assert result.returncode == 1
    assert "the mutant 'case-sensitive' no longer applies to solutions/tally/" in result.stdout
