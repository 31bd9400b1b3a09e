"""The lab-authoring kit: what a lab's checks are written with.

- fixtures (`dojo.checks.plugin`, loaded with `-p dojo.checks.plugin`): `services`,
  `database`, `kafka`, `learner`;
- the safety guard (`dojo.checks.guard`): dojo creates and drops only what is its own;
- fault tools (`dojo.checks.faults`): kill at a call, slow or failing SQL, races behind a
  barrier, a slow or absent broker, duplicate and reordered delivery;
- `CheckFailure`: the typed failure a check raises, carried as data to the CLI and the TUI.

`dojo.runner` only plans runs, starts the child process, enforces limits and reports results.
"""

from dojo.checks.failure import CheckFailure

__all__ = ["CheckFailure"]
