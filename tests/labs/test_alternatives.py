"""Correct designs that differ from the reference must pass every check.

`tests/labs/alternatives/<lab>/<name>/` holds a full implementation of `<lab>` written another
way (other helpers, other structure, another correct reading of the README). A check that
rejects one relies on something the lab README does not fix: the check is wrong, not the
design. Like the solution test, each runs through the learner's runner, on whatever broker is
configured (CI repeats the Kafka labs on Apache Kafka).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dojo.content.lab_checks import scan_checks
from dojo.runner.execute import run_checks
from tests.labs.meta import LabCase, _marks, describe, discover

ALTERNATIVES = Path(__file__).parent / "alternatives"


def alternative_params() -> list[object]:
    cases = {case.slug: case for case in discover()}
    params: list[object] = []
    for folder in sorted(p for p in ALTERNATIVES.glob("*/*") if p.is_dir()
                         and not p.name.startswith((".", "__"))):
        case = cases.get(folder.parent.name, LabCase(folder.parent.name, None,
                                                     "no such lab under labs/"))
        params.append(pytest.param(case, folder, id=f"{case.slug}/{folder.name}",
                                   marks=_marks(case.lab)))
    return params


@pytest.mark.parametrize(("case", "folder"), alternative_params())
def test_a_correct_alternative_design_passes_every_check(case: LabCase, folder: Path) -> None:
    lab = case.loaded()
    summary = run_checks(lab, folder)
    assert summary.results, f"no check ran against {folder}"
    rejected = [r for r in summary.results if r.status in ("fail", "error")]
    assert not rejected, (
        f"{folder.relative_to(ALTERNATIVES)} is a correct design of {lab.id} that differs from "
        "the reference; these checks rejected it, so they rely on something the README does "
        f"not fix:\n{describe(rejected)}")
    declared = {c.id for c in scan_checks(lab.checks_dir).checks}
    missing = sorted(declared - {r.check_id for r in summary.results})
    assert not missing, f"these checks never reported a result: {', '.join(missing)}"
