"""The calibration sets kept whole here (tests/quiz/calibration2/ to calibration5/, see their
README.md) cover every card.

The sets are measured by bench/scoring.py, not asserted here (their scores are a benchmark,
and card work must not be tuned on them); this test only keeps each whole as cards are added:
one file per card, the card's own question, the set's kinds.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from dojo.content import content_root, load_catalog

HERE = Path(__file__).parent
SETS = {
    "calibration2": {"strong", "negated", "wrong-right-words"},
    "calibration3": {"strong", "negated", "wrong-right-words", "partial", "keywords"},
    "calibration4": {"strong", "negated", "wrong-right-words", "partial", "keywords"},
    "calibration5": {"strong", "negated", "wrong-right-words", "partial", "keywords"},
}


@pytest.mark.parametrize("name", sorted(SETS))
def test_every_card_has_held_out_answers_of_each_kind(name: str) -> None:
    catalog = load_catalog(content_root())
    problems = []
    for card in catalog.cards:
        path = HERE / name / f"{card.id}.yaml"
        if not path.exists():
            problems.append(f"{card.id}: no {path.name}")
            continue
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        kinds = {answer["kind"] for answer in data["answers"]}
        if data["card_id"] != card.id or kinds != SETS[name]:
            problems.append(f"{path.name}: card_id {data['card_id']!r}, kinds {sorted(kinds)}")
        if data["question"].strip() != card.question.strip():
            problems.append(f"{path.name}: question differs from the card's")
    assert not problems, "\n".join(problems)
