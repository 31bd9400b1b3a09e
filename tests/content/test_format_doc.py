"""The linter's fixed tables are the ones docs/content-format.md publishes; the catalog of
labs and lessons is never a table in code (it is what is on disk)."""

from __future__ import annotations

import re
from pathlib import Path

from dojo.content.lesson_lint import SECTIONS

DOC = (Path(__file__).resolve().parents[2] / "docs" / "content-format.md").read_text()


def test_no_table_of_planned_labs_or_lessons_in_the_code() -> None:
    app = Path(__file__).resolve().parents[2] / "app"
    offenders = [f"{path.relative_to(app)}:{number}" for path in sorted(app.rglob("*.py"))
                 for number, line in enumerate(path.read_text().splitlines(), 1)
                 if re.search(r"\bPLANNED_[A-Z_]+\s*[:=]", line)]
    assert not offenders, f"content belongs in lessons/ and labs/, not in code: {offenders}"


def test_required_sections_match_the_doc_in_order() -> None:
    titles = tuple(re.findall(r"^\d\. `## ([^`]+)`", DOC, re.MULTILINE))
    assert titles == SECTIONS
