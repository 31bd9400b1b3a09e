"""`StageList`: a lab's stages with their status, updated live while checks run."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

from textual.binding import Binding, BindingType
from textual.content import Content
from textual.message import Message
from textual.widgets import OptionList
from textual.widgets.option_list import Option

from dojo.tui.widgets._meter import stage_mark

if TYPE_CHECKING:
    from dojo.content.labs import Lab

OVERVIEW = ""  # the id of the first entry: the README's general sections
SPINNER = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"


@dataclass
class StageState:
    status: str = ""  # "" never checked | running | pass | fail | error | needs-backend
    passed: int = 0
    done: int = 0
    stale: bool = False  # from an earlier run (the store), not this one


@dataclass
class _Row:
    stage_id: str
    title: str
    state: StageState = field(default_factory=StageState)


class StageList(OptionList):
    """Highlighting an entry posts `StageList.Highlighted` (the stage id, "" for the
    overview). `set_state()` redraws one stage; the screen feeds it runner events."""

    DEFAULT_CSS = """
    StageList {
        height: 1fr;
        border: round $foreground 30%;
        border-title-color: $text-primary;
        border-subtitle-color: $text-muted;
        padding: 0;
        scrollbar-size-vertical: 1;
        &:focus { border: round $primary; }
    }
    """

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("enter", "select", "Read the stage", show=False),
        Binding("j", "cursor_down", "Down", show=False),
        Binding("k", "cursor_up", "Up", show=False),
    ]

    @dataclass
    class Highlighted(Message):
        stage_list: StageList
        stage_id: str

        @property
        def control(self) -> StageList:
            return self.stage_list

    def __init__(self, lab: Lab, statuses: dict[str, str], *, id: str | None = None) -> None:
        self._rows = [_Row(OVERVIEW, "Overview")] + [
            _Row(stage.id, stage.title, StageState(statuses.get(stage.id, ""), stale=True))
            for stage in lab.stages]
        self._frame = 0
        super().__init__(*[Option(self._prompt(n, row), id=f"stage:{row.stage_id}")
                           for n, row in enumerate(self._rows)], id=id)
        self.border_title = "Stages"

    def on_mount(self) -> None:
        self._spinner = self.set_interval(0.1, self._spin, pause=True)

    def _prompt(self, number: int, row: _Row) -> Content:
        if row.stage_id == OVERVIEW:
            return Content.assemble(("  ≡ ", "$text-primary"), ("Overview", "bold"))
        state = row.state
        mark = Content.styled(SPINNER[self._frame], "$text-accent") \
            if state.status == "running" else stage_mark(state.status)
        count = f"{state.passed}/{state.done}" if state.done and not state.stale else ""
        return Content.assemble(" ", mark, (f" {number} ", "$text-muted"), row.stage_id,
                                (f" {count}", "$text-muted") if count else "")

    def select_stage(self, stage_id: str) -> None:
        for number, row in enumerate(self._rows):
            if row.stage_id == stage_id:
                self.highlighted = number
                return

    @property
    def stage_id(self) -> str:
        return self._rows[self.highlighted or 0].stage_id

    def state(self, stage_id: str) -> StageState:
        return next(row.state for row in self._rows if row.stage_id == stage_id)

    def set_state(self, stage_id: str, state: StageState) -> None:
        for number, row in enumerate(self._rows):
            if row.stage_id == stage_id:
                row.state = state
                self.replace_option_prompt_at_index(number, self._prompt(number, row))
        running = any(row.state.status == "running" for row in self._rows)
        if running:
            self._spinner.resume()
        else:
            self._spinner.pause()

    def _spin(self) -> None:
        self._frame = (self._frame + 1) % len(SPINNER)
        for number, row in enumerate(self._rows):
            if row.state.status == "running":
                self.replace_option_prompt_at_index(number, self._prompt(number, row))

    def on_option_list_option_highlighted(self, event: OptionList.OptionHighlighted) -> None:
        event.stop()
        self.post_message(self.Highlighted(self, self.stage_id))

    @dataclass
    class Chosen(Message):
        """Enter on an entry: the reader wants its instructions."""

        stage_list: StageList
        stage_id: str

        @property
        def control(self) -> StageList:
            return self.stage_list

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        self.post_message(self.Chosen(self, self.stage_id))
