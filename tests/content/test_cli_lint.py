"""`dojo lint`: problems as `path:line: message`, exit 1 when there are any."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from tests.content.conftest import DLQ, FIXTURE_ROOT


def lint(root: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dojo.cli", "lint", "--root", str(root)],
                          capture_output=True, text=True, cwd=cwd, timeout=60)


def test_clean_content_exits_zero(tmp_path: Path) -> None:
    done = lint(FIXTURE_ROOT, tmp_path)
    assert done.returncode == 0, done.stdout
    assert done.stdout == ""


def test_each_problem_is_a_path_line_message_and_the_exit_is_one(tmp_path: Path) -> None:
    root = tmp_path / "content"
    shutil.copytree(FIXTURE_ROOT, root)
    lesson = root / DLQ / "lesson.md"
    lesson.write_text(lesson.read_text().replace("track: interview", "track: bonus"))
    done = lint(root, tmp_path)
    assert done.returncode == 1
    assert done.stdout.splitlines() == [
        "content/lessons/01-dead-letter-queue/lesson.md:4: track 'bonus' must be one of "
        "interview, next, craft"]
    assert "1 problem(s) in 1 file(s)" in done.stderr


def test_labs_are_linted_by_the_same_command(tmp_path: Path) -> None:
    root = tmp_path / "content"
    shutil.copytree(FIXTURE_ROOT, root)
    (root / "labs" / "half-built").mkdir(parents=True)
    done = lint(root, tmp_path)
    assert done.returncode == 1
    assert done.stdout.startswith("content/labs/half-built:1: ")


def test_a_root_without_content_is_a_usage_error(tmp_path: Path) -> None:
    done = lint(tmp_path, tmp_path)
    assert done.returncode == 2 and "neither lessons/ nor labs/" in done.stderr
