"""Learner-facing text names a source a reader can find, never our internal "seed" documents.

`seed_mentions(path)` yields one Problem per line that uses the word (seed, seeds, seeded,
the seed's ...). `dojo lint` applies it to every lesson.md (through `lint_lessons`) and to
every lab's README.md and lab.yaml, where the stage texts and hints live (through
`lint_labs`). Card files are not checked here: they are linted with the lessons' card rules.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

from dojo.content.problems import Problem

_SEED = re.compile(r"\bseed(?:s|ed|'s)?\b", re.IGNORECASE)
MESSAGE = ("says 'seed': name a source a reader can find (official docs, a KIP, a release "
           "note) or state the fact")
LAB_TEXT_FILES = ("README.md", "lab.yaml")


def seed_mentions(path: Path) -> Iterator[Problem]:
    """One problem per line of `path` that says "seed"; nothing if the file does not exist."""
    if not path.is_file():
        return
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if _SEED.search(line):
            yield Problem(path, number, MESSAGE)


def lab_seed_mentions(lab_dir: Path) -> Iterator[Problem]:
    """The 'seed' rule over the learner-facing files of one lab folder."""
    for name in LAB_TEXT_FILES:
        yield from seed_mentions(lab_dir / name)


def learner_text_files(root: Path) -> list[Path]:
    return sorted([*root.glob("lessons/*/lesson.md"),
                   *(path for name in LAB_TEXT_FILES for path in root.glob(f"labs/*/{name}"))])
