"""`dojo dev mutant edit/save`: a mutant is written as full files and stored as overlays."""

from __future__ import annotations

from pathlib import Path

from tests.runner.conftest import run_dojo


def test_edit_then_save_stores_only_the_changed_file_as_a_patch(content: Path,
                                                                tmp_path: Path) -> None:
    work = tmp_path / "work"
    edit = run_dojo("dev", "mutant", "edit", "tally", "split-on-space", str(work), root=content)
    assert edit.returncode == 0, edit.stderr
    code = work / "tally.py"
    code.write_text(code.read_text().replace("text.split()", "text.split(' ')"))
    save = run_dojo("dev", "mutant", "save", "tally", "split-on-space", "--from", str(work),
                    "--check", "counts_each_word", "--mistake", "splits on one space only",
                    root=content)
    assert save.returncode == 0, save.stderr
    folder = content / "labs/tally/mutants/split-on-space"
    assert sorted(p.name for p in folder.iterdir()) == ["mutant.yaml", "tally.py.patch"]
    assert "stage: count\ncheck: counts_each_word" in (folder / "mutant.yaml").read_text()
    again = tmp_path / "again"
    assert run_dojo("dev", "mutant", "edit", "tally", "split-on-space", str(again),
                    root=content).returncode == 0
    assert (again / "tally.py").read_bytes() == code.read_bytes()


def test_saving_the_unchanged_solution_is_refused(content: Path, tmp_path: Path) -> None:
    work = tmp_path / "work"
    assert run_dojo("dev", "mutant", "edit", "tally", "nothing", str(work),
                    root=content).returncode == 0
    save = run_dojo("dev", "mutant", "save", "tally", "nothing", "--from", str(work),
                    "--check", "counts_each_word", "--mistake", "none", root=content)
    assert save.returncode == 1 and "makes no mistake" in save.stderr


def test_edit_from_solution_ignores_a_stale_overlay(content: Path, tmp_path: Path) -> None:
    solution = content / "solutions/tally/tally.py"
    solution.write_text(solution.read_text().replace("word.lower() for word", "w.lower() for w"))
    stale = run_dojo("dev", "mutant", "edit", "tally", "case-sensitive", str(tmp_path / "a"),
                     root=content)
    assert stale.returncode == 2 and "no longer applies" in stale.stderr
    fresh = run_dojo("dev", "mutant", "edit", "tally", "case-sensitive", str(tmp_path / "b"),
                     "--from-solution", root=content)
    assert fresh.returncode == 0
    assert (tmp_path / "b/tally.py").read_bytes() == solution.read_bytes()


def test_a_new_mutant_under_a_taken_name_is_refused(content: Path, tmp_path: Path) -> None:
    """--check/--mistake say "new mutant": an existing one's overlays are not replaced."""
    work = tmp_path / "work"
    assert run_dojo("dev", "mutant", "edit", "tally", "split-on-space", str(work),
                    root=content).returncode == 0
    code = work / "tally.py"
    code.write_text(code.read_text().replace("text.split()", "text.split(' ')"))
    args = ("dev", "mutant", "save", "tally", "split-on-space", "--from", str(work))
    new = ("--check", "counts_each_word", "--mistake", "splits on one space only")
    assert run_dojo(*args, *new, root=content).returncode == 0
    patch = content / "labs/tally/mutants/split-on-space/tally.py.patch"
    kept = patch.read_bytes()
    other = tmp_path / "other"
    assert run_dojo("dev", "mutant", "edit", "tally", "x", str(other),
                    root=content).returncode == 0
    (other / "tally.py").write_text((other / "tally.py").read_text() + "\n# another mistake\n")
    again = run_dojo("dev", "mutant", "save", "tally", "split-on-space", "--from", str(other),
                     *new, root=content)
    assert again.returncode == 2 and "exists already" in again.stderr
    assert patch.read_bytes() == kept
    replace = run_dojo(*args, root=content)  # without --check/--mistake: an edit, allowed
    assert replace.returncode == 0, replace.stderr
