"""The lab screen over a lab without services: live stages, failures in full, hints, diff,
reset with confirmation, the solution behind a second ask, watch mode."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from textual.widgets import TabbedContent

from dojo.store import ProgressStore
from dojo.tui.app import DojoApp
from dojo.tui.screens import ConfirmScreen, LabScreen, ViewerScreen
from dojo.tui.widgets import CheckLog, DocumentView, StageList
from tests.tui.conftest import FakeServices, document_ready, home_ready, wait_for

pytestmark = pytest.mark.anyio


async def open_lab(pilot) -> LabScreen:  # type: ignore[no-untyped-def]
    await home_ready(pilot)
    await pilot.press("G", "enter")  # the last entry of Home's list: the wordcount lab
    await wait_for(pilot, lambda: isinstance(pilot.app.screen, LabScreen),
                   what="the lab to open")
    await document_ready(pilot, "#lab-doc")
    return pilot.app.screen  # type: ignore[no-any-return]


def log_text(lab: LabScreen) -> str:
    return "\n".join(str(line.render()) for line in lab.query_one(CheckLog).children)


def solve(content_root: Path) -> None:
    shutil.copy(content_root / "solutions" / "wordcount" / "wordcount.py",
                content_root / "workspace" / "wordcount" / "wordcount.py")


async def test_checks_stream_into_the_stage_list_and_the_store(
        make_app: Callable[..., DojoApp], content_root: Path) -> None:
    async with make_app().run_test(size=(80, 24)) as pilot:
        lab = await open_lab(pilot)
        workspace = content_root / "workspace" / "wordcount" / "wordcount.py"
        assert workspace.is_file(), "opening a lab starts its workspace"
        solve(content_root)
        seen_running = []
        stages = lab.query_one(StageList)
        await pilot.press("r")
        assert lab.query_one(TabbedContent).active == "lab-results"
        await wait_for(pilot, lambda: seen_running.append(stages.state("count").status)
                       or not lab.checking, timeout=30, what="the run to end")
        assert stages.state("count").status == "pass"
        assert stages.state("dedupe").status == "pass"
        text = log_text(lab)
        assert "✓ counts_each_word" in text and "✓ redelivery_counts_once" in text
        assert "All 2 stages pass" in text
        with ProgressStore() as store:
            assert store.passed_stages("wordcount") == {"count", "dedupe"}
            place = store.last_place()
            assert place is not None and (place.kind, place.target) == ("lab", "wordcount")


async def test_a_failing_stage_shows_its_message_in_full_and_a_hint(
        make_app: Callable[..., DojoApp]) -> None:
    async with make_app().run_test(size=(80, 24)) as pilot:
        lab = await open_lab(pilot)
        await pilot.press("r")
        await wait_for(pilot, lambda: not lab.checking, timeout=30, what="the run to end")
        stages = lab.query_one(StageList)
        assert stages.state("count").status in ("fail", "error")
        assert stages.state("dedupe").status == "", "the run stops at the first failing stage"
        text = log_text(lab)
        assert "wordcount.count_words() is not written yet." in text
        assert "NotImplementedError at wordcount.py line 8" in text
        assert text.count("hint Split on whitespace") == 1, "one hint per stage, not per check"
        assert "Stage count does not pass yet" in text
        with ProgressStore() as store:
            assert store.stage_results("wordcount")[("wordcount", "count")].status != "pass"
        await pilot.press("h")
        assert lab.query_one(TabbedContent).active == "lab-instructions"
        await document_ready(pilot, "#lab-doc")
        doc = lab.query_one("#lab-doc", DocumentView).document
        assert doc is not None
        assert any("Hint 1 of 2" in line.text for line in doc.lines)
        await pilot.press("h")
        await document_ready(pilot, "#lab-doc")
        doc = lab.query_one("#lab-doc", DocumentView).document
        assert doc is not None and any("Hint 2 of 2" in line.text for line in doc.lines)


async def test_reset_asks_first_and_diff_shows_the_changes(
        make_app: Callable[..., DojoApp], content_root: Path) -> None:
    async with make_app().run_test(size=(80, 24)) as pilot:
        lab = await open_lab(pilot)
        path = content_root / "workspace" / "wordcount" / "wordcount.py"
        path.write_text(path.read_text() + "\nNOTE = 'mine'\n")
        await pilot.press("d")
        assert lab.query_one(TabbedContent).active == "lab-diff"
        await document_ready(pilot, "#lab-diff-doc")
        diff = lab.query_one("#lab-diff-doc", DocumentView).document
        assert diff is not None and any("+NOTE = 'mine'" in line.text for line in diff.lines)
        await pilot.press("x")
        await wait_for(pilot, lambda: isinstance(pilot.app.screen, ConfirmScreen))
        await pilot.press("n")
        await wait_for(pilot, lambda: pilot.app.screen is lab)
        assert "NOTE = 'mine'" in path.read_text(), "No keeps the work"
        await pilot.press("x")
        await wait_for(pilot, lambda: isinstance(pilot.app.screen, ConfirmScreen))
        await pilot.press("y")
        await wait_for(pilot, lambda: pilot.app.screen is lab)
        assert "NOTE" not in path.read_text(), "Yes puts the starter back"


async def test_the_solution_opens_only_when_asked_twice(make_app: Callable[..., DojoApp]
                                                        ) -> None:
    async with make_app().run_test(size=(80, 24)) as pilot:
        lab = await open_lab(pilot)
        await pilot.press("S")
        await pilot.pause()
        assert pilot.app.screen is lab, "the first ask only warns"
        await pilot.press("S")
        await wait_for(pilot, lambda: isinstance(pilot.app.screen, ViewerScreen))
        await document_ready(pilot)
        doc = pilot.app.screen.query_one(DocumentView).document
        assert doc is not None and any("Counter(word.lower()" in line.text
                                       for line in doc.lines)


async def test_edit_without_an_editor_says_how(make_app: Callable[..., DojoApp],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EDITOR", raising=False)
    monkeypatch.delenv("VISUAL", raising=False)
    async with make_app().run_test(size=(80, 24)) as pilot:
        await open_lab(pilot)
        await pilot.press("e")
        await pilot.pause()
        messages = [notification.message for notification in pilot.app._notifications]
        assert any("workspace/wordcount/wordcount.py" in message and "EDITOR" in message
                   for message in messages), messages


async def test_watch_mode_checks_again_on_save(make_app: Callable[..., DojoApp],
                                               content_root: Path) -> None:
    async with make_app().run_test(size=(80, 24)) as pilot:
        lab = await open_lab(pilot)
        await pilot.press("w")
        stages = lab.query_one(StageList)
        await wait_for(pilot, lambda: not lab.checking
                       and stages.state("count").status in ("fail", "error"), timeout=30,
                       what="the first run of watch mode")
        solve(content_root)
        await wait_for(pilot, lambda: stages.state("dedupe").status == "pass", timeout=30,
                       what="the save to trigger a passing run")
        await pilot.press("w")
        assert not lab.runner.watching


async def test_services_start_with_visible_progress(make_app: Callable[..., DojoApp],
                                                    services: FakeServices) -> None:
    services.state = "stopped"
    async with make_app().run_test(size=(80, 24)) as pilot:
        lab = await open_lab(pilot)
        panel_text = str(lab.query_one("#lab-services").render())
        assert "stopped" in panel_text and "press u" in panel_text
        await pilot.press("u")
        await wait_for(pilot, lambda: services.started == 1
                       and "up" in str(lab.query_one("#lab-services").render()),
                       what="the services to come up")


async def test_stages_show_their_instructions_and_enter_moves_into_them(
        make_app: Callable[..., DojoApp]) -> None:
    async with make_app().run_test(size=(80, 24)) as pilot:
        lab = await open_lab(pilot)
        stages = lab.query_one(StageList)
        assert stages.has_focus and stages.stage_id == "", "a lab never run opens on Overview"
        await pilot.press("down")
        await document_ready(pilot, "#lab-doc")
        doc = lab.query_one("#lab-doc", DocumentView)
        assert doc.document is not None
        text = "\n".join(line.text for line in doc.document.lines)
        assert "1. Count words (count)" in text and "What the checks prove" in text
        assert "count_words(text: str)" in text, "the stage's README section"
        await pilot.press("enter")
        assert doc.has_focus


def solve_count_only(content_root: Path) -> None:
    """count passes, dedupe is the stage being worked on."""
    solution = (content_root / "solutions" / "wordcount" / "wordcount.py").read_text()
    head, _ = solution.split("def apply_events", 1)
    (content_root / "workspace" / "wordcount" / "wordcount.py").write_text(
        head + "def apply_events(events):\n    raise NotImplementedError('apply_events')\n")


def stage_headings(lab: LabScreen) -> list[str]:
    return [str(line.render()) for line in lab.query_one(CheckLog).children
            if line.has_class("check-stage")]


async def test_watch_checks_the_stage_being_worked_on_first_then_the_earlier_ones(
        make_app: Callable[..., DojoApp], content_root: Path) -> None:
    async with make_app().run_test(size=(80, 24)) as pilot:
        lab = await open_lab(pilot)
        solve_count_only(content_root)
        stages = lab.query_one(StageList)
        await pilot.press("r")
        await wait_for(pilot, lambda: not lab.checking
                       and stages.state("dedupe").status in ("fail", "error"), timeout=30,
                       what="a run where count passes and dedupe fails")
        assert stage_headings(lab)[:2] == ["1. Count words (count)",
                                           "2. Count each event once (dedupe)"], \
            "r checks from the first stage"
        await pilot.press("w")
        await wait_for(pilot, lambda: "watch: stage 2 dedupe first, then 1" in log_text(lab)
                       and not lab.checking and stages.state("count").status == "pass",
                       timeout=30, what="the watch run")
        assert stage_headings(lab) == ["2. Count each event once (dedupe)",
                                       "1. Count words (count)"], \
            "the stage being worked on answers first, then the earlier one is re-checked"
        await pilot.press("w")


async def test_checks_that_fail_the_same_way_fold_into_one_line_under_the_first(
        make_app: Callable[..., DojoApp]) -> None:
    async with make_app().run_test(size=(80, 24)) as pilot:
        lab = await open_lab(pilot)
        await pilot.press("r")
        await wait_for(pilot, lambda: not lab.checking, timeout=30, what="the run to end")
        text = log_text(lab)
        assert "✗ counts_each_word" in text, "the first failure has its own line and message"
        assert ("1 more check fails the same way: wordcount.count_words() is not written yet."
                in text)
        assert "✗ ignores_case" not in text and "ignores_case" in text, \
            "the second is named on the folded line, not repeated in full"
        assert text.count("hint Split on whitespace") == 1
        log = lab.query_one(CheckLog)
        children = list(log.children)
        fold = next(n for n, line in enumerate(children) if line.has_class("check-fold"))
        assert children[fold - 2].has_class("check-message"), children[fold - 2]
        assert "hint Split on whitespace" in str(children[fold - 1].render()), \
            "the folded line comes right after the message and its hint"


async def test_a_slow_check_left_out_keeps_the_lab_from_done_until_t_runs_it(
        make_app: Callable[..., DojoApp], content_root: Path) -> None:
    (content_root / "labs" / "wordcount" / "checks" / "test_09_slow.py").write_text(
        "import pytest\n\n@pytest.mark.stage('dedupe')\n@pytest.mark.thorough\n"
        "def test_slow_scene():\n    assert True\n", encoding="utf-8")
    async with make_app().run_test(size=(120, 40)) as pilot:
        lab = await open_lab(pilot)
        solve(content_root)
        await pilot.press("r")
        await wait_for(pilot, lambda: not lab.checking, timeout=30, what="the run to end")
        text = log_text(lab)
        assert "slow_scene" not in text.split("All 2 stages pass")[0], text
        assert "1 slow check(s) not run yet (dedupe/slow_scene): T runs" in text, text
        assert "the lab is done" not in text
        await pilot.press("T")
        await wait_for(pilot, lambda: not lab.checking, timeout=30, what="the slow run to end")
        text = log_text(lab)
        assert "✓ slow_scene" in text and "the lab is done" in text, text
