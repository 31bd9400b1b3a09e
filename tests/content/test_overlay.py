"""Mutant overlays: a unified diff recorded from full files reproduces them byte for byte,
applies after unrelated solution edits, and refuses (naming lines) when its context moved."""

from __future__ import annotations

from pathlib import Path

import pytest

from dojo.content.overlay import (
    OverlayError,
    apply_patch,
    make_patch,
    materialise,
    parse_patch,
    record,
)

SOLUTION = "".join(f"line {n}\n" for n in range(1, 31))


def _patch(tmp_path: Path, before: str, after: str) -> Path:
    path = tmp_path / "code.py.patch"
    path.write_text(make_patch("code.py", before, after, old_label="a", new_label="b"))
    return path


def _applied(path: Path, original: str) -> str:
    return apply_patch(parse_patch(path), original, "solutions/lab/code.py")


@pytest.mark.parametrize("after", [
    SOLUTION.replace("line 15\n", "line fifteen\n"),
    SOLUTION.replace("line 1\n", "") + "appended\n",
    "new first\n" + SOLUTION.replace("line 30\n", "line 30"),  # no final newline
    SOLUTION.replace("line 5\n", "").replace("line 25\n", "line 25\nextra\n"),
])
def test_a_recorded_patch_reproduces_the_mutant_exactly(tmp_path: Path, after: str) -> None:
    assert _applied(_patch(tmp_path, SOLUTION, after), SOLUTION) == after


def test_an_edit_elsewhere_in_the_solution_moves_the_hunk(tmp_path: Path) -> None:
    after = SOLUTION.replace("line 20\n", "line twenty\n")
    patch = _patch(tmp_path, SOLUTION, after)
    moved = "header\nheader\n" + SOLUTION
    assert _applied(patch, moved) == "header\nheader\n" + after


def test_an_edit_under_the_context_refuses_and_names_both_lines(tmp_path: Path) -> None:
    patch = _patch(tmp_path, SOLUTION, SOLUTION.replace("line 20\n", "line twenty\n"))
    changed = SOLUTION.replace("line 19\n", "line nineteen\n")
    with pytest.raises(OverlayError) as caught:
        _applied(patch, changed)
    assert caught.value.path == patch and caught.value.line == 3  # the @@ line
    assert "line 19 expected 'line 19', found 'line nineteen'" in caught.value.message


def test_a_malformed_patch_names_its_line(tmp_path: Path) -> None:
    path = tmp_path / "code.py.patch"
    path.write_text("--- a\n+++ b\n@@ -1,2 +1,2 @@\n line 1\n*line 2\n")
    with pytest.raises(OverlayError) as caught:
        parse_patch(path)
    assert caught.value.line == 5


def test_record_then_materialise_round_trips_and_skips_unchanged_files(tmp_path: Path) -> None:
    solution, full, mutant, out = (tmp_path / n for n in ("solution", "full", "mutant", "out"))
    for folder in (solution, full):
        folder.mkdir()
        (folder / "a.py").write_text(SOLUTION)
        (folder / "b.sql").write_text("CREATE TABLE t (id int);\n")
    (full / "a.py").write_text(SOLUTION.replace("line 7\n", "line seven\n"))
    assert record(full, solution, ["a.py", "b.sql"], mutant) == ["a.py"]
    assert sorted(p.name for p in mutant.iterdir()) == ["a.py.patch"]
    materialise(mutant, solution, ["a.py", "b.sql"], out)
    for name in ("a.py", "b.sql"):
        assert (out / name).read_bytes() == (full / name).read_bytes()
