"""Lessons, cards and labs as typed models, their loaders and linters.

The TUI and CLI call:
- `load_catalog(root=None) -> Catalog` — every lesson and card (never raises on content).
- `lint_lessons(root=None) -> list[Problem]` — every rule of docs/content-format.md.
- `lab_availability(root, lab_id) -> LabAvailability` — READY when labs/<lab>/lab.yaml exists.
- `content_root()` — DOJO_CONTENT_ROOT, else the checkout.
Labs have their own loader in `dojo.content.labs` (docs/lab-contract.md).
"""

from dojo.content.catalog import load_catalog
from dojo.content.lab_links import LabAvailability, lab_availability
from dojo.content.lint import lint_lessons
from dojo.content.models import (
    Card,
    Catalog,
    FollowUp,
    KeyPoint,
    LabLink,
    Lesson,
    MistakeRow,
    Pattern,
    Section,
)
from dojo.content.problems import Problem
from dojo.content.root import content_root

__all__ = [
    "Card",
    "Catalog",
    "FollowUp",
    "KeyPoint",
    "LabAvailability",
    "LabLink",
    "Lesson",
    "MistakeRow",
    "Pattern",
    "Problem",
    "Section",
    "content_root",
    "lab_availability",
    "lint_lessons",
    "load_catalog",
]
