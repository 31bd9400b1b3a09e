"""The incident lab breaks the shop a different way in each run (DOJO_INCIDENT_RUN). One run of
the lab's meta-tests sees one run number; this module (here, not in tests/labs, which the
meta-tests of other content roots run too) checks the reference solution's slow-query, pools,
consumer-lag and downstream stages under three fixed run numbers each, so CI sees each of
their breakages at least once in every run (the index a migration loses: orders.user_id or
payments.order_id; the path that leaks connections: each of the shop's three, the others
playing the warm pool and the busy path; the partition stuck behind a poison record: each of
the topic's three, the others slow but moving and caught up; the dependency that times out:
each of the three, the others playing the slow one and the fast one) and each stage at least
three times, whatever the random run of the other meta-tests drew. The report stage needs no
runs here: each of its checks meets all three of its incidents in every run.
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


# run % 3 picks the leaking path: 0 -> orders-api/place-order, 1 -> orders-api/list-orders,
# 2 -> payments/refund (and, in turn, which path is the warm pool and which the busy one)
POOL_RUNS = (3, 4, 5)


@pytest.mark.postgres
@pytest.mark.parametrize("run", POOL_RUNS)
def test_incident_pools_stage_of_each_run(run: int, monkeypatch: pytest.MonkeyPatch) -> None:
    lab = load_lab(content_root() / "labs" / "incident", content_root())
    monkeypatch.setenv("DOJO_INCIDENT_RUN", str(run))
    summary = run_checks(lab, lab.solution_dir, RunOptions(stages=("pools",)))
    assert summary.results, f"no check of stage 'pools' ran in run {run}"
    broken = [r for r in summary.results if r.status != "pass"]
    assert not broken, (f"in run {run} (DOJO_INCIDENT_RUN={run}) the reference solution "
                        f"must pass every pools check; these did not:\n{describe(broken)}")


# run % 3 picks the partition stuck behind the poison record (the next one is slow but moving,
# the third caught up); run % 4 where the poison record lies: runs 3, 4, 5 give partitions 0, 1,
# 2 with the record at offsets 6, 3, 4
LAG_RUNS = (3, 4, 5)


@pytest.mark.kafka
@pytest.mark.postgres
@pytest.mark.parametrize("run", LAG_RUNS)
def test_incident_lag_stage_of_each_run(run: int, monkeypatch: pytest.MonkeyPatch) -> None:
    lab = load_lab(content_root() / "labs" / "incident", content_root())
    monkeypatch.setenv("DOJO_INCIDENT_RUN", str(run))
    summary = run_checks(lab, lab.solution_dir, RunOptions(stages=("lag",)))
    assert summary.results, f"no check of stage 'lag' ran in run {run}"
    broken = [r for r in summary.results if r.status != "pass"]
    assert not broken, (f"in run {run} (DOJO_INCIDENT_RUN={run}) the reference solution "
                        f"must pass every consumer-lag check; these did not:\n{describe(broken)}")

# run % 3 picks the dependency that times out: 0 -> card-provider, 1 -> tax-rates,
# 2 -> shipping-quotes (and, in turn, which one is slow within its timeout and which is fast;
# the run also moves the recovered burst and the onset)
DOWNSTREAM_RUNS = (6, 7, 8)


@pytest.mark.postgres
@pytest.mark.parametrize("run", DOWNSTREAM_RUNS)
def test_incident_downstream_stage_of_each_run(run: int,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    lab = load_lab(content_root() / "labs" / "incident", content_root())
    monkeypatch.setenv("DOJO_INCIDENT_RUN", str(run))
    summary = run_checks(lab, lab.solution_dir, RunOptions(stages=("downstream",)))
    assert summary.results, f"no check of stage 'downstream' ran in run {run}"
    broken = [r for r in summary.results if r.status != "pass"]
    assert not broken, (f"in run {run} (DOJO_INCIDENT_RUN={run}) the reference solution "
                        f"must pass every downstream check; these did not:\n{describe(broken)}")

