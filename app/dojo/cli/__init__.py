"""The `dojo` command line: a thin layer over the engine.

Each area registers its own subcommands from a module in this package, so the areas stay
apart: services, lab, quiz, lessons, export, lint. `dojo` with no arguments opens the TUI (on
a terminal; piped, it prints this help).

Building the parser imports nothing but argparse and these small modules: a command's code,
and the engine under it, load only when that command runs (`lazy`), so `dojo --help` and
`dojo --version` answer at once. Every error is printed one way (`dojo.cli.errors`).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

from dojo import __version__
from dojo.cli.errors import CommandFailed, print_error

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

Handler = Callable[[argparse.Namespace], int]


def lazy(target: str) -> Handler:
    """A handler that imports `module:function` when the command runs, not when the parser
    is built."""
    module_name, _, function = target.partition(":")

    def run(args: argparse.Namespace) -> int:
        module = importlib.import_module(module_name)
        return int(getattr(module, function)(args))

    run.__qualname__ = target
    return run


class DojoArgumentParser(argparse.ArgumentParser):
    """argparse with dojo's error style: `error: …` and where to read the usage."""

    def error(self, message: str) -> NoReturn:
        print_error(message, hint=f"`{self.prog} --help` shows the usage")
        sys.exit(2)


def build_parser() -> argparse.ArgumentParser:
    parser = DojoArgumentParser(
        prog="dojo",
        description="Interview Dojo: study, lab and drill for a senior backend interview. "
                    "With no command it opens the app.",
    )
    parser.add_argument("--version", action="version", version=f"dojo {__version__}")
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
    try:
        return _main(list(sys.argv[1:] if argv is None else argv))
    except CommandFailed as exc:
        print_error(str(exc))
        return exc.code
    except Exception as exc:
        # the engine's own "cannot go on" errors, said in one line (anything else is a bug
        # and keeps its traceback)
        known = _engine_error(exc)
        if known is None:
            raise
        print_error(str(exc))
        return known


def _engine_error(exc: Exception) -> int | None:
    """The exit code for an engine error a user can act on, None for anything else."""
    for module, name, code in (("dojo.store.database", "StoreError", 1),
                               ("dojo.services.errors", "ServiceError", 1),
                               ("dojo.content.labs", "LabError", 2)):
        loaded = sys.modules.get(module)  # never imported just to compare
        if loaded is not None and isinstance(exc, getattr(loaded, name)):
            return code
    return None


def _interactive() -> bool:
    return sys.stdin.isatty() and sys.stdout.isatty()


def _main(args_list: list[str]) -> int:
    if not args_list:
        if not _interactive():  # `dojo | less`, cron, CI: the app needs a terminal
            build_parser().print_help()
            return 0
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
