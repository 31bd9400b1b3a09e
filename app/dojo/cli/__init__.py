"""The `dojo` command line: a thin layer over the engine.

Each area registers its own subcommands from a module in this package, so the areas stay
apart: services, lab, quiz, lessons, export, lint. `dojo` with no arguments opens the TUI.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# Modules in this package that define `register(subparsers)`; each adds its own commands.
COMMAND_MODULES = (
    "services",
    "lab",
    "quiz",
    "lessons",
    "lint",
    "dev",
    "doctor",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dojo",
        description="Interview Dojo: study, lab and drill for a senior backend interview.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(f"dojo.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"dojo.cli.{name}":
                continue  # that area is not built yet
            raise
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from dojo.store.database import StoreError

    try:
        return _main(list(sys.argv[1:] if argv is None else argv))
    except StoreError as exc:  # a corrupt or too-new progress database: say so, no traceback
        print(f"error: {exc}", file=sys.stderr)
        return 1


def _main(args_list: list[str]) -> int:
    if not args_list:
        from dojo.tui import run_app  # imported lazily: the CLI never pays for Textual

        return run_app()
    parser = build_parser()
    args = parser.parse_args(args_list)
    if not getattr(args, "handler", None):
        parser.print_help()
        return 2
    try:
        code: int = args.handler(args)
    except BrokenPipeError:
        # `dojo lessons | head`: the reader left; say nothing more and exit like a shell would.
        import os

        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())
