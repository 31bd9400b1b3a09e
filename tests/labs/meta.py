"""What the meta-tests share: lab discovery at collection time and the assertions' wording.

Every `labs/<slug>/` becomes parametrised cases, marked `kafka` when its lab.yaml lists the
kafka service (CI reruns exactly those on Apache Kafka) and `postgres` when it lists postgres;
a mutant whose check never requests Kafka (the kit's `kafka`/`services` fixtures, at any
depth) is not marked `kafka`. In that rerun (CI sets DOJO_META_KAFKA_ONLY=1) the solution and
the alternative designs run only their lab's checks that reach the broker, for the same reason.
A lab.yaml that does not load still becomes a case, one that fails with the loader's message.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from dojo.content.lab_checks import scan_checks
from dojo.content.labs import Lab, LabError, Mutant, content_root, lab_dirs, load_lab, load_mutant
from dojo.runner.results import CheckResult

# "lab/stage/check: why" for every needs-backend result; printed by conftest at the end
NOT_VERIFIED: list[str] = []

# set by .ci/run for its second run (-m kafka on Apache Kafka): see broker_checks()
KAFKA_ONLY = "DOJO_META_KAFKA_ONLY"


def broker_checks(lab: Lab) -> tuple[str, ...]:
    """The checks a whole-lab meta-test runs: () for every check; in CI's rerun on Apache Kafka
    (DOJO_META_KAFKA_ONLY=1) only those that request the kit's `kafka` or `services` fixture.
    A check that never reaches the broker gets the same PostgreSQL and the same code on both
    runs, so the first run's verdict stands; rerunning it cost minutes per design."""
    if os.environ.get(KAFKA_ONLY) != "1":
        return ()
    chosen = tuple(c.id for c in scan_checks(lab.checks_dir).checks if c.uses_kafka)
    if not chosen:
        pytest.skip(f"{KAFKA_ONLY}=1 and no check of lab {lab.id!r} reaches Kafka")
    return chosen


@dataclass(frozen=True)
class LabCase:
    slug: str
    lab: Lab | None
    error: str = ""

    def loaded(self) -> Lab:
        """The lab, or a test failure that quotes why it does not load."""
        if self.lab is None:
            pytest.fail(f"labs/{self.slug}/lab.yaml does not load: {self.error}")
        return self.lab


def _marks(lab: Lab | None) -> list[pytest.MarkDecorator]:
    services = lab.services if lab else ("postgres", "kafka")  # unknown: rerun everywhere
    marks = []
    if "kafka" in services:
        marks.append(pytest.mark.kafka)
    if "postgres" in services:
        marks.append(pytest.mark.postgres)
    return marks


def discover(root: Path | None = None) -> list[LabCase]:
    root = root or content_root()
    cases = []
    for folder in lab_dirs(root):
        try:
            cases.append(LabCase(folder.name, load_lab(folder, root)))
        except LabError as exc:
            cases.append(LabCase(folder.name, None, str(exc)))
    return cases


def lab_params(root: Path | None = None) -> list[object]:
    return [pytest.param(case, id=case.slug, marks=_marks(case.lab)) for case in discover(root)]


def _mutant_marks(lab: Lab, mutant_dir: Path, offline: set[str]) -> list[pytest.MarkDecorator]:
    """The lab's marks, without `kafka` when the check the mutant names never reaches the
    broker: its verdict cannot depend on which broker runs, so CI proves it once (on the
    default broker) instead of again on Apache Kafka. A mutant.yaml that does not load keeps
    every mark; its test says what is wrong with it."""
    marks = _marks(lab)
    try:
        check = load_mutant(mutant_dir).check
    except (LabError, OSError):  # the test itself reports the broken mutant.yaml
        return marks
    if check in offline:
        marks = [mark for mark in marks if mark.name != "kafka"]
    return marks


def mutant_params(root: Path | None = None) -> list[object]:
    params: list[object] = []
    for case in discover(root):
        if case.lab is None:
            continue
        folder = case.lab.mutants_dir
        if not folder.is_dir():
            continue
        offline = {c.id for c in scan_checks(case.lab.checks_dir).checks if not c.uses_kafka}
        for mutant_dir in sorted(p for p in folder.iterdir() if p.is_dir()
                                 and not p.name.startswith((".", "__"))):
            params.append(pytest.param(case, mutant_dir, id=f"{case.slug}/{mutant_dir.name}",
                                       marks=_mutant_marks(case.lab, mutant_dir, offline)))
    return params


ALTERNATIVES = Path("tests") / "labs" / "alternatives"  # under the content root


def alternative_params(root: Path | None = None, folder: Path | None = None) -> list[object]:
    """One case per correct alternative design, `tests/labs/alternatives/<lab>/<name>/` of the
    content root (the repository; a private content root has its own or none): an
    implementation written independently of the reference solution, that every check of its
    lab must accept (a check that rejects one relies on more than the README fixes). A folder
    that names no lab is a case that fails."""
    root = root or content_root()
    folder = folder or root / ALTERNATIVES
    labs = {case.slug: case for case in discover(root)}
    params: list[object] = []
    if not folder.is_dir():
        return params
    for lab_dir in sorted(p for p in folder.iterdir() if p.is_dir()):
        case = labs.get(lab_dir.name, LabCase(lab_dir.name, None, "no labs/" + lab_dir.name))
        for design in sorted(p for p in lab_dir.iterdir() if p.is_dir()
                             and not p.name.startswith((".", "__"))):
            params.append(pytest.param(case, design, id=f"{lab_dir.name}/{design.name}",
                                       marks=_marks(case.lab)))
    return params


def describe(results: list[CheckResult]) -> str:
    """Results as a teaching list: stage/check, status, and the first lines of the message."""
    lines = []
    for result in results:
        message = "\n      ".join(result.message.splitlines()[:8])
        lines.append(f"  {result.stage}/{result.check}: {result.status}\n      {message}")
    return "\n".join(lines)


def mentions_missing(mutant: Mutant, message: str) -> list[str]:
    lowered = message.lower()
    return [needle for needle in mutant.mentions if needle.lower() not in lowered]
