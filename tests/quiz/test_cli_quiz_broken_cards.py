"""A cards.yaml that does not parse is named with its line, never shown as "Nothing is due"."""

from __future__ import annotations

import shutil
from pathlib import Path

from tests.quiz.cli_helpers import FIXTURES, run_dojo


def test_a_broken_cards_file_is_named_not_hidden_as_nothing_due(tmp_path: Path) -> None:
    content = tmp_path / "content"
    shutil.copytree(FIXTURES, content)
    cards = content / "lessons" / "02-idempotent-consumer" / "cards.yaml"
    cards.write_text("- id: broken\n  question: [unclosed\n", encoding="utf-8")
    result = run_dojo(["quiz", "--lesson", "idempotent-consumer", "--due"],
                      tmp_path / "data", content=content)
    assert "Nothing is due" not in result.stdout, result.stdout
    assert f"{cards}:" in result.stderr, result.stderr
    assert "could not be read" in result.stderr
    assert result.returncode == 1
