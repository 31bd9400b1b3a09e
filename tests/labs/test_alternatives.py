"""Meta-test over every lab's correct alternative designs: each passes every check.

A check may rely only on what its lab README fixes. The designs under
tests/labs/alternatives/<lab>/<name>/ differ from the reference solution in everything the
README leaves open (column names, isolation level, ORM or PL/pgSQL, how a breaker counts), so
a check that overfits the reference rejects one of them.

A design folder holds the files it writes differently (and its NOTE.md); the test lays them
over a copy of the reference solution, so the given files (harnesses, benches) are not copied
into every design.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from dojo.content.lab_checks import scan_checks
from dojo.content.labs import Lab
from dojo.runner.execute import RunOptions, run_checks
from tests.labs.meta import LabCase, alternative_params, broker_checks, describe


@pytest.mark.parametrize(("case", "design"), alternative_params())
def test_alternative_design_passes_every_check(case: LabCase, design: Path,
                                              tmp_path: Path) -> None:
    lab = case.loaded()
    chosen = broker_checks(lab)
    summary = run_checks(lab, full_design(lab, design, tmp_path / design.name),
                         RunOptions(checks=chosen, thorough=True))
    assert summary.results, f"no check ran against {design}"
    rejected = [r for r in summary.results if r.status in ("fail", "error", "infra")]
    assert not rejected, (
        f"{design.relative_to(design.parents[2])} is a correct design (see its NOTE.md), but "
        f"these checks of lab {lab.id!r} reject it: they rely on something the README does not "
        f"fix, or the README must say it:\n{describe(rejected)}")
    declared = {c.id for c in scan_checks(lab.checks_dir).checks if not chosen or c.id in chosen}
    missing = sorted(declared - {r.check_id for r in summary.results})
    assert not missing, f"these checks never reported a result: {', '.join(missing)}"
    waiting = [r for r in summary.results if r.status == "needs-backend"]
    may_wait = {c.id for c in scan_checks(lab.checks_dir).checks if c.needs_kafka}
    unmarked = [r for r in waiting if r.check_id not in may_wait]
    assert not unmarked, f"needs-backend for unmarked checks:\n{describe(unmarked)}"


def full_design(lab: Lab, design: Path, dest: Path) -> Path:
    """The learner files of `lab` in `dest`: `design`'s own, the reference solution's for the
    rest (helper modules a design adds come along)."""
    skip = shutil.ignore_patterns("__pycache__", "*.pyc", "NOTE.md")
    shutil.copytree(design, dest, ignore=skip)
    for name in lab.files:
        if not (dest / name).exists():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(lab.solution_dir / name, dest / name)
    return dest
