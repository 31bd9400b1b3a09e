"""`dojo lab list | start | check | watch | hint | reset | diff`: the parser. What each command
does is in `dojo.cli.lab_commands`, imported only when a lab command runs.

Exit codes: 0 everything passed (or the action succeeded), 1 a check did not pass or the
learner declined, 2 a usage problem (unknown lab or stage, workspace not started).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from dojo.cli import lazy

COMMANDS = "dojo.cli.lab_commands"


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg,unused-ignore]
    parser = sub.add_parser("lab", help="labs: start, check, watch, hints, reset, diff")
    actions = parser.add_subparsers(dest="action", metavar="ACTION")

    p_list = actions.add_parser("list", help="the labs and your progress per stage")
    p_list.add_argument("--json", action="store_true", help="machine-readable output")
    p_list.set_defaults(handler=lazy(f"{COMMANDS}:list_labs"))

    p_start = actions.add_parser("start", help="copy the starter (and the README) to "
                                               "workspace/<slug>/")
    p_start.add_argument("slug")
    p_start.set_defaults(handler=lazy(f"{COMMANDS}:start"))

    p_check = actions.add_parser(
        "check", help="run the checker on your code",
        epilog="exit status: 0 every check passed; 1 a check failed or your code raised; "
               "2 usage problem; 3 a service broke under a check (nothing of yours failed); "
               "4 nothing failed, but some checks need Apache Kafka to be verified")
    _run_arguments(p_check, mutant=True)
    p_check.add_argument("--stage", action="append", default=[], metavar="S",
                         help="only this stage (repeatable)")
    p_check.add_argument("--check", action="append", default=[], metavar="C",
                         help="only this check id (repeatable)")
    p_check.add_argument("-x", "--stop-at-failing-stage", action="store_true",
                         help="stop after the first stage that does not pass")
    p_check.add_argument("--thorough", action="store_true",
                         help="also run the slow checks a default run leaves out (each takes "
                              "a minute or more; the lab's README names them)")
    p_check.add_argument("--json", action="store_true",
                         help="one JSON line per check result, nothing else on stdout")
    p_check.set_defaults(handler=lazy(f"{COMMANDS}:check"))

    p_watch = actions.add_parser("watch", help="re-check on every save: the stage you are "
                                               "on first, then the ones before it")
    _run_arguments(p_watch)
    p_watch.set_defaults(handler=lazy(f"{COMMANDS}:watch"))

    p_hint = actions.add_parser("hint", help="the next hint for the stage you are on")
    p_hint.add_argument("slug")
    p_hint.add_argument("stage", nargs="?", help="default: the first stage not passed yet")
    p_hint.set_defaults(handler=lazy(f"{COMMANDS}:hint"))

    p_reset = actions.add_parser("reset", help="put the starter files back (asks first)")
    p_reset.add_argument("slug")
    p_reset.add_argument("--yes", action="store_true", help="do not ask (for scripts)")
    p_reset.set_defaults(handler=lazy(f"{COMMANDS}:reset"))

    p_diff = actions.add_parser("diff", help="your changes against the starter")
    p_diff.add_argument("slug")
    p_diff.set_defaults(handler=lazy(f"{COMMANDS}:diff"))
    parser.set_defaults(handler=lambda args: (parser.print_help(), 2)[1])


def _run_arguments(parser: argparse.ArgumentParser, *, mutant: bool = False) -> None:
    parser.add_argument("slug")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--solution", action="store_true", help="check the reference solution")
    where.add_argument("--impl", type=Path, metavar="DIR", help="check the code in DIR")
    if mutant:
        where.add_argument("--mutant", metavar="NAME",
                           help="check the mutant NAME (overlaid on the solution in a scratch "
                                "directory); by default only the check it names")
