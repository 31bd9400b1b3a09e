"""Mutants as overlays: a unified diff per changed learner file, applied to the solution.

A mutant folder holds `mutant.yaml`, `expected.txt` and one `<file>.patch` per learner file
it changes (`relay.py.patch`), a unified diff against `solutions/<lab>/<file>` with three
lines of context. Why a diff and not a full copy of the changed file plus a hash of the
solution: the diff is a few dozen lines instead of a few hundred, reviewers read the mistake
itself, and its context lines *are* the verification: a hunk applies only where its context
and removed lines still match the current solution exactly, so an edit to the solution near
a mutation makes the overlay fail (the linter names the patch line and the solution line),
while an edit elsewhere in the file moves the hunk without changing what the mutant is (the
same rule as `git apply`: any offset, no fuzz). A hash would flag every solution edit, even a
comment far from the mistake, and a full copy would silently keep the old code.

This module reads and writes files; it runs no code.
"""

from __future__ import annotations

import difflib
import re
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

PATCH_SUFFIX = ".patch"
CONTEXT_LINES = 3
_HUNK = re.compile(r"^@@ -(?P<a>\d+)(?:,(?P<b>\d+))? \+(?P<c>\d+)(?:,(?P<d>\d+))? @@")
_NO_EOL = "\\ No newline at end of file"


class OverlayError(ValueError):
    """An overlay that cannot be read or applied; `str()` reads `path:line: message`."""

    def __init__(self, path: Path, line: int, message: str) -> None:
        super().__init__(f"{path}:{line}: {message}")
        self.path = path
        self.line = line
        self.message = message


@dataclass(frozen=True)
class Hunk:
    """One `@@` block: the solution lines it expects at `old_start` and what replaces them."""

    old_start: int  # 1-based line in the solution file (for an empty old side: the line before)
    old: tuple[str, ...]  # context and removed lines, with their line endings
    new: tuple[str, ...]  # context and added lines
    line: int  # the `@@` line in the patch file


@dataclass(frozen=True)
class FilePatch:
    """A parsed `<file>.patch`: the learner file it changes and its hunks."""

    target: str
    path: Path
    hunks: tuple[Hunk, ...]


def patch_name(target: str) -> str:
    """The overlay file name for learner file `target` (`relay.py` → `relay.py.patch`)."""
    return target + PATCH_SUFFIX


def patch_target(path: Path) -> str | None:
    """The learner file an overlay file changes, or None when `path` is not an overlay."""
    return path.name[: -len(PATCH_SUFFIX)] if path.name.endswith(PATCH_SUFFIX) else None


def make_patch(target: str, before: str, after: str, *, old_label: str, new_label: str,
               context: int = CONTEXT_LINES) -> str:
    """A unified diff turning `before` into `after`; "" when they are equal."""
    out: list[str] = []
    for line in difflib.unified_diff(before.splitlines(keepends=True),
                                     after.splitlines(keepends=True),
                                     fromfile=old_label, tofile=new_label, n=context):
        out.append(line)
        if not line.endswith("\n"):  # the last line of a file without a final newline
            out.append("\n" + _NO_EOL + "\n")
    return "".join(out)


def parse_patch(path: Path) -> FilePatch:
    """Read `path` (a `<file>.patch`); malformed hunks raise `OverlayError` at their line."""
    target = patch_target(path)
    if target is None:
        raise OverlayError(path, 1, f"an overlay file is named <learner file>{PATCH_SUFFIX}")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise OverlayError(path, 1, f"cannot read: {exc}") from exc
    lines = text.splitlines(keepends=True)
    hunks: list[Hunk] = []
    index = 0
    while index < len(lines) and not lines[index].startswith("@@"):
        if not lines[index].startswith(("--- ", "+++ ")):
            raise OverlayError(path, index + 1, "expected `--- `/`+++ ` headers, then `@@` "
                                                "hunks (a unified diff)")
        index += 1
    while index < len(lines):
        header = _HUNK.match(lines[index])
        if header is None:
            raise OverlayError(path, index + 1, "expected a hunk header `@@ -a,b +c,d @@`")
        at = index + 1
        old_count = int(header["b"] if header["b"] is not None else 1)
        new_count = int(header["d"] if header["d"] is not None else 1)
        old: list[str] = []
        new: list[str] = []
        index += 1
        while index < len(lines) and (len(old) < old_count or len(new) < new_count
                                      or lines[index].startswith("\\")):
            line = lines[index]
            kind, body = line[:1], line[1:]
            if kind == "\\":  # the previous line had no newline at the end of the file
                previous = lines[index - 1]
                if previous[:1] in (" ", "-") and old:
                    old[-1] = old[-1].rstrip("\n")
                if previous[:1] in (" ", "+") and new:
                    new[-1] = new[-1].rstrip("\n")
            elif kind == " " or line in ("\n", ""):
                body = body or "\n"
                old.append(body)
                new.append(body)
            elif kind == "-":
                old.append(body)
            elif kind == "+":
                new.append(body)
            else:
                raise OverlayError(path, index + 1, "a hunk line starts with ' ', '-' or '+'")
            index += 1
        if len(old) != old_count or len(new) != new_count:
            raise OverlayError(path, at, f"the hunk promises {old_count} old and {new_count} "
                                         f"new lines but holds {len(old)} and {len(new)}")
        hunks.append(Hunk(int(header["a"]), tuple(old), tuple(new), at))
    if not hunks:
        raise OverlayError(path, 1, "the overlay has no hunks: it changes nothing")
    return FilePatch(target, path, tuple(hunks))


