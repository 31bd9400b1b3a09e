"""Calibration table: the previous scorer and the current one on independent answers.

    .venv/bin/python bench/scoring.py [--lesson ID] [--held-out | --tuned] [--half dev|held]
                                      [--per-card]
                                      [--converted] [--cards-rev REV]

The answers in tests/quiz/calibration/*.yaml were written by someone who saw only the
questions. Kinds: strong, partial, wrong-right-words, negated, keywords, typos. The previous
scorer is the regex key points of the cards as they were at OLD_REV (before format 2), scored
the way it did then (matched / all, keyword lists ×0.5 capped at 25 %, no negation).

Every 5th card (in catalog order) is held out: never looked at while tuning cues or the
mechanism; `--held-out` shows only those, `--tuned` only the others. `--cards-rev` scores the
cards of another revision (a branch converting more lessons) with this checkout's scorer: cards
whose cues were written without this scorer are the fairest test of a change to the engine.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "app"))

from dojo.content import Card, load_catalog  # noqa: E402
from dojo.content.matching import fold, key_point_matches  # noqa: E402
from dojo.quiz.answer_shape import answer_shape  # noqa: E402
from dojo.quiz.scoring import score_answer  # noqa: E402

CALIBRATION = ROOT / "tests" / "quiz" / "calibration"
OLD_REV = "9dcbc8e"  # the last commit with regex-only key points
KINDS = ("strong", "partial", "wrong-right-words", "negated", "keywords", "typos")
STRONG_ENOUGH = 60


@dataclass(frozen=True)
class Answer:
    card_id: str
    kind: str
    text: str


def load_answers(directory: Path = CALIBRATION) -> list[Answer]:
    out: list[Answer] = []
    for path in sorted(directory.glob("*.yaml")):
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        for item in data.get("answers", []):
            out.append(Answer(str(data["card_id"]), str(item["kind"]), str(item["text"])))
    return out


def held_out_ids(cards: list[Card]) -> set[str]:
    """Every 5th card in catalog order (the 5th, 10th, …)."""
    return {card.id for index, card in enumerate(cards, start=1) if index % 5 == 0}


def lesson_half(catalog, card_id: str) -> str:
    """'dev' for a card of lessons 01-09, 'held' for lessons 10-19 (by the folder's number)."""
    number = catalog.lesson(catalog.card(card_id).lesson_id).dir.name[:2]
    return "dev" if int(number) <= 9 else "held"


def old_catalog(rev: str = OLD_REV):
    """The cards as they were at `rev`, loaded from a temporary checkout of `lessons/`."""
    tmp = Path(tempfile.mkdtemp(prefix="dojo-old-cards-"))
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "lessons"],
                             capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tmp)], input=archive, check=True)
    return load_catalog(tmp)


def old_percent(card: Card, text: str) -> int:
    """The previous scorer: share of regex key points matched, keyword lists capped."""
    folded = fold(text)
    points = card.key_points
    raw = sum(key_point_matches(point, folded) for point in points) / len(points)
    if answer_shape(text).looks_like_keyword_list:
        raw = min(raw * 0.5, 0.25)
    return round(raw * 100)


def table(rows: dict[str, list[int]], title: str) -> str:
    lines = [title, f"  {'kind':<18}{'n':>4}{'mean':>7}{'min':>6}{'max':>6}{'≥60%':>8}"]
    for kind in KINDS:
        values = rows.get(kind, [])
        if not values:
            continue
        share = sum(v >= STRONG_ENOUGH for v in values)
        lines.append(f"  {kind:<18}{len(values):>4}{statistics.mean(values):>7.1f}"
                     f"{min(values):>6}{max(values):>6}{share:>5}/{len(values):<3}")
    return "\n".join(lines)


