"""Fixture content roots: a copy of tests/fixtures/content that each test may break."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

FIXTURE_ROOT = Path(__file__).resolve().parents[1] / "fixtures" / "content"
DLQ = Path("lessons/01-dead-letter-queue")
IDEM = Path("lessons/02-idempotent-consumer")


class ContentRoot:
    """A writable copy of the fixture content, with helpers to break one thing at a time."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def path(self, relative: Path | str) -> Path:
        return self.root / relative

    def replace(self, relative: Path | str, old: str, new: str) -> None:
        """Replace `old` (which must be there, once or more) with `new` in a file."""
        path = self.path(relative)
        text = path.read_text(encoding="utf-8")
        assert old in text, f"fixture {relative} no longer contains {old!r}"
        path.write_text(text.replace(old, new), encoding="utf-8")

    def line_of(self, relative: Path | str, needle: str, nth: int = 1) -> int:
        """The 1-based line of the `nth` line containing `needle`."""
        seen = 0
        for number, line in enumerate(self.path(relative).read_text().split("\n"), start=1):
            if needle in line:
                seen += 1
                if seen == nth:
                    return number
        raise AssertionError(f"{needle!r} not found {nth} time(s) in {relative}")


@pytest.fixture
def content(tmp_path: Path) -> ContentRoot:
    root = tmp_path / "content"
    shutil.copytree(FIXTURE_ROOT, root)
    return ContentRoot(root)
