"""A content problem: a message anchored at a file and line, printed as `path:line: message`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, order=True)
class Problem:
    """One thing wrong with a content file, where an editor can jump to it."""

    path: Path
    line: int
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.message}"

    def relative_to(self, root: Path) -> Problem:
        """The same problem with its path relative to `root` when it lies inside it."""
        try:
            return Problem(self.path.relative_to(root), self.line, self.message)
        except ValueError:
            return self
