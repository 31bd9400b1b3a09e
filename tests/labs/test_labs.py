"""Meta-tests over every lab: the solution passes, the starter fails, every mutant is caught.

Like Exercism's CI copying the example solution over the stub: each lab is checked through the
same runner the learner uses (`dojo.runner.execute`), in a child process, on whatever broker
is configured. CI runs this module twice: on Tansu, then `-m kafka` on Apache Kafka.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from dojo.content.lab_checks import scan_checks
from dojo.content.labs import load_mutant
from dojo.content.overlay import OverlayError
from dojo.runner import golden
from dojo.runner.execute import RunOptions, run_checks
from dojo.runner.mutants import run_mutant
from tests.labs.meta import (
    NOT_VERIFIED,
    LabCase,
    broker_checks,
    describe,
    lab_params,
    mentions_missing,
    mutant_params,
)


@pytest.mark.parametrize("case", lab_params())
def test_solution_passes_every_check(case: LabCase,
                                     record_property: Callable[[str, object], None]) -> None:
    lab = case.loaded()
    chosen = broker_checks(lab)
    summary = run_checks(lab, lab.solution_dir, RunOptions(checks=chosen, thorough=True))
    declared = [c for c in scan_checks(lab.checks_dir).checks if not chosen or c.id in chosen]
    assert summary.results, f"no check ran against solutions/{lab.id}/"
    broken = [r for r in summary.results if r.status in ("fail", "error")]
    assert not broken, (f"the reference solution solutions/{lab.id}/ must pass every check; "
                        f"these did not:\n{describe(broken)}")
    may_wait = {c.id for c in declared if c.needs_kafka}
    waiting = [r for r in summary.results if r.status == "needs-backend"]
    unmarked = [r for r in waiting if r.check_id not in may_wait]
    assert not unmarked, ("needs-backend is allowed only for checks marked "
                          f"@pytest.mark.needs_kafka(...):\n{describe(unmarked)}")
    ran = {r.check_id for r in summary.results}
    missing = sorted({c.id for c in declared} - ran)
    assert not missing, f"these checks never reported a result: {', '.join(missing)}"
    for result in waiting:
        line = f"{lab.id}/{result.stage}/{result.check}: {result.message}"
        NOT_VERIFIED.append(line)
        record_property("needs_backend", line)


@pytest.mark.parametrize("case", lab_params())
def test_untouched_starter_fails_its_first_stage(case: LabCase) -> None:
    lab = case.loaded()
    first = lab.stage_ids[0]
    summary = run_checks(lab, lab.starter_dir, RunOptions(stages=(first,)))
    assert summary.results, f"no check of stage {first!r} ran against labs/{lab.id}/starter/"
    rejected = [r for r in summary.results if r.status in ("fail", "error")]
    assert rejected, ("the untouched starter must fail stage 1, or the learner has nothing to "
                      f"do; every check of {first!r} let it through:\n"
                      f"{describe(summary.results)}")


@pytest.mark.parametrize(("case", "mutant_dir"), mutant_params())
def test_mutant_is_rejected_by_its_check(case: LabCase, mutant_dir: Path) -> None:
    lab = case.loaded()
    mutant = load_mutant(mutant_dir)
    try:
        summary = run_mutant(lab, mutant)
    except OverlayError as exc:
        pytest.fail(f"the mutant {mutant.name!r} no longer applies to solutions/{lab.id}/: "
                    f"{exc}")
    results = [r for r in summary.results if r.check_id == mutant.check]
    assert results, (f"mutants/{mutant.name}/mutant.yaml names check {mutant.check!r}, but no "
                     f"such check ran; results:\n{describe(summary.results)}")
    if all(r.status == "needs-backend" for r in results):
        pytest.skip(f"needs-backend: {results[0].message}")
    assert all(r.stage == mutant.stage for r in results), (
        f"check {mutant.check!r} belongs to stage {results[0].stage!r}, but the mutant names "
        f"stage {mutant.stage!r}")
    rejected = golden.rejecting(results, mutant.check)
    assert rejected, (f"the mutant {mutant.name!r} ({mutant.mistake}) got past check "
                      f"{mutant.check!r}: the check does not catch that mistake")
    best = min(rejected, key=lambda r: len(mentions_missing(mutant, r.message)))
    missing = mentions_missing(mutant, best.message)
    assert not missing, (
        f"check {mutant.check!r} rejects the mutant {mutant.name!r}, but its message does not "
        f"mention {missing} (mutant.yaml `mentions`), so it would not teach the mistake "
        f"({mutant.mistake}). The message was:\n{best.message}")
    label = f"labs/{lab.id}/mutants/{mutant.name}/expected.txt"
    assert mutant.expected.is_file(), (
        f"{label} is missing: record the golden message with `dojo dev golden {lab.id} "
        f"--mutant {mutant.name}`")
    expected = mutant.expected.read_text(encoding="utf-8")
    actual = golden.golden_text(rejected)
    assert golden.matches(expected, actual), (
        f"check {mutant.check!r} rejects the mutant {mutant.name!r} with another message than "
        f"its golden one. If the new message is right, re-record it (`dojo dev golden "
        f"{lab.id} --mutant {mutant.name}`) and review the diff; if not, the check now "
        f"explains a different mistake:\n{golden.drift(expected, actual, label)}")
