"""Run a mutant: overlay it on the solution in a scratch directory, run its check there.

Used by `dojo lab check SLUG --mutant NAME`, the meta-tests and `dojo dev golden`.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from dojo.content.labs import Lab, Mutant
from dojo.runner import golden
from dojo.runner.execute import RunOptions, run_checks
from dojo.runner.results import CheckResult, RunEvent, RunSummary


@contextmanager
def materialised(lab: Lab, mutant: Mutant) -> Iterator[Path]:
    """A scratch directory holding the full mutant (solution + overlays), removed afterwards.
    Its last part is the mutant's name, so messages that name the directory stay stable."""
    with tempfile.TemporaryDirectory(prefix="dojo-mutant-") as scratch:
        yield mutant.materialise(lab, Path(scratch) / mutant.name)


def run_mutant(lab: Lab, mutant: Mutant, options: RunOptions | None = None,
               on_event: Callable[[RunEvent], None] | None = None) -> RunSummary:
    """Run `mutant`'s own check (or `options`) against it and return the summary."""
    with materialised(lab, mutant) as impl:
        return run_checks(lab, impl, options or RunOptions(checks=(mutant.check,)), on_event)


@dataclass(frozen=True)
class GoldenRun:
    """What recording one mutant's golden produced: the text, or why there is none."""

    mutant: Mutant
    text: str = ""
    problem: str = ""
    changed: bool = False


def record_golden(lab: Lab, mutant: Mutant, *, runs: int = 2, merge_existing: bool = False,
                  write: bool = True) -> GoldenRun:
    """Run the mutant's check `runs` times and store the merged, normalised message in
    expected.txt. With `merge_existing`, the file's current text is merged in too (a run on
    another broker). A run where the check does not reject the mutant records nothing."""
    texts: list[str] = []
    for _ in range(max(1, runs)):
        summary = run_mutant(lab, mutant)
        results: list[CheckResult] = [r for r in summary.results if r.check_id == mutant.check]
        if results and all(r.status == "needs-backend" for r in results):
            return GoldenRun(mutant, problem=f"needs-backend on this broker: "
                                             f"{results[0].message}")
        rejected = golden.rejecting(summary.results, mutant.check)
        if not rejected:
            statuses = ", ".join(f"{r.check}: {r.status}" for r in summary.results) or "none"
            return GoldenRun(mutant, problem=f"check {mutant.check!r} did not reject the "
                                             f"mutant (results: {statuses})")
        texts.append(golden.golden_text(rejected))
    text = texts[0]
    for other in texts[1:]:
        text = golden.merge(text, other)
    old = mutant.expected.read_text(encoding="utf-8") if mutant.expected.is_file() else ""
    if merge_existing and old:
        text = golden.merge(old, text)
    if write and text != old:
        mutant.expected.write_text(text, encoding="utf-8")
    return GoldenRun(mutant, text=text, changed=text != old)
