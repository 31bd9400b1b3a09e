"""Correct designs that differ from the reference pass every check of their lab.

A check may rely only on what the lab's README fixes; each directory under
tests/labs/alternatives/<lab>/<name>/ is a full implementation written another way (other
types, other algorithms within the README's tolerances, other libraries), and it must pass
every check, as the reference does, on whatever broker is configured.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dojo.content.labs import content_root, load_lab
from dojo.runner.execute import run_checks
from tests.labs.meta import describe

ALTERNATIVES = Path(__file__).parent / "alternatives"


def _params() -> list[object]:
    params: list[object] = []
    for folder in sorted(ALTERNATIVES.glob("*/*")):
        if not folder.is_dir() or folder.name.startswith((".", "__")):
            continue
        slug = folder.parent.name
        marks = []
        lab_yaml = content_root() / "labs" / slug / "lab.yaml"
        if lab_yaml.is_file():
            services = load_lab(lab_yaml.parent, content_root()).services
            marks = [getattr(pytest.mark, s) for s in ("kafka", "postgres") if s in services]
        params.append(pytest.param(slug, folder, id=f"{slug}/{folder.name}", marks=marks))
    return params


@pytest.mark.parametrize(("slug", "folder"), _params())
def test_alternative_design_passes_every_check(slug: str, folder: Path) -> None:
    lab_dir = content_root() / "labs" / slug
    assert lab_dir.is_dir(), f"tests/labs/alternatives/{slug}/ names no lab in labs/"
    lab = load_lab(lab_dir, content_root())
    summary = run_checks(lab, folder)
    assert summary.results, f"no check ran against {folder}"
    broken = [r for r in summary.results if r.status in ("fail", "error", "infra")]
    assert not broken, (f"{folder.name} is a correct design for {slug} (it follows the "
                        "README), but these checks rejected it; a check relies on something "
                        f"the README does not fix:\n{describe(broken)}")
