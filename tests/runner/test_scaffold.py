"""`dojo dev new-lab` and `dojo dev new-lesson` give skeletons that are complete at once: lint
clean, and a new lab passes its own meta-test (solution passes, starter fails, the mutant is
rejected with its golden message)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.runner.conftest import run_dojo

REPO = Path(__file__).resolve().parents[2]


def test_a_new_lab_is_lint_clean_and_passes_its_own_meta_test(tmp_path: Path) -> None:
    root = tmp_path / "content"
    root.mkdir()
    made = run_dojo("dev", "new-lab", "demo", "--root", str(root), root=root)
    assert made.returncode == 0, made.stdout + made.stderr
    mutant = root / "labs/demo/mutants/dedupe-by-payload"
    assert sorted(p.name for p in mutant.iterdir()) == ["demo.py.patch", "expected.txt",
                                                        "mutant.yaml"], "an overlay, no copy"
    assert "another event with the same payload" in (mutant / "expected.txt").read_text()
    lint = run_dojo("lint", "--root", str(root), root=root)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    meta = subprocess.run(
        [sys.executable, "-m", "pytest", "tests/labs", "-p", "no:cacheprovider", "-rA", "-q"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
        env={**os.environ, "DOJO_CONTENT_ROOT": str(root)})
    assert meta.returncode == 0, meta.stdout[-3000:]
    for test in ("test_solution_passes_every_check[demo]",
                 "test_untouched_starter_fails_its_first_stage[demo]",
                 "test_mutant_is_rejected_by_its_check[demo/dedupe-by-payload]"):
        assert f"PASSED tests/labs/test_labs.py::{test}" in meta.stdout, meta.stdout[-3000:]


def test_the_skeleton_check_uses_the_kit_failure(tmp_path: Path) -> None:
    root = tmp_path / "content"
    root.mkdir()
    assert run_dojo("dev", "new-lab", "demo", "--root", str(root), root=root).returncode == 0
    check = (root / "labs/demo/checks/test_01_dedupe.py").read_text()
    assert "from dojo.checks import CheckFailure, call, table" in check
    assert "raise CheckFailure(" in check and "call(module.unique_events" in check


def test_new_lab_refuses_a_bad_slug_or_an_existing_lab(tmp_path: Path) -> None:
    root = tmp_path / "content"
    root.mkdir()
    bad = run_dojo("dev", "new-lab", "Demo_Lab", "--root", str(root), root=root)
    assert bad.returncode == 2 and "is not a slug" in bad.stderr
    (root / "labs/demo").mkdir(parents=True)
    taken = run_dojo("dev", "new-lab", "demo", "--root", str(root), root=root)
    assert taken.returncode == 2 and "exists already" in taken.stderr


def test_a_new_lesson_is_lint_clean_and_takes_the_next_number(tmp_path: Path) -> None:
    root = tmp_path / "content"
    (root / "lessons").mkdir(parents=True)
    first = run_dojo("dev", "new-lesson", "rate-limiting", "--root", str(root), root=root)
    second = run_dojo("dev", "new-lesson", "backpressure", "--root", str(root), root=root)
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    assert sorted(p.name for p in (root / "lessons").iterdir()) == ["01-rate-limiting",
                                                                    "02-backpressure"]
    assert "order: 2" in (root / "lessons/02-backpressure/lesson.md").read_text()
    lint = run_dojo("lint", "--root", str(root), root=root)
    assert lint.returncode == 0, lint.stdout + lint.stderr


def test_a_new_lab_is_lint_clean_beside_the_real_content(tmp_path: Path) -> None:
    import shutil

    root = tmp_path / "content"
    for part in ("lessons", "labs", "solutions"):
        shutil.copytree(REPO / part, root / part,
                        ignore=shutil.ignore_patterns("__pycache__"))
    assert run_dojo("dev", "new-lab", "demo", "--root", str(root), root=root).returncode == 0
    lint = run_dojo("lint", "--root", str(root), root=root)
    assert lint.returncode == 0, lint.stdout + lint.stderr