def _find(lines: list[str], wanted: tuple[str, ...], expected: int, earliest: int) -> int | None:
    """Where `wanted` occurs in `lines` at or after `earliest`, nearest to `expected`."""
    last = len(lines) - len(wanted)
    if last < earliest:
        return None
    expected = min(max(expected, earliest), last)
    for distance in range(max(expected - earliest, last - expected) + 1):
        for start in (expected - distance, expected + distance):
            if earliest <= start <= last and tuple(lines[start:start + len(wanted)]) == wanted:
                return start
    return None


def _mismatch(lines: list[str], hunk: Hunk, start: int) -> str:
    """The first line where the solution differs from what the hunk expects, said plainly."""
    for offset, wanted in enumerate(hunk.old):
        number = start + offset
        found = lines[number] if number < len(lines) else None
        if found != wanted:
            shown = "the end of the file" if found is None else repr(found.rstrip("\n"))
            return (f"line {number + 1} expected {wanted.rstrip(chr(10))!r}, found {shown}")
    return f"line {start + 1}"


def apply_patch(patch: FilePatch, original: str, original_label: str) -> str:
    """`original` with every hunk applied; a hunk whose context and removed lines no longer
    occur exactly raises `OverlayError` at the hunk's line, naming the solution line."""
    lines = original.splitlines(keepends=True)
    out: list[str] = []
    position = 0
    for number, hunk in enumerate(patch.hunks, 1):
        expected = hunk.old_start - 1 if hunk.old else hunk.old_start
        start = _find(lines, hunk.old, expected, position)
        if start is None:
            where = _mismatch(lines, hunk, max(expected, position))
            raise OverlayError(patch.path, hunk.line, (
                f"hunk {number} no longer applies to {original_label}: {where}. The solution "
                "changed under this mutant: re-create it (dojo dev mutant edit/save)"))
        out.extend(lines[position:start])
        out.extend(hunk.new)
        position = start + len(hunk.old)
    out.extend(lines[position:])
    return "".join(out)


def overlay_files(mutant_dir: Path) -> list[Path]:
    """The overlay files in a mutant folder, sorted."""
    return sorted(p for p in mutant_dir.iterdir() if p.is_file() and patch_target(p))


def overlay(mutant_dir: Path, solution_dir: Path) -> dict[str, str]:
    """The learner files the mutant changes, as text after applying its overlays."""
    changed: dict[str, str] = {}
    for path in overlay_files(mutant_dir):
        patch = parse_patch(path)
        source = solution_dir / patch.target
        try:
            original = source.read_text(encoding="utf-8")
        except OSError as exc:
            raise OverlayError(path, 1, f"the overlay changes {patch.target}, which "
                                        f"{solution_dir} does not hold") from exc
        changed[patch.target] = apply_patch(patch, original, _label(source))
    return changed


def materialise(mutant_dir: Path, solution_dir: Path, files: Iterable[str], dest: Path) -> Path:
    """Write the full mutant to `dest`: the solution's `files` with the overlays applied."""
    changed = overlay(mutant_dir, solution_dir)
    dest.mkdir(parents=True, exist_ok=True)
    for name in files:
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if name in changed:
            target.write_bytes(changed[name].encode("utf-8"))
        else:
            shutil.copyfile(solution_dir / name, target)
    return dest


def record(source_dir: Path, solution_dir: Path, files: Iterable[str], mutant_dir: Path
           ) -> list[str]:
    """Store `source_dir` (full learner files) as overlays in `mutant_dir`: one patch per file
    that differs from the solution; stale patches are removed. Returns the changed files."""
    mutant_dir.mkdir(parents=True, exist_ok=True)
    changed = []
    for name in files:
        before = (solution_dir / name).read_text(encoding="utf-8")
        after = (source_dir / name).read_text(encoding="utf-8")
        target = mutant_dir / patch_name(name)
        if before == after:
            target.unlink(missing_ok=True)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(make_patch(name, before, after,
                                     old_label=f"solution/{name}",
                                     new_label=f"mutant/{name}"), encoding="utf-8")
        changed.append(name)
    return changed


def _label(path: Path) -> str:
    parts = path.parts
    return "/".join(parts[-3:]) if len(parts) >= 3 else str(path)
