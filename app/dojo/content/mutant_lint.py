"""Lint rules for a lab's mutants stored as overlays (docs/lab-contract.md, "Mutants").

A mutant folder holds `mutant.yaml`, `expected.txt` (the golden message) and one
`<learner file>.patch` per file it changes. A mutant is refused when an overlay no longer
applies to the current solution, when it changes nothing, or when it makes exactly the same
change as another mutant (two names for one mistake test nothing new).
"""

from __future__ import annotations

from pathlib import Path

from dojo.content.labs import EXPECTED_FILE, Lab
from dojo.content.overlay import OverlayError, overlay, patch_name, patch_target
from dojo.content.problems import Problem

IGNORED = {"__pycache__", ".DS_Store", ".pytest_cache"}


def mutant_files(lab: Lab, folder: Path) -> list[Problem]:
    """Stray files in one mutant folder: full copies, patches of files the lab lacks."""
    problems = []
    for entry in sorted(folder.iterdir()):
        name = entry.name
        if name in IGNORED or name in ("mutant.yaml", EXPECTED_FILE):
            continue
        target = patch_target(entry)
        if entry.is_file() and target is not None:
            if target not in lab.files:
                problems.append(Problem(entry, 1, f"the overlay changes {target}, which is not "
                                                  "a learner file (lab.yaml `files`)"))
            continue
        if name in lab.files:
            problems.append(Problem(entry, 1, (
                f"a full copy of {name}: mutants store only what they change, as "
                f"{patch_name(name)} (`dojo dev mutant save {lab.id} {folder.name} --from "
                f"{folder}` converts it)")))
        else:
            problems.append(Problem(entry, 1, f"stray {'folder' if entry.is_dir() else 'file'} "
                                              f"in mutants/{folder.name}/: a mutant holds "
                                              "mutant.yaml, expected.txt and <file>.patch "
                                              "overlays"))
    if not (folder / EXPECTED_FILE).is_file():
        problems.append(Problem(folder / "mutant.yaml", 1, (
            f"no golden message: record {EXPECTED_FILE} with `dojo dev golden {lab.id} "
            f"--mutant {folder.name}`")))
    return problems


def mutant_overlays(lab: Lab, folders: list[Path]) -> list[Problem]:
    """Overlays that do not apply, change nothing, or duplicate another mutant's change."""
    problems: list[Problem] = []
    if not lab.solution_dir.is_dir():
        return problems  # the lab linter already says the solution is missing
    seen: dict[tuple[tuple[str, str], ...], str] = {}
    for folder in folders:
        try:
            changed = overlay(folder, lab.solution_dir)
        except OverlayError as exc:
            problems.append(Problem(exc.path, exc.line, exc.message))
            continue
        manifest = folder / "mutant.yaml"
        effective = {name: text for name, text in changed.items()
                     if text != (lab.solution_dir / name).read_text(encoding="utf-8")}
        if not effective:
            problems.append(Problem(manifest, 1, (
                "the mutant changes nothing: " + ("it has no <file>.patch overlay"
                                                   if not changed else
                                                   "its overlays leave the solution as it is")
                + ", so it makes no mistake")))
            continue
        key = tuple(sorted(effective.items()))
        if key in seen:
            problems.append(Problem(manifest, 1, f"the mutant makes exactly the same change as "
                                                 f"mutants/{seen[key]}/: one of them is redundant"))
        else:
            seen[key] = folder.name
    return problems
