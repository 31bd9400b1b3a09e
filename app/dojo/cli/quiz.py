"""`dojo quiz [--lesson L] [--due] [--mock N]`, `dojo quiz score`, `dojo quiz cards`: the
parser. What they do is in `dojo.cli.quiz_commands`, imported when a quiz command runs.

A round: the question, a ticking countdown, the typed answer, the key points it made (✓)
and missed (✗), the model answer, a self-grade that FSRS schedules. `--mock N` strings N
headline questions with a follow-up each and ends with a report. Piped input works too (no
clock): answers end at an empty line, each followed by a grade line.
"""

from __future__ import annotations

import argparse

from dojo.cli import lazy

COMMANDS = "dojo.cli.quiz_commands"
DEFAULT_COUNT = 5
DEFAULT_SECONDS = 60.0
LESSON_HELP = "only this lesson's cards: its number (01) or id (dead-letter-queue)"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("quiz", help="answer interview questions in 60 seconds, "
                                         "scheduled by spaced repetition",
                            description="A quiz round in the terminal. On a TTY the answer is "
                                        "timed; from a pipe, answers end at an empty line.")
    parser.add_argument("--lesson", metavar="L", help=LESSON_HELP)
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
    parser.set_defaults(handler=lazy(f"{COMMANDS}:run_quiz"))
    actions = parser.add_subparsers(dest="quiz_action", metavar="[score|cards]")
    p_score = actions.add_parser("score", help="score an answer read from stdin against a card")
    p_score.add_argument("card_id", metavar="CARD_ID")
    p_score.add_argument("--json", action="store_true", help="machine-readable output")
    p_score.set_defaults(handler=lazy(f"{COMMANDS}:run_score"))
    p_cards = actions.add_parser("cards", help="list the card ids")
    p_cards.add_argument("--json", action="store_true", help="machine-readable output")
    p_cards.add_argument("--lesson", metavar="L", help=LESSON_HELP)
    p_cards.set_defaults(handler=lazy(f"{COMMANDS}:run_cards"))
