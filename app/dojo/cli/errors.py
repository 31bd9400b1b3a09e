"""One error style for every command: `error: <what went wrong>` on stderr, and an exit code.

Commands raise `CommandFailed` (exit 1: something did not work) or `UsageProblem` (exit 2:
what was typed cannot work); `dojo.cli.main` prints them. Nothing here imports the engine.
"""

from __future__ import annotations

import sys


class CommandFailed(Exception):
    """The command could not do its job; printed as `error: …`, exit 1."""

    code = 1


class UsageProblem(CommandFailed):
    """Something the user typed cannot work (unknown lab, stage, lesson); exit 2."""

    code = 2


def print_error(message: str, *, hint: str = "") -> None:
    """`error: message` on stderr, with an optional second line saying what to do."""
    print(f"error: {message}", file=sys.stderr)
    if hint:
        print(f"  {hint}", file=sys.stderr)
