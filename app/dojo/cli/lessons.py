"""`dojo lessons` (the catalogue with your progress) and `dojo export anki`: the parser. What
they do is in `dojo.cli.lessons_commands`, imported when one of them runs."""

from __future__ import annotations

import argparse
from pathlib import Path

from dojo.cli import lazy

COMMANDS = "dojo.cli.lessons_commands"
DEFAULT_APKG = Path("interview-dojo.apkg")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("lessons", help="the lessons by track, with your progress")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.set_defaults(handler=lazy(f"{COMMANDS}:run_lessons"))
    export = sub.add_parser("export", help="export cards to other tools")
    formats = export.add_subparsers(dest="format", metavar="FORMAT")
    anki = formats.add_parser("anki", help="an Anki package (.apkg) with stable note ids")
    anki.add_argument("-o", "--output", type=Path, default=DEFAULT_APKG,
                      help=f"where to write it (default ./{DEFAULT_APKG})")
    anki.set_defaults(handler=lazy(f"{COMMANDS}:run_export_anki"))

    def _usage(_args: argparse.Namespace) -> int:
        export.print_help()
        return 2

    export.set_defaults(handler=_usage)
