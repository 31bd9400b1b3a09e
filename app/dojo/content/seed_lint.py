"""Learner-facing text names a source a reader can find, never our internal "seed" documents.

`seed_mentions(path)` yields one Problem per line of a lesson.md or lab README that uses the
word (seed, seeds, seeded, the seed's ...). Not yet part of `dojo lint`: the lessons still
have such lines, and the rule is wired in once they are rewritten (issue 14, item 15).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

from dojo.content.problems import Problem

_SEED = re.compile(r"\bseed(?:s|ed|'s)?\b", re.IGNORECASE)
MESSAGE = ("says 'seed': name a source a reader can find (official docs, a KIP, a release "
           "note) or state the fact")


def seed_mentions(path: Path) -> Iterator[Problem]:
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if _SEED.search(line):
            yield Problem(path, number, MESSAGE)


def learner_text_files(root: Path) -> list[Path]:
    return sorted([*root.glob("lessons/*/lesson.md"), *root.glob("labs/*/README.md")])
