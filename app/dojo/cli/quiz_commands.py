"""What `dojo quiz …` does (the parser is in `dojo.cli.quiz`): 60-second answers in a plain
terminal.

A round: the question, a ticking countdown, the typed answer, the key points it made (✓)
and missed (✗), the model answer, a self-grade that FSRS schedules. `--mock N` strings N
headline questions with a follow-up each and ends with a report. Piped input works too (no
clock): answers end at an empty line, each followed by a grade line.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

from dojo.cli.errors import CommandFailed, UsageProblem
from dojo.cli.quiz import DEFAULT_COUNT
from dojo.cli.quiz_console import Console, StopQuiz
from dojo.cli.quiz_render import (
    Style,
    evidence_block,
    mock_report_block,
    model_answer_block,
    question_block,
    score_block,
    score_json,
    use_colour,
)
from dojo.content import Card, Catalog, Lesson, content_root, load_catalog
from dojo.quiz.mock import build_mock_interview, mock_report
from dojo.quiz.schedule import ReviewScheduler, suggested_grade
from dojo.quiz.scoring import Score, score_answer
from dojo.store import ProgressStore


def find_lesson(catalog: Catalog, ref: str) -> Lesson:
    """The lesson `--lesson` names, by id, number (`01`) or folder; a usage problem if none."""
    try:
        return catalog.find_lesson(ref)
    except KeyError as exc:
        raise UsageProblem(str(exc.args[0])) from None


def run_score(args: argparse.Namespace) -> int:
    """`dojo quiz score CARD_ID [--json] < answer.txt`"""
    catalog = load_catalog(content_root())
    if not catalog.has_card(args.card_id):
        raise UsageProblem(f"no card {args.card_id!r}; `dojo quiz cards` lists them")
    card = catalog.card(args.card_id)
    text = sys.stdin.read()
    score = score_answer(card, text)
    if args.json:
        print(json.dumps(score_json(card, score), indent=2, ensure_ascii=False))
    else:
        style = Style(use_colour(sys.stdout))
        print(score_block(score, style))
        print()
        print(evidence_block(score, style))
    return 0


def run_cards(args: argparse.Namespace) -> int:
    """`dojo quiz cards [--json] [--lesson L]`"""
    catalog = load_catalog(content_root())
    cards = find_lesson(catalog, args.lesson).cards if args.lesson else catalog.cards
    if args.json:
        rows = [{"id": card.id, "lesson": card.lesson_id, "kind": card.kind,
                 "question": card.question, "essentials": len(card.essentials),
                 "bonus": len(card.bonus_points), "format": 2 if card.has_cues else 1}
                for card in cards]
        print(json.dumps(rows, indent=2, ensure_ascii=False))
    else:
        for card in cards:
            print(f"{card.id:<48} {card.lesson_id:<28} {card.kind}")
    return 0


def run_quiz(args: argparse.Namespace) -> int:
    if getattr(args, "quiz_action", None):
        return int(args.handler(args))
    root = content_root()
    catalog = load_catalog(root)
    console = Console()
    lesson = find_lesson(catalog, args.lesson) if args.lesson else None
    broken = [p for p in catalog.problems if p.path.name == "cards.yaml"]
    for problem in broken:
        # a card file that does not parse would otherwise just look like "nothing is due"
        print(f"error: {problem.path}:{problem.line}: {problem.message}", file=sys.stderr)
    if broken:
        files = len({problem.path for problem in broken})
        print(f"{files} cards.yaml file(s) could not be read; their cards are left out of "
              "this round. `dojo lint` lists every problem.", file=sys.stderr)
    if not catalog.cards:
        raise CommandFailed(f"no cards under {root / 'lessons'} yet")
    if lesson is not None and not lesson.cards and broken:
        return 1
    for value, flag in ((args.count, "--count"), (args.mock, "--mock")):
        if value is not None and value < 1:
            raise UsageProblem(f"{flag} must be at least 1")
    with ProgressStore() as store:
        try:
            if args.mock:
                return _mock(console, catalog, store, args, root)
            return _drill(console, catalog, store, args, lesson)
        except KeyboardInterrupt:
            console.say("\nStopped.")
            return 130
        except BrokenPipeError:
            # The reader went away (`dojo quiz | head`); what was recorded stays recorded.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 141


def _drill(console: Console, catalog: Catalog, store: ProgressStore,
           args: argparse.Namespace, lesson: Lesson | None) -> int:
    scheduler = ReviewScheduler(store)
    pool = lesson.cards if lesson is not None else catalog.cards
    if args.due:
        cards = scheduler.due(pool)[:args.count] if args.count else scheduler.due(pool)
    else:
        cards = scheduler.next_cards(pool, args.count or DEFAULT_COUNT)
    if not cards:
        next_at = scheduler.next_due_at(pool)
        console.say("Nothing is due." + (f" Next review {_when(next_at)}." if next_at else
                                         " Run `dojo quiz` to start on new cards."))
        return 0
    scores: list[Score] = []
    try:
        for number, card in enumerate(cards, start=1):
            scores.append(_drill_round(console, catalog, store, scheduler, card, number,
                                       len(cards), args.seconds, args.aloud))
    except StopQuiz:
        pass
    _summary(console, scores, scheduler, pool)
    return 0


def _drill_round(console: Console, catalog: Catalog, store: ProgressStore,
                 scheduler: ReviewScheduler, card: Card, number: int, total: int,
                 seconds: float, aloud: bool = False) -> Score:
    style = console.style
    console.say(question_block(card, catalog.lesson_of(card), number, total, style))
    store.set_last_place("quiz", card.id, card.lesson_id)
    answer = console.read_answer(seconds, aloud=aloud)
    score = score_answer(card, answer.text)
    if not aloud:
        store.record_answer(card.id, answer.text, coverage=score.coverage,
                            raw_coverage=score.raw_coverage, matched_ids=score.matched_ids,
                            keyword_list=score.keyword_list, mode="drill",
                            seconds_used=answer.seconds_used if console.interactive else None)
    if aloud:
        console.say(model_answer_block(card, style))
    console.say(score_block(score, style, aloud=aloud))
    if not aloud and answer.text.strip():
        console.say(evidence_block(score, style))
    if not aloud:
        console.say(model_answer_block(card, style))
    confirmed = console.read_checklist(score, aloud=aloud)
    if aloud or confirmed.matched_ids != score.matched_ids:
        console.say(score_block(confirmed, style))
    score = confirmed
    grade = console.read_grade(suggested_grade(score))
    duration = round(answer.seconds_used * 1000) if console.interactive else None
    scheduled = scheduler.review(card.id, grade, duration_ms=duration)
    console.say(style.dim(f"  next review {_when(scheduled.due)}"))
    return score


def _summary(console: Console, scores: Sequence[Score], scheduler: ReviewScheduler,
             pool: Sequence[Card]) -> None:
    if not scores:
        console.say("No answers this time.")
        return
    mean = sum(score.coverage for score in scores) / len(scores)
    console.say("\n" + console.style.bold(f"{len(scores)} answered, mean coverage "
                                          f"{round(mean * 100)}%."))
    next_at = scheduler.next_due_at(pool)
    if next_at:
        console.say(f"Next review {_when(next_at)}.")


def _mock(console: Console, catalog: Catalog, store: ProgressStore,
          args: argparse.Namespace, root: Path) -> int:
    rng = random.Random(args.seed)
    interview = build_mock_interview(catalog, args.mock, rng)
    style = console.style
    total = len(interview.cards)
    console.say(style.bold(f"Mock interview: {len(interview.questions)} question(s), each "
                           "with a follow-up.") + " Answers are scored at the end.")
    scores: dict[str, Score] = {}
    number = 0
    try:
        for question in interview.questions:
            for card in question.cards:
                number += 1
                console.say(question_block(card, question.lesson, number, total, style))
                answer = console.read_answer(args.seconds)
                score = score_answer(card, answer.text)
                scores[card.id] = score
                store.record_answer(
                    card.id, answer.text, coverage=score.coverage,
                    raw_coverage=score.raw_coverage, matched_ids=score.matched_ids,
                    keyword_list=score.keyword_list, mode="mock",
                    seconds_used=answer.seconds_used if console.interactive else None)
    except StopQuiz:
        console.say(style.dim("(the interview ended early; unanswered questions count as 0)"))
    console.say(mock_report_block(mock_report(interview, scores, root), style))
    return 0


def _when(moment: datetime) -> str:
    """`in 10 min (14:05)` / `now`, in local time: something a person can plan with."""
    seconds = (moment - datetime.now(UTC)).total_seconds()
    local = moment.astimezone()
    if seconds <= 0:
        return "now"
    if seconds < 3600:
        return f"in {max(1, round(seconds / 60))} min ({local:%H:%M})"
    if seconds < 86400:
        return f"in {round(seconds / 3600)} h ({local:%H:%M})"
    return f"in {round(seconds / 86400)} days ({local:%a %d %b})"
