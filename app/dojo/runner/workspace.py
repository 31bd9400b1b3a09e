"""The learner's workspace: `workspace/<slug>/` under the content root (git-ignored).

`start` copies the starter there (never over existing work) with the lab's README beside it,
`reset` puts the starter files back (the caller asks for confirmation first), `diff` shows
the learner's changes against the starter as a unified diff.

The README is the lab's text, not the learner's: it is kept read-only and refreshed whenever
the lab's own README changes, so the instructions next to the code are never stale.
"""

from __future__ import annotations

import difflib
import os
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path

from dojo.content.labs import Lab


@dataclass(frozen=True)
class StartOutcome:
    path: Path
    created: bool  # False: the workspace existed; nothing was overwritten
    copied: tuple[str, ...]  # starter files copied now (missing ones are filled in)


README = "README.md"


def workspace_dir(lab: Lab) -> Path:
    """Where the learner edits `lab`'s files."""
    return lab.content_root / "workspace" / lab.id


def readme_path(lab: Lab) -> Path:
    """The lab's README as the learner sees it, beside their files."""
    return workspace_dir(lab) / README


def _place_readme(lab: Lab) -> None:
    """Copy the lab's README into the workspace when it is missing or out of date."""
    source, target = lab.readme, readme_path(lab)
    if not source.is_file() or README in lab.files:
        return
    text = source.read_bytes()
    if target.is_file() and target.read_bytes() == text:
        return
    if target.exists():
        os.chmod(target, stat.S_IRUSR | stat.S_IWUSR)
        target.unlink()
    target.write_bytes(text)
    os.chmod(target, stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)


def start(lab: Lab) -> StartOutcome:
    """Copy the starter into the workspace. Existing files are kept as they are; a starter
    file missing from the workspace (deleted by mistake) is copied again."""
    target = workspace_dir(lab)
    created = not target.exists()
    copied = []
    for name in lab.files:
        destination = target / name
        if not destination.exists():
            destination.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(lab.starter_dir / name, destination)
            copied.append(name)
    _place_readme(lab)
    return StartOutcome(target, created, tuple(copied))


def changed_files(lab: Lab) -> list[str]:
    """The learner files that differ from the starter (what `reset` would overwrite)."""
    target = workspace_dir(lab)
    return [name for name in lab.files
            if not (target / name).is_file()
            or (target / name).read_bytes() != (lab.starter_dir / name).read_bytes()]


def reset(lab: Lab) -> list[str]:
    """Put every starter file back as it was; return the files that changed. Other files
    the learner created (notes, scratch scripts) are left alone."""
    target = workspace_dir(lab)
    changed = changed_files(lab)
    for name in lab.files:
        destination = target / name
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(lab.starter_dir / name, destination)
    shutil.rmtree(target / "__pycache__", ignore_errors=True)
    _place_readme(lab)
    return changed


def _lines(path: Path) -> list[str]:
    if not path.is_file():
        return []
    return path.read_text(encoding="utf-8", errors="replace").splitlines(keepends=True)


def diff(lab: Lab) -> str:
    """A unified diff from the starter to the workspace, file by file; "" when unchanged."""
    target = workspace_dir(lab)
    chunks = []
    for name in lab.files:
        before, after = _lines(lab.starter_dir / name), _lines(target / name)
        if before == after:
            continue
        lines = difflib.unified_diff(before, after, fromfile=f"starter/{name}",
                                     tofile=f"workspace/{lab.id}/{name}")
        chunks.append("".join(line if line.endswith("\n") else line + "\n\\ No newline at end "
                              "of file\n" for line in lines))
    return "".join(chunks)
