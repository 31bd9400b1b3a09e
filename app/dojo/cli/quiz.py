"""`dojo quiz [--lesson L] [--due] [--mock N]`: 60-second answers in a plain terminal.

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
from dojo.content import Card, Catalog, content_root, load_catalog
from dojo.quiz.mock import build_mock_interview, mock_report
from dojo.quiz.schedule import ReviewScheduler, suggested_grade
from dojo.quiz.scoring import Score, score_answer
from dojo.store import ProgressStore

DEFAULT_COUNT = 5
DEFAULT_SECONDS = 60.0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("quiz", help="answer interview questions in 60 seconds, "
                                         "scheduled by spaced repetition",
                            description="A quiz round in the terminal. On a TTY the answer is "
                                        "timed; from a pipe, answers end at an empty line.")
    parser.add_argument("--lesson", metavar="ID", help="only this lesson's cards")
    parser.add_argument("--due", action="store_true",
                        help="only cards due for review (default: due first, then new)")
    parser.add_argument("--mock", type=int, metavar="N",
                        help="a mock interview: N questions from different lessons, each with "
                             "a follow-up, then a report")
    parser.add_argument("-n", "--count", type=int, default=None,
                        help=f"how many cards (default {DEFAULT_COUNT}; with --due, all due)")
    parser.add_argument("--seconds", type=float, default=DEFAULT_SECONDS,
                        help="time per answer on a terminal (default 60)")
    parser.add_argument("--seed", type=int, default=None,
                        help="seed for picking mock interview questions")
    parser.add_argument("--aloud", action="store_true",
                        help="say the answer out loud while the clock runs (nothing typed), "
                             "then tick the points you made")
    parser.set_defaults(handler=run_quiz)
    actions = parser.add_subparsers(dest="quiz_action", metavar="[score|cards]")
    p_score = actions.add_parser("score", help="score an answer read from stdin against a card")
    p_score.add_argument("card_id", metavar="CARD_ID")
    p_score.add_argument("--json", action="store_true", help="machine-readable output")
    p_score.set_defaults(handler=run_score)
    p_cards = actions.add_parser("cards", help="list the card ids")
    p_cards.add_argument("--json", action="store_true", help="machine-readable output")
    p_cards.add_argument("--lesson", metavar="ID", help="only this lesson's cards")
    p_cards.set_defaults(handler=run_cards)


def run_score(args: argparse.Namespace) -> int:
    """`dojo quiz score CARD_ID [--json] < answer.txt`"""
    catalog = load_catalog(content_root())
    if not catalog.has_card(args.card_id):
        print(f"error: no card {args.card_id!r}; `dojo quiz cards` lists them", file=sys.stderr)
        return 2
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
    if args.lesson and not catalog.has_lesson(args.lesson):
        print(f"error: no lesson {args.lesson!r}", file=sys.stderr)
        return 2
    cards = catalog.lesson(args.lesson).cards if args.lesson else catalog.cards
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
    if args.lesson and not catalog.has_lesson(args.lesson):
        known = ", ".join(lesson.id for lesson in catalog.lessons) or "none yet"
        print(f"error: no lesson {args.lesson!r}; lessons: {known}", file=sys.stderr)
        return 2
    broken = [p for p in catalog.problems if p.path.name == "cards.yaml"]
    for problem in broken:
        # a card file that does not parse would otherwise just look like "nothing is due"
        print(f"error: {problem.path}:{problem.line}: {problem.message}", file=sys.stderr)
    if broken:
        files = len({problem.path for problem in broken})
        print(f"{files} cards.yaml file(s) could not be read; their cards are left out of "
              "this round. `dojo lint` lists every problem.", file=sys.stderr)
    if not catalog.cards:
        print(f"error: no cards under {root / 'lessons'} yet", file=sys.stderr)
        return 1
    if args.lesson and not catalog.lesson(args.lesson).cards and broken:
        return 1
    for value, flag in ((args.count, "--count"), (args.mock, "--mock")):
        if value is not None and value < 1:
            print(f"error: {flag} must be at least 1", file=sys.stderr)
            return 2
    with ProgressStore() as store:
        try:
            if args.mock:
                return _mock(console, catalog, store, args, root)
            return _drill(console, catalog, store, args)
        except KeyboardInterrupt:
            console.say("\nStopped.")
            return 130
        except BrokenPipeError:
            # The reader went away (`dojo quiz | head`); what was recorded stays recorded.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 141


def _drill(console: Console, catalog: Catalog, store: ProgressStore,
           args: argparse.Namespace) -> int:
    scheduler = ReviewScheduler(store)
    pool = catalog.lesson(args.lesson).cards if args.lesson else catalog.cards
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
