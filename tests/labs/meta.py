"""What the meta-tests share: lab discovery at collection time and the assertions' wording.

Every `labs/<slug>/` becomes parametrised cases, marked `kafka` when its lab.yaml lists the
kafka service (CI reruns exactly those on Apache Kafka) and `postgres` when it lists postgres.
A lab.yaml that does not load still becomes a case, one that fails with the loader's message.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from dojo.content.labs import Lab, LabError, Mutant, content_root, lab_dirs, load_lab
from dojo.runner.results import CheckResult

# "lab/stage/check: why" for every needs-backend result; printed by conftest at the end
NOT_VERIFIED: list[str] = []


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


def mutant_params(root: Path | None = None) -> list[object]:
    params: list[object] = []
    for case in discover(root):
        if case.lab is None:
            continue
        folder = case.lab.mutants_dir
        if not folder.is_dir():
            continue
        for mutant_dir in sorted(p for p in folder.iterdir() if p.is_dir()
                                 and not p.name.startswith((".", "__"))):
            params.append(pytest.param(case, mutant_dir, id=f"{case.slug}/{mutant_dir.name}",
                                       marks=_marks(case.lab)))
    return params


ALTERNATIVES = Path(__file__).parent / "alternatives"


def alternative_params(root: Path | None = None,
                       alternatives: Path = ALTERNATIVES) -> list[object]:
    """(lab, design) for every correct alternative design, `alternatives/<lab>/<name>/`:
    complete implementations that differ from the reference where the README leaves room."""
    params: list[object] = []
    for case in discover(root):
        folder = alternatives / case.slug
        if not folder.is_dir():
            continue
        for design in sorted(p for p in folder.iterdir() if p.is_dir()
                             and not p.name.startswith((".", "__"))):
            params.append(pytest.param(case, design, id=f"{case.slug}/{design.name}",
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
