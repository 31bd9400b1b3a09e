"""Meta-test over every lab's correct alternative designs: each one passes every check.

A check may rely only on what its lab's README fixes. `tests/labs/alternatives/<lab>/<name>/`
holds complete implementations (each with a NOTE.md saying how it differs) that make other
choices wherever the README leaves one open: other table and column names, another way to
be idempotent, other client calls. A check that rejects one of them overfits the reference
solution, or relies on a contract the README has not stated yet.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dojo.content.lab_checks import scan_checks
from dojo.runner.execute import run_checks
from tests.labs.meta import NOT_VERIFIED, LabCase, alternative_params, describe


@pytest.mark.parametrize(("case", "design"), alternative_params())
def test_correct_alternative_passes_every_check(case: LabCase, design: Path) -> None:
    lab = case.loaded()
    summary = run_checks(lab, design)
    where = f"tests/labs/alternatives/{lab.id}/{design.name}/"
    assert summary.results, f"no check ran against {where}"
    rejected = [r for r in summary.results if r.status not in ("pass", "needs-backend")]
    assert not rejected, (
        f"{where} is a correct design (its NOTE.md says why), yet these checks reject it: "
        "they rely on something the lab README does not fix (fix the check), or the README "
        f"must state it (and the design be changed):\n{describe(rejected)}")
    declared = scan_checks(lab.checks_dir).checks
    missing = sorted({c.id for c in declared} - {r.check_id for r in summary.results})
    assert not missing, f"these checks never reported a result: {', '.join(missing)}"
    may_wait = {c.id for c in declared if c.needs_kafka}
    waiting = [r for r in summary.results if r.status == "needs-backend"]
    unmarked = [r for r in waiting if r.check_id not in may_wait]
    assert not unmarked, ("needs-backend is allowed only for checks marked "
                          f"@pytest.mark.needs_kafka(...):\n{describe(unmarked)}")
    for result in waiting:
        NOT_VERIFIED.append(f"{lab.id}/{result.stage}/{result.check} against {where}: "
                            f"{result.message}")