def typo_gaps(scores: dict[tuple[str, str], list[int]]) -> list[int]:
    """Per card: |typos − first strong|."""
    gaps = []
    for (card_id, kind), values in scores.items():
        if kind == "typos" and (card_id, "strong") in scores:
            gaps.append(abs(values[0] - scores[(card_id, "strong")][0]))
    return gaps


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lesson", help="only this lesson's cards")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--held-out", action="store_true", help="only the held-out cards")
    group.add_argument("--tuned", action="store_true", help="only the cards tuned on")
    parser.add_argument("--half", choices=("dev", "held"),
                        help="dev: the cards of lessons 01-09 (tuned on since round 3); "
                             "held: lessons 10-19 (their answers never read while tuning)")
    parser.add_argument("--per-card", action="store_true", help="one line per answer")
    parser.add_argument("--converted", action="store_true",
                        help="only cards in format 2 (essentials, cues, misconceptions)")
    parser.add_argument("--dir", type=Path, default=CALIBRATION)
    parser.add_argument("--cards-rev", metavar="REV",
                        help="score with the cards of this git revision (e.g. a branch that "
                             "converts more lessons) and this checkout's scorer")
    args = parser.parse_args(argv)

    catalog = old_catalog(args.cards_rev) if args.cards_rev else load_catalog(ROOT)
    old = old_catalog()
    held = held_out_ids(list(catalog.cards))
    answers = [a for a in load_answers(args.dir) if catalog.has_card(a.card_id)]
    if args.lesson:
        answers = [a for a in answers if catalog.card(a.card_id).lesson_id == args.lesson]
    if args.converted:
        answers = [a for a in answers if catalog.card(a.card_id).has_cues]
    if args.half:
        answers = [a for a in answers if lesson_half(catalog, a.card_id) == args.half]
    if args.held_out:
        answers = [a for a in answers if a.card_id in held]
    elif args.tuned:
        answers = [a for a in answers if a.card_id not in held]
    if not answers:
        print(f"no calibration answers under {args.dir}")
        return 1
    new_rows: dict[str, list[int]] = defaultdict(list)
    old_rows: dict[str, list[int]] = defaultdict(list)
    new_by: dict[tuple[str, str], list[int]] = defaultdict(list)
    old_by: dict[tuple[str, str], list[int]] = defaultdict(list)
    timings: list[float] = []
    for answer in answers:
        card = catalog.card(answer.card_id)
        started = time.perf_counter()
        new = score_answer(card, answer.text).percent
        timings.append(time.perf_counter() - started)
        before = old_percent(old.card(answer.card_id), answer.text) \
            if old.has_card(answer.card_id) else 0
        new_rows[answer.kind].append(new)
        old_rows[answer.kind].append(before)
        new_by[(answer.card_id, answer.kind)].append(new)
        old_by[(answer.card_id, answer.kind)].append(before)
        if args.per_card:
            print(f"{answer.card_id:<44} {answer.kind:<18} old {before:>3}  new {new:>3}")
    cards = {a.card_id for a in answers}
    converted = sum(catalog.card(c).has_cues for c in cards)
    print(f"{len(answers)} answers for {len(cards)} cards ({converted} in format 2)\n")
    old_text = table(old_rows, "previous scorer (regex key points)").split("\n")
    new_text = table(new_rows, "current scorer").split("\n")
    for left, right in zip(old_text, new_text, strict=True):
        print(f"{left:<52}{right}")
    timings.sort()
    print(f"\ncurrent scorer: {1000 * statistics.mean(timings):.1f} ms per answer on average, "
          f"p95 {1000 * timings[int(0.95 * (len(timings) - 1))]:.1f} ms, "
          f"max {1000 * timings[-1]:.1f} ms (cue engine only: no model is bundled, see "
          "docs/answer-scoring.md)")
    for name, by in (("previous", old_by), ("current", new_by)):
        gaps = typo_gaps(by)
        if gaps:
            print(f"\n{name}: typos vs strong, mean gap {statistics.mean(gaps):.1f}, "
                  f"max {max(gaps)} points, within 10: {sum(g <= 10 for g in gaps)}/{len(gaps)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
