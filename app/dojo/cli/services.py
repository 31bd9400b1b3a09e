"""`dojo services up | down | status`."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

from dojo.cli.errors import print_error

if TYPE_CHECKING:
    from dojo.services.errors import ServiceError

# dojo.services.manager.KAFKA_BACKENDS, written out so that building the parser (`dojo
# --help`) does not import the service manager; a test keeps the two equal.
KAFKA_BACKENDS = ("tansu", "apache")
_STATE_COLOUR = {"up": "32", "external": "32", "dead": "31", "unreachable": "31", "stopped": "33"}


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("services", help="start, stop and inspect PostgreSQL and Kafka")
    actions = parser.add_subparsers(dest="action", metavar="ACTION")

    p_up = actions.add_parser("up", help="start what is not running (harmless when it is)")
    p_up.add_argument("--kafka", choices=KAFKA_BACKENDS, default=None,
                      help="embedded Kafka backend (default: tansu, or the one running)")
    p_up.set_defaults(handler=_up)

    p_down = actions.add_parser("down", help="stop what dojo started (never external services)")
    p_down.add_argument("--force", action="store_true",
                        help="also when the state file is corrupt: find dojo's processes")
    p_down.set_defaults(handler=_down)

    p_status = actions.add_parser("status", help="what runs, checked live")
    p_status.add_argument("--json", action="store_true", help="machine-readable output")
    p_status.set_defaults(handler=_status)
    parser.set_defaults(handler=lambda args: (parser.print_help(), 2)[1])


def _say(line: str) -> None:
    print(line, flush=True)


def _fail(exc: ServiceError) -> int:
    print_error(str(exc))
    return 1


def _up(args: argparse.Namespace) -> int:
    from dojo.services import manager
    from dojo.services.errors import ServiceError

    try:
        endpoints = manager.up(args.kafka, log=_say)
    except ServiceError as exc:
        return _fail(exc)
    from dojo.runner.ledger import sweep_dead_runs

    swept = sweep_dead_runs(log=_say)
    if swept:
        _say(f"dropped {len(swept)} database(s)/topic(s) left by killed runs: {', '.join(swept)}")
    _say(f"DOJO_DATABASE_URL={manager.redact(endpoints.database_url)}")
    _say(f"DOJO_KAFKA_BOOTSTRAP={endpoints.kafka_bootstrap}  ({endpoints.kafka_backend})")
    return 0


def _down(args: argparse.Namespace) -> int:
    from dojo.services import manager
    from dojo.services.errors import ServiceError

    try:
        manager.down(force=args.force, log=_say)
    except ServiceError as exc:
        return _fail(exc)
    return 0


def _status(args: argparse.Namespace) -> int:
    from dojo.services import manager
    from dojo.services.errors import ServiceError

    try:
        rows = manager.status()
    except ServiceError as exc:
        if args.json:
            print(json.dumps({"error": str(exc)}))
        return _fail(exc)
    if args.json:
        print(json.dumps([row.as_dict() for row in rows], indent=2))
    else:
        colour = sys.stdout.isatty()
        for row in rows:
            state = row.state
            if colour:
                state = f"\033[{_STATE_COLOUR.get(row.state, '0')}m{state:<11}\033[0m"
            else:
                state = f"{state:<11}"
            pid = f"pid {row.pid}" if row.pid else ""
            print(f"{row.name:<9} {row.backend:<9} {state} {row.url:<46} {pid}".rstrip())
            if row.detail and row.state not in ("up", "external"):
                print(f"          {row.detail}")
    return 0 if all(row.state in ("up", "external") for row in rows) else 3
