"""The held-out calibration set (tests/quiz/calibration3/README.md) covers every card.

The set is measured by bench/scoring.py, not asserted here (its scores are a benchmark, and
card work must not be tuned on it); this test only keeps it whole as cards are added: one file
per card, the card's own question, the five kinds.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from dojo.content import content_root, load_catalog

SET = Path(__file__).parent / "calibration3"
KINDS = {"strong", "negated", "wrong-right-words", "partial", "keywords"}


def test_every_card_has_held_out_answers_of_each_kind() -> None:
    catalog = load_catalog(content_root())
    problems = []
    for card in catalog.cards:
        path = SET / f"{card.id}.yaml"
        if not path.exists():
            problems.append(f"{card.id}: no {path.name}")
            continue
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        kinds = {answer["kind"] for answer in data["answers"]}
        if data["card_id"] != card.id or kinds != KINDS:
            problems.append(f"{path.name}: card_id {data['card_id']!r}, kinds {sorted(kinds)}")
        if data["question"].strip() != card.question.strip():
            problems.append(f"{path.name}: question differs from the card's")
    assert not problems, "\n".join(problems)
