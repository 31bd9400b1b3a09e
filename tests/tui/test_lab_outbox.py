"""The real outbox lab through the app: the reference solution in the workspace, r, and all
nine stages turn green against real PostgreSQL and Kafka (started on demand if needed)."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import pytest

from dojo.store import ProgressStore
from dojo.tui.app import DojoApp
from dojo.tui.screens import LabScreen
from dojo.tui.session import Session
from dojo.tui.widgets import LessonList, StageList
from tests.tui.conftest import NOW, REPO, FakeClock, home_ready, wait_for

pytestmark = [pytest.mark.anyio, pytest.mark.postgres, pytest.mark.kafka]

STAGES = ("schema", "atomic-write", "claim", "publish", "crash-safety", "backoff",
          "idempotent-consumer", "cleanup", "measure")


@pytest.fixture
def outbox_root(tmp_path: Path) -> Path:
    root = tmp_path / "content"
    shutil.copytree(REPO / "labs" / "outbox", root / "labs" / "outbox")
    shutil.copytree(REPO / "solutions" / "outbox", root / "solutions" / "outbox")
    for lesson in ("09-transactional-outbox", "10-idempotent-consumer"):
        shutil.copytree(REPO / "lessons" / lesson, root / "lessons" / lesson)
    return root


async def test_the_outbox_solution_turns_every_stage_green(outbox_root: Path, data_dir: Path
                                                           ) -> None:
    app = DojoApp(Session(root=outbox_root, clock=FakeClock(), now=lambda: NOW,
                          rng=random.Random(1)), cursor_blink=False)
    async with app.run_test(size=(100, 30)) as pilot:
        await home_ready(pilot)
        lessons = app.screen.query_one(LessonList)
        ids = [lessons.get_option_at_index(n).id for n in range(lessons.option_count)]
        lessons.highlighted = ids.index("lab:outbox")
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, LabScreen), what="the lab")
        lab = app.screen
        assert isinstance(lab, LabScreen)
        workspace = outbox_root / "workspace" / "outbox"
        for name in lab.lab.files:
            shutil.copy(outbox_root / "solutions" / "outbox" / name, workspace / name)
        await pilot.press("r")
        stages = lab.query_one(StageList)
        passing_while_running: list[int] = []

        def finished() -> bool:
            if lab.checking:
                passing_while_running.append(
                    sum(stages.state(stage).status == "pass" for stage in STAGES))
            return not lab.checking

        await wait_for(pilot, finished, timeout=240, what="the outbox checks to finish")
        statuses = {stage: stages.state(stage).status for stage in STAGES}
        assert statuses == dict.fromkeys(STAGES, "pass"), statuses
        assert any(0 < count < len(STAGES) for count in passing_while_running), \
            "stages turn green one by one while the run goes on, not all at the end"
        with ProgressStore() as store:
            assert store.passed_stages("outbox") == set(STAGES)
