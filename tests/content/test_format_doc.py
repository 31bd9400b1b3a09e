"""The linter's fixed tables are the ones docs/content-format.md publishes."""

from __future__ import annotations

import re
from pathlib import Path

from dojo.content import PLANNED_LAB_STAGES
from dojo.content.lesson_lint import SECTIONS
from dojo.content.lint import PLANNED_LESSONS

DOC = (Path(__file__).resolve().parents[2] / "docs" / "content-format.md").read_text()


def test_planned_lab_stages_match_the_table_in_the_doc() -> None:
    rows = re.findall(r"^\| `([a-z-]+)` \| (.+) \|$", DOC, re.MULTILINE)
    table = {lab: tuple(re.findall(r"`([a-z-]+)`", stages)) for lab, stages in rows}
    assert table == PLANNED_LAB_STAGES


def test_planned_lesson_folders_match_the_doc() -> None:
    folders = tuple(re.findall(r"`(\d\d-[a-z-]+)`", DOC.split("## The lessons")[1]))
    assert folders == PLANNED_LESSONS


def test_required_sections_match_the_doc_in_order() -> None:
    titles = tuple(re.findall(r"^\d\. `## ([^`]+)`", DOC, re.MULTILINE))
    assert titles == SECTIONS
