"""The lab-authoring kit: what a lab's checks are written with.

- fixtures (`dojo.checks.plugin`, loaded with `-p dojo.checks.plugin`): `services`,
  `database`, `kafka`, `learner`;
- `CheckFailure`: the typed failure a check raises, carried as data to the CLI and the TUI;
  `dojo.checks.report` formats its evidence (`table`, `fmt`, `short`, `indent`);
- calling learner code (`dojo.checks.learner`): `call`, `raised`, `in_thread`; a stub's
  NotImplementedError becomes `NotWritten`;
- the database (`dojo.checks.database`): `apply_schema`, `require_tables`, `rows`, `scalar`,
  `columns`, `sqlstate`;
- observers (`dojo.checks.observers`): statements per worker, sessions, locks and open
  transactions, table snapshots, complete topic reads, committed offsets, client taps,
  headers;
- fault tools (`dojo.checks.faults`): kill at a call or an ack, slow or failing SQL (before
  or after a statement, or at COMMIT), races behind a barrier, a slow or absent broker,
  duplicate and reordered delivery; `dojo.checks.clock.InstantClock`, whose sleeps are
  instant;
- the safety guard (`dojo.checks.guard`): dojo creates and drops only what is its own.

`dojo.runner` only plans runs, starts the child process, enforces limits and reports results.
docs/lab-contract.md lists the whole API; docs/add-a-lab.md walks through a new lab.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dojo.checks.clock import InstantClock, machine_time_zone
    from dojo.checks.database import apply_schema, require_tables, rows, scalar, sqlstate
    from dojo.checks.failure import CheckFailure, FailureReport
    from dojo.checks.learner import NotWritten, Running, call, in_thread, raised
    from dojo.checks.report import first_line, fmt, indent, short, table

# Imported on first use: `dojo.checks.failure` (which the results protocol, the CLI and the
# TUI import) must not pull SQLAlchemy in with the database helpers.
_HOME = {
    "InstantClock": "clock", "machine_time_zone": "clock",
    "apply_schema": "database", "require_tables": "database", "rows": "database",
    "scalar": "database", "sqlstate": "database",
    "CheckFailure": "failure", "FailureReport": "failure",
    "NotWritten": "learner", "Running": "learner", "call": "learner", "in_thread": "learner",
    "raised": "learner",
    "first_line": "report", "fmt": "report", "indent": "report", "short": "report",
    "table": "report",
}


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module 'dojo.checks' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"dojo.checks.{home}"), name)
    globals()[name] = value
    return value

__all__ = [
    "CheckFailure",
    "FailureReport",
    "InstantClock",
    "NotWritten",
    "Running",
    "apply_schema",
    "call",
    "first_line",
    "fmt",
    "in_thread",
    "indent",
    "machine_time_zone",
    "raised",
    "require_tables",
    "rows",
    "scalar",
    "short",
    "sqlstate",
    "table",
]
