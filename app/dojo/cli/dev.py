"""`dojo dev …`: commands for lab and lesson authors (docs/add-a-lab.md).

    dojo dev new-lab SLUG            a lint-clean lab skeleton: lab.yaml, README, starter,
                                     one check, one mutant with its golden, the solution
    dojo dev new-lesson SLUG         lessons/NN-SLUG/ with lesson.md and cards.yaml
    dojo dev mutant edit SLUG NAME DIR    the full files of a mutant (or of the solution,
                                          for a new one) in DIR, to edit
    dojo dev mutant save SLUG NAME --from DIR   store DIR's differences from the solution
                                                as the mutant's overlays
    dojo dev golden SLUG [--mutant NAME]  run mutants and record expected.txt

Exit codes: 0 done, 1 something did not work (said why), 2 a usage problem.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from dojo.cli import lazy

COMMANDS = "dojo.cli.dev_commands"


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg,unused-ignore]
    parser = sub.add_parser("dev", help="authoring: new labs and lessons, mutants, goldens")
    actions = parser.add_subparsers(dest="dev_action", metavar="ACTION")

    p_lab = actions.add_parser("new-lab", help="create a lint-clean lab skeleton")
    p_lab.add_argument("slug")
    p_lab.add_argument("--root", type=Path, default=None, help="content root (default: this "
                                                               "checkout or DOJO_CONTENT_ROOT)")
    p_lab.set_defaults(handler=lazy(f"{COMMANDS}:new_lab"))

    p_lesson = actions.add_parser("new-lesson", help="create a lint-clean lesson skeleton")
    p_lesson.add_argument("slug")
    p_lesson.add_argument("--root", type=Path, default=None)
    p_lesson.add_argument("--track", default="next", choices=("interview", "next", "craft"))
    p_lesson.set_defaults(handler=lazy(f"{COMMANDS}:new_lesson"))

    p_mutant = actions.add_parser("mutant", help="edit and save mutants as overlays")
    mutant_actions = p_mutant.add_subparsers(dest="mutant_action", metavar="ACTION")
    p_edit = mutant_actions.add_parser("edit", help="write a mutant's full files to DIR")
    p_edit.add_argument("slug")
    p_edit.add_argument("name")
    p_edit.add_argument("dir", type=Path)
    p_edit.add_argument("--from-solution", action="store_true",
                        help="start from the solution even when the mutant exists (its "
                             "overlay no longer applies: put the mistake in again)")
    p_edit.set_defaults(handler=lazy(f"{COMMANDS}:mutant_edit"))
    p_save = mutant_actions.add_parser("save", help="store DIR's changes as overlays")
    p_save.add_argument("slug")
    p_save.add_argument("name")
    p_save.add_argument("--from", dest="source", type=Path, required=True, metavar="DIR")
    p_save.add_argument("--check", help="the check that must reject it (new mutants)")
    p_save.add_argument("--mistake", help="the mistake, in a sentence (new mutants)")
    p_save.set_defaults(handler=lazy(f"{COMMANDS}:mutant_save"))
    p_mutant.set_defaults(handler=lambda args: (p_mutant.print_help(), 2)[1])

    p_golden = actions.add_parser("golden", help="record mutants' golden messages")
    p_golden.add_argument("slug")
    p_golden.add_argument("--mutant", action="append", default=[], metavar="NAME",
                          help="only this mutant (repeatable; default: all)")
    p_golden.add_argument("--runs", type=int, default=2,
                          help="runs per mutant; where they differ, expected.txt gets <…>")
    p_golden.add_argument("--merge", action="store_true",
                          help="merge with the existing expected.txt (a run on another "
                               "broker) instead of replacing it")
    p_golden.set_defaults(handler=lazy(f"{COMMANDS}:golden"))
    parser.set_defaults(handler=lambda args: (parser.print_help(), 2)[1])
