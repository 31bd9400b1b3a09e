"""A lab: instructions by stage, live check runs, watch mode, hints, editor, diff, reset.

Checks run in the runner's child process, driven from a thread worker that posts each event
as a message, so the screen keeps drawing (and can cancel) while they run. Each stage's
result is written to the store as soon as the stage finishes.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import time
from typing import TYPE_CHECKING, ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.content import Content
from textual.screen import Screen
from textual.widgets import Header, Static, TabbedContent, TabPane

from dojo.runner import workspace
from dojo.runner.results import (
    CheckResult,
    CheckStarted,
    RunSummary,
    ServicesReady,
    ServicesStarting,
    StageSummary,
)
from dojo.tui.navigation import OpenLesson
from dojo.tui.pages import (
    diff_page,
    files_page,
    lab_overview_page,
    lab_stage_page,
    link_titles,
    read_lab_readme,
)
from dojo.tui.widgets import (
    CheckLog,
    CheckRunner,
    DocumentView,
    KeyFooter,
    ServicesPanel,
    StageList,
)
from dojo.tui.widgets._stage_list import OVERVIEW, StageState

if TYPE_CHECKING:
    from dojo.content.labs import Lab
    from dojo.runner.execute import RunOptions
    from dojo.tui.session import Session

SOLUTION_CONFIRM_SECONDS = 10.0


class LabScreen(Screen[None]):
    """One lab, checked against the learner's workspace."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("q,escape", "back", "Back", tooltip="back to where the lab was opened"),
        Binding("r", "run", "Run", tooltip="check from stage 1 up to the first that fails"),
        Binding("s", "run_stage", "Stage", tooltip="check only the highlighted stage"),
        Binding("T", "run_thorough", "Run all, slow checks too", show=False,
                tooltip="every stage, with the slow checks a normal run leaves out"),
        Binding("w", "watch", "Watch", tooltip="re-check on every save, the stage you are "
                                                "on first"),
        Binding("h", "hint", "Hint", tooltip="the next hint for the stage"),
        Binding("e", "edit", "Edit", tooltip="open a file of the workspace in $EDITOR"),
        Binding("d", "diff", "Diff", tooltip="your changes against the starter"),
        Binding("x", "reset", "Reset", tooltip="put the starter files back (asks first)"),
        Binding("S", "solution", "Solution", show=False,
                tooltip="the reference solution (press twice)"),
        Binding("c", "cancel", "Stop the run", show=False),
        Binding("u", "services_up", "Start services", show=False),
        Binding("i", "tab('lab-instructions')", "Instructions", show=False),
        Binding("o", "tab('lab-results')", "Results", show=False),
        Binding("z", "zoom", "Wide pane, no stages", show=False),
        Binding("ctrl+d,pagedown", "page(1)", "Scroll pane down", show=False),
        Binding("ctrl+u,pageup", "page(-1)", "Scroll pane up", show=False),
        Binding("right", "sideways(1)", "Wide code right", show=False),
        Binding("left", "sideways(-1)", "Wide code left", show=False),
    ]

    def __init__(self, session: Session, lab: Lab, *, stage: str = "") -> None:
        super().__init__()
        self.session = session
        self.lab = lab
        self.readme = read_lab_readme(lab)
        self.impl = workspace.workspace_dir(lab)
        self._initial_stage = stage
        self._statuses = {stage_id: record.status for (_, stage_id), record
                          in session.store.stage_results(lab.id).items()}
        self._hints: dict[str, list[tuple[int, str]]] = {}
        self._live: dict[str, list[CheckResult]] = {}
        self._current_stage = ""
        self._rerun = False
        self._awaiting_done = False
        self._options: RunOptions | None = None  # the last run's, for what it left out
        self._solution_asked_at = 0.0

    # --- layout --------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal(id="lab-main"):
            with Vertical(id="lab-side"):
                yield StageList(self.lab, self._statuses, id="lab-stages")
                yield ServicesPanel(self.session.services, id="lab-services")
                yield Static("", id="lab-watch", classes="status-line")
            with TabbedContent(id="lab-tabs"):
                with TabPane("Instructions", id="lab-instructions"):
                    yield DocumentView(id="lab-doc")
                with TabPane("Results", id="lab-results"):
                    yield CheckLog(self.lab, id="lab-log")
                with TabPane("Diff", id="lab-diff"):
                    yield DocumentView(id="lab-diff-doc")
        yield CheckRunner(self.lab, self.impl, self.session.services, id="lab-runner")
        yield KeyFooter()

    @property
    def runner(self) -> CheckRunner:
        return self.query_one(CheckRunner)

    @property
    def checking(self) -> bool:
        """A run is going, or its end is not on screen yet: the runner is free as soon as it
        posts Done, but the stages settle only when this screen has handled it."""
        return self.runner.busy or self._awaiting_done

    def on_mount(self) -> None:
        self.title = f"Lab · {self.lab.id}"
        self.sub_title = self.lab.title
        outcome = workspace.start(self.lab)
        if outcome.created:
            self.notify(f"Your files and the lab's README are in {outcome.path}/ — edit them "
                        "there (e opens your editor).", title="Lab started", timeout=10)
        elif outcome.copied:
            self.notify(f"Restored missing starter files: {', '.join(outcome.copied)}",
                        timeout=6)
        stages = self.query_one(StageList)
        stage = self._initial_stage if self._initial_stage in self.lab.stage_ids else \
            self._first_unfinished() if self._statuses else OVERVIEW
        stages.select_stage(stage)
        self._show_stage(stage)
        stages.focus()
        self.query_one(CheckLog).note("No run yet. r checks up to the first stage that fails; "
                                      "s checks the highlighted stage; w re-checks on save.")
        self._draw_watch()
        self.session.store.set_last_place("lab", self.lab.id, stage)

    def _first_unfinished(self) -> str:
        for stage_id in self.lab.stage_ids:
            if self._statuses.get(stage_id) != "pass":
                return stage_id
        return self.lab.stage_ids[-1]

    def _show_stage(self, stage_id: str) -> None:
        doc = self.query_one("#lab-doc", DocumentView)
        title_of = link_titles(self.session.catalog)
        if stage_id == OVERVIEW:
            doc.blocks = tuple(lab_overview_page(self.lab, self.readme, f"{self.impl}/",
                                                 title_of))
        else:
            doc.blocks = tuple(lab_stage_page(self.lab, self.lab.stage(stage_id), self.readme,
                                              self._hints.get(stage_id, []), title_of))

    def on_document_view_link_followed(self, message: DocumentView.LinkFollowed) -> None:
        """A lesson section named in the instructions opens on top of the lab."""
        lesson_id, _, section = message.target.removeprefix("lesson:").partition("#")
        self.post_message(OpenLesson(lesson_id, section))

    def on_stage_list_highlighted(self, message: StageList.Highlighted) -> None:
        self._show_stage(message.stage_id)

    def on_stage_list_chosen(self, message: StageList.Chosen) -> None:
        """Enter on a stage: its instructions take the focus (j/k scroll them, Tab picks a
        link, Esc goes back to the stages)."""
        self.query_one(TabbedContent).active = "lab-instructions"
        self.query_one("#lab-doc", DocumentView).focus()

    def _draw_watch(self) -> None:
        status = self.query_one("#lab-watch", Static)
        if self.runner.watching:
            status.update(Content.assemble(("● watching", "bold $text-success"),
                                           (" · w stops", "$text-muted")))
        else:
            status.update(Content.assemble(("○ watch off", "$text-muted"),
                                           (" · w", "$text-muted")))

    def action_tab(self, tab: str) -> None:
        self.query_one(TabbedContent).active = tab

    def _active_pane(self) -> DocumentView | CheckLog:
        active = self.query_one(TabbedContent).active
        if active == "lab-results":
            return self.query_one(CheckLog)
        return self.query_one("#lab-diff-doc" if active == "lab-diff" else "#lab-doc",
                              DocumentView)

    def action_page(self, step: int) -> None:
        """Scroll whichever tab is showing, half a page, wherever the focus is."""
        pane = self._active_pane()
        half = max(1, pane.scrollable_content_region.height // 2)
        pane.scroll_to(y=pane.scroll_y + step * half, animate=False, force=True)

    def action_sideways(self, step: int) -> None:
        pane = self._active_pane()
        if isinstance(pane, DocumentView):
            pane.scroll_to(x=max(0, pane.scroll_x + 8 * step), animate=False, force=True)

    def action_zoom(self) -> None:
        side = self.query_one("#lab-side")
        side.display = not side.display
        if not side.display:
            self._active_pane().focus()
        else:
            self.query_one(StageList).focus()

    # --- running checks --------------------------------------------------------------------

    def action_run(self) -> None:
        from dojo.runner.execute import RunOptions

        self._start(RunOptions(stop_at_failing_stage=True),
                    "checking up to the first stage that does not pass")

    def action_run_thorough(self) -> None:
        from dojo.runner.execute import RunOptions

        self._start(RunOptions(thorough=True), "checking every stage, slow checks too")

    def _watch_run(self) -> None:
        """A re-check on save: the stage being worked on first (its result in seconds), then
        the stages before it (did the edit break one?), then the later ones."""
        from dojo.runner.execute import RunOptions

        stage = self._first_unfinished()
        number = self.lab.stage_ids.index(stage) + 1
        earlier = f", then 1–{number - 1}" if number > 2 else ", then 1" if number == 2 else ""
        self._start(RunOptions(stop_at_failing_stage=True, first_stage=stage),
                    f"watch: stage {number} {stage} first{earlier}")

    def action_run_stage(self) -> None:
        from dojo.runner.execute import RunOptions

        stage = self.query_one(StageList).stage_id or self._first_unfinished()
        self._start(RunOptions(stages=(stage,)), f"checking stage {stage}")

    def _start(self, options: RunOptions, label: str) -> None:
        if self.runner.busy:
            self.notify("Checks are running (c stops them).", timeout=3)
            return
        self._live, self._current_stage = {}, ""
        log = self.query_one(CheckLog)
        log.clear()
        started = self.session.now().astimezone()
        log.note(f"{started:%H:%M:%S} · workspace/{self.lab.id} · {label}")
        self.query_one(TabbedContent).active = "lab-results"
        self._options = options
        self._awaiting_done = self.runner.run(options)

    def on_check_runner_event(self, message: CheckRunner.Event) -> None:
        event = message.event
        log = self.query_one(CheckLog)
        if isinstance(event, ServicesStarting):
            log.services_starting(event)
            return
        if isinstance(event, ServicesReady):
            log.services_ready(event)
            self.query_one(ServicesPanel).check()
            return
        stages = self.query_one(StageList)
        if event.stage != self._current_stage:
            self._finish_stage(self._current_stage)
            self._current_stage = event.stage
        if isinstance(event, CheckStarted):
            log.started(event)
            if event.stage in self.lab.stage_ids:
                results = self._live.setdefault(event.stage, [])
                stages.set_state(event.stage, StageState("running", sum(r.passed for r in
                                                                        results), len(results)))
            return
        log.result(event)
        if event.stage in self.lab.stage_ids:
            results = self._live.setdefault(event.stage, [])
            results.append(event)
            stages.set_state(event.stage, StageState("running", sum(r.passed for r in results),
                                                     len(results)))

    def _finish_stage(self, stage_id: str) -> None:
        results = self._live.get(stage_id)
        if not results:
            return
        status = StageSummary(stage_id, tuple(results)).status
        self._statuses[stage_id] = status
        self.query_one(StageList).set_state(
            stage_id, StageState(status, sum(r.passed for r in results), len(results)))

    def on_check_runner_done(self, message: CheckRunner.Done) -> None:
        self._awaiting_done = False
        log = self.query_one(CheckLog)
        stages = self.query_one(StageList)
        if message.cancelled:
            for stage_id in self._live:
                if stages.state(stage_id).status == "running":
                    stages.set_state(stage_id, StageState(self._statuses.get(stage_id, ""),
                                                          stale=True))
            log.note("Stopped.")
        else:
            self._finish_stage(self._current_stage)
        if message.error:
            log.note(message.error, error=True)
            self.notify(message.error, severity="error", timeout=10)
        if message.summary is not None and not message.cancelled:
            self._summarise(message.summary)
        if self._rerun:
            self._rerun = False
            self._watch_run()

    def _summarise(self, summary: RunSummary) -> None:
        from dojo.runner.execute import RunOptions, left_out_thorough

        ran = [stage for stage in summary.stages() if stage.ran]
        passed = [stage for stage in ran if stage.passed]
        everything = sum(1 for s in self.lab.stage_ids if self._statuses.get(s) == "pass")
        log = self.query_one(CheckLog)
        left_out = left_out_thorough(self.lab, self._options or RunOptions(), summary)
        if ran and len(passed) == len(ran):
            if everything == len(self.lab.stage_ids) and left_out:
                text = Content.styled(
                    f"All {everything} stages pass; {len(left_out)} slow check(s) not run yet "
                    f"({', '.join(left_out)}): T runs every check, the slow ones too.",
                    "bold $text-success")
            elif everything == len(self.lab.stage_ids):
                text = Content.styled(f"All {everything} stages pass — the lab is done.",
                                      "bold $text-success")
                self.notify(f"{self.lab.id}: every stage passes", title="Lab done", timeout=6)
            else:
                text = Content.styled(f"{len(passed)} of {len(ran)} stage(s) checked pass · "
                                      f"{everything}/{len(self.lab.stage_ids)} in all",
                                      "$text-success")
        else:
            failing = next((stage for stage in ran if not stage.passed), None)
            where = failing.stage if failing else "?"
            text = Content.assemble(
                (f"Stage {where} does not pass yet.", "bold $text-error"),
                (" Read the message above, h for a hint, e to edit, r to check again.",
                 "$text-muted"))
            if failing is not None:
                self.query_one(StageList).select_stage(failing.stage)
        log.summary(text)

    def action_cancel(self) -> None:
        self.runner.cancel()

    # --- watch mode ----------------------------------------------------------------------

    def action_watch(self) -> None:
        watching = not self.runner.watching
        self.runner.set_watching(watching)
        if watching:
            self.notify(f"Watching workspace/{self.lab.id}: every save re-checks, the stage "
                        "you are on first.", timeout=4)
            self._watch_run()
        else:
            self.notify("Stopped watching.", timeout=2)
        self._draw_watch()

    def on_check_runner_saved(self, message: CheckRunner.Saved) -> None:
        if not self.runner.watching:
            return
        if self.runner.busy:  # start again with the new code, like rustlings
            self._rerun = True
            self.runner.cancel()
        else:
            self._watch_run()

    # --- the learner's files ---------------------------------------------------------------

    def action_hint(self) -> None:
        from dojo.runner import progress

        stage_id = self.query_one(StageList).stage_id or self._first_unfinished()
        number, text = progress.next_hint(self.lab, stage_id)
        if not text:
            self.notify(f"Stage {stage_id} has no hints.", timeout=3)
            return
        shown = self._hints.setdefault(stage_id, [])
        if (number, text) not in shown:
            shown.append((number, text))
        self.query_one(StageList).select_stage(stage_id)
        self._show_stage(stage_id)
        self.query_one(TabbedContent).active = "lab-instructions"
        self.query_one("#lab-doc", DocumentView).go_to(line=10_000)

    def action_edit(self) -> None:
        from dojo.tui.screens._pick import PickScreen

        if len(self.lab.files) == 1:
            self._edit(self.lab.files[0])
            return
        self.app.push_screen(PickScreen(f"Open which file of workspace/{self.lab.id}?",
                                            self.lab.files), self._edit)

    def _edit(self, name: str | None) -> None:
        if not name:
            return
        path = self.impl / name
        editor = os.environ.get("VISUAL") or os.environ.get("EDITOR")
        if not editor:
            self.notify(f"No editor is set. Open {path} in your editor, or set one and "
                        "restart dojo: export EDITOR=vim. With w on, every save re-checks.",
                        title="$EDITOR is not set", severity="warning", timeout=15)
            return
        from textual.app import SuspendNotSupported

        try:
            with self.app.suspend():
                subprocess.run([*shlex.split(editor), str(path)], check=False)
        except SuspendNotSupported:
            self.notify(f"Cannot hand the terminal to {editor} here; open {path} yourself.",
                        severity="warning", timeout=10)
            return
        except OSError as exc:
            self.notify(f"{editor}: {exc.strerror or exc}", severity="error", timeout=10)
            return
        if not self.runner.watching:
            self.notify("Back from the editor: r checks your code.", timeout=3)

    def action_diff(self) -> None:
        self.query_one("#lab-diff-doc", DocumentView).blocks = tuple(
            diff_page(self.lab.id, workspace.diff(self.lab)))
        self.query_one(TabbedContent).active = "lab-diff"

    def action_reset(self) -> None:
        from dojo.tui.screens._confirm import ConfirmScreen

        changed = workspace.changed_files(self.lab)
        if not changed:
            self.notify(f"workspace/{self.lab.id} already matches the starter.", timeout=3)
            return

        def reset(confirmed: bool | None) -> None:
            if confirmed:
                workspace.reset(self.lab)
                self.notify(f"Reset {', '.join(changed)} to the starter.", timeout=4)
                if self.query_one(TabbedContent).active == "lab-diff":
                    self.action_diff()

        self.app.push_screen(ConfirmScreen(
            f"Reset workspace/{self.lab.id}?",
            f"Your changes to {', '.join(changed)} will be lost. (d shows them first.)",
            confirm="Reset"), reset)

    def action_solution(self) -> None:
        now = time.monotonic()
        if now - self._solution_asked_at > SOLUTION_CONFIRM_SECONDS:
            self._solution_asked_at = now
            self.notify("Seeing the solution ends the puzzle for this lab. Stuck? h gives a "
                        "hint. Press S again to open it anyway.",
                        title="The reference solution", severity="warning", timeout=8)
            return
        self._solution_asked_at = 0.0
        if not self.lab.solution_dir.is_dir():
            self.notify("This lab has no reference solution yet.", severity="warning")
            return
        from dojo.tui.screens._viewer import ViewerScreen

        self.app.push_screen(ViewerScreen(
            f"Solution · {self.lab.id}",
            files_page(f"Reference solution · {self.lab.id}", self.lab.solution_dir,
                       self.lab.files)))

    def action_services_up(self) -> None:
        self.query_one(ServicesPanel).start()

    def action_back(self) -> None:
        """Esc or q: from a pane (instructions, results, diff) back to the stages; from the
        stages back to where the lab was opened."""
        stages = self.query_one(StageList)
        side = self.query_one("#lab-side")
        if not stages.has_focus:
            side.display = True
            stages.focus()
            return
        self.dismiss()

