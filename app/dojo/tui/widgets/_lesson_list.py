"""`LessonList`: the tracks, their lessons with progress, and the labs, in one list."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from textual.binding import Binding, BindingType
from textual.content import Content
from textual.events import Resize
from textual.message import Message
from textual.widgets import OptionList
from textual.widgets.option_list import Option

from dojo.tui.overview import TRACK_TITLES
from dojo.tui.widgets._meter import fit, percent, stage_marks

if TYPE_CHECKING:
    from dojo.tui.overview import LabRow, LessonRow, Overview

READ_MARKS = {"read": ("●", "$text-success"), "reading": ("◐", "$text-accent"),
              "unread": ("·", "$text-muted")}
LEGEND = "● read ◐ reading · mastery · lab stages"
MIN_TITLE = 30  # below this the lab column names its labs by count


class LessonList(OptionList):
    """Enter on a lesson posts `LessonList.LessonChosen`, on a lab `LessonList.LabChosen`."""

    DEFAULT_CSS = """
    LessonList {
        height: 1fr;
        border: round $foreground 30%;
        border-title-color: $text-primary;
        border-subtitle-color: $text-muted;
        padding: 0;
        scrollbar-size-vertical: 1;
        &:focus { border: round $primary; }
        & > .option-list--option-disabled { color: $text-primary; text-style: bold; }
    }
    """

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("enter", "select", "Open the lesson or lab", show=False),
        Binding("j", "cursor_down", "Down", show=False),
        Binding("k", "cursor_up", "Up", show=False),
        Binding("g", "first", "First", show=False),
        Binding("G", "last", "Last", show=False),
    ]

    @dataclass
    class LessonChosen(Message):
        lesson_id: str

    @dataclass
    class LabChosen(Message):
        lab_id: str

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.border_title = "Lessons"
        self.border_subtitle = LEGEND
        self._overview: Overview | None = None
        self._width = 0

    def show(self, overview: Overview) -> None:
        """Fill (or refill) the list, keeping the highlighted entry."""
        self._overview = overview
        self._rebuild()

    def on_resize(self, event: Resize) -> None:
        if self._overview is not None and self.scrollable_content_region.width != self._width:
            self._rebuild()

    def _rebuild(self) -> None:
        overview = self._overview
        if overview is None:
            return
        keep = self.highlighted_option.id if self.highlighted_option else None
        self._width = width = max(self.scrollable_content_region.width, 40)
        # whole lab names when the titles keep room enough, `2 labs 0/4` when they would not
        short = False
        lab_width = max((len(row.lab_label()) for row in overview.lessons), default=0)
        if width - 13 - lab_width < MIN_TITLE:
            short = True
            lab_width = max((len(row.lab_label(short)) for row in overview.lessons), default=0)
        options: list[Option] = []
        track = ""
        for row in overview.lessons:
            if row.lesson.track != track:
                track = row.lesson.track
                options.append(Option(TRACK_TITLES.get(track, track), disabled=True))
            options.append(Option(self._lesson_line(row, width, lab_width, short),
                                  id=f"lesson:{row.lesson.id}"))
        if overview.labs:
            options.append(Option("Labs", disabled=True))
            for lab in overview.labs:
                options.append(Option(self._lab_line(lab, width), id=f"lab:{lab.lab_id}"))
        self.set_options(options)
        ids = [option.id for option in options]
        first = next((n for n, option in enumerate(options) if not option.disabled), None)
        self.highlighted = ids.index(keep) if keep is not None and keep in ids else first

    @staticmethod
    def _lesson_line(row: LessonRow, width: int, lab_width: int, short: bool) -> Content:
        lab = row.lab_label(short)
        title_width = max(12, width - 13 - lab_width)
        mark, mark_style = READ_MARKS[row.read]
        mastery_style = "$text-success" if row.mastery >= 0.8 else \
            "$text-accent" if row.mastery > 0 else "$text-muted"
        return Content.assemble(
            (f" {row.lesson.dir.name[:2]} ", "$text-muted"),
            fit(row.lesson.title, title_width),
            " ", (mark, mark_style),
            (f"{percent(row.mastery)} ", mastery_style),
            (f" {lab:>{lab_width}}" if lab_width else "",
             "$text-success" if row.lab_total and row.lab_passed == row.lab_total
             else "$text-muted"),
        )

    @staticmethod
    def _lab_line(lab: LabRow, width: int) -> Content:
        if lab.error:
            return Content.assemble(f" {lab.lab_id:<9} ", ("cannot load: see dojo lint",
                                                          "$text-error"))
        if not lab.ready:
            return Content.assemble(f" {lab.lab_id:<9} ", ("coming", "$text-muted"))
        title_width = max(8, width - 11 - len(lab.stage_ids) - 7)
        return Content.assemble(
            f" {lab.lab_id:<9} ", fit(lab.title, title_width), " ",
            stage_marks(lab.stage_ids, lab.statuses),
            (f" {lab.passed}/{len(lab.stage_ids)}", "$text-muted"),
        )

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        kind, _, target = (event.option.id or "").partition(":")
        if kind == "lesson":
            self.post_message(self.LessonChosen(target))
        elif kind == "lab":
            self.post_message(self.LabChosen(target))

    @property
    def highlighted_target(self) -> tuple[str, str] | None:
        """(kind, id) of the highlighted entry."""
        option = self.highlighted_option
        if option is None or not option.id:
            return None
        kind, _, target = option.id.partition(":")
        return kind, target
