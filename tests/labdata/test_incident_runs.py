"""The incident lab breaks the shop a different way in each run (DOJO_INCIDENT_RUN). One run of
the lab's meta-tests sees one run number; this module (here, not in tests/labs, which the
meta-tests of other content roots run too) checks the reference solution's
slow-query stage under three fixed run numbers, so CI sees each of its breakages (the index
a migration loses: orders.user_id or payments.order_id) at least once in every run and the
stage at least three times, whatever the random run of the other meta-tests drew.
"""

from __future__ import annotations

import pytest

from dojo.content.labs import content_root, load_lab
from dojo.runner.execute import RunOptions, run_checks
from tests.labs.meta import describe

# run % 2 picks the lost index: 0 -> orders.user_id, 1 -> payments.order_id
RUNS = (4, 7, 10)


@pytest.mark.postgres
@pytest.mark.parametrize("run", RUNS)
def test_incident_slow_stage_of_each_run(run: int, monkeypatch: pytest.MonkeyPatch) -> None:
    lab = load_lab(content_root() / "labs" / "incident", content_root())
    monkeypatch.setenv("DOJO_INCIDENT_RUN", str(run))
    summary = run_checks(lab, lab.solution_dir, RunOptions(stages=("slow",)))
    assert summary.results, f"no check of stage 'slow' ran in run {run}"
    broken = [r for r in summary.results if r.status != "pass"]
    assert not broken, (f"in run {run} (DOJO_INCIDENT_RUN={run}) the reference solution "
                        f"must pass every slow-query check; these did not:\n{describe(broken)}")
