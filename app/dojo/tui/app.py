"""`DojoApp`: global keys, the theme, and navigation. Screens do the rest.

Screens other than Home are imported when first opened, so start-up pays only for Home.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from textual.app import App
from textual.binding import Binding, BindingType

from dojo.tui.navigation import (
    ContinueLast,
    OpenLab,
    OpenLesson,
    OpenProgress,
    StartDrill,
    StartMock,
    StartServices,
)
from dojo.tui.session import Session
from dojo.tui.settings import UiSettings

if TYPE_CHECKING:
    from textual.command import Provider
    from textual.theme import Theme

LIGHT, DARK = "textual-light", "textual-dark"
FIRST_FRAME_ENV = "DOJO_TUI_FIRST_FRAME"  # bench/startup.py: write the times, then exit
DRILL_SIZE = 5


def dojo_commands() -> type[Provider]:
    """The palette's provider, imported when the palette first opens (not at start-up)."""
    from dojo.tui.commands import DojoCommands

    return DojoCommands


class DojoApp(App[None]):
    """Interview Dojo in the terminal.

    Args:
        session: the engine objects (tests pass one with fixed clocks and fake services).
        settings_path: where the theme is remembered (default: the user's data dir).
        cursor_blink: off in snapshot tests.
    """

    CSS_PATH = "app.tcss"
    TITLE = "Interview Dojo"
    COMMANDS = App.COMMANDS | {dojo_commands}
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("question_mark", "help", "Keys", key_display="?"),
        Binding("ctrl+t", "toggle_theme", "Theme", show=False),
    ]

    def __init__(self, session: Session | None = None, *, settings_path: Path | None = None,
                 cursor_blink: bool = True) -> None:
        super().__init__()
        self.session = session or Session()
        self.settings_path = settings_path
        self.settings = UiSettings.load(settings_path)
        self.cursor_blink = cursor_blink
        self._first_frame_file = os.environ.get(FIRST_FRAME_ENV)

    def on_mount(self) -> None:
        if self.settings.theme in self.available_themes:
            self.theme = self.settings.theme
        self.theme_changed_signal.subscribe(self, self._remember_theme)
        from dojo.tui.screens import HomeScreen

        self.push_screen(HomeScreen(self.session))
        if self._first_frame_file:
            self.call_after_refresh(self._report_first_frame)

    def _report_first_frame(self) -> None:
        """bench/startup.py: the time of the first frame, then of Home with its lessons."""
        assert self._first_frame_file
        Path(self._first_frame_file).write_text(f"frame {time.time():.6f}\n", encoding="utf-8")

        def ready() -> None:
            if getattr(self.screen, "overview", None) is not None:
                with open(self._first_frame_file or "", "a", encoding="utf-8") as out:
                    out.write(f"ready {time.time():.6f}\n")
                self.exit()

        self.set_interval(0.01, ready)

    def _remember_theme(self, theme: Theme) -> None:
        self.settings.theme = theme.name
        self.settings.save(self.settings_path)
        for screen in self.screen_stack:
            for view in screen.query("DocumentView"):
                view.refresh_theme()  # type: ignore[attr-defined]

    def on_unmount(self) -> None:
        self.session.close()

    # --- global actions ----------------------------------------------------------------------

    def action_toggle_theme(self) -> None:
        self.theme = LIGHT if self.current_theme.dark else DARK

    def action_help(self) -> None:
        from dojo.tui.screens import HelpScreen

        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen(type(self.screen)))

    def action_drill(self) -> None:
        """A round of the cards due now, then new ones (Home's d, and the palette)."""
        if not self.session.loaded:
            return
        from dojo.tui.overview import when

        now = self.session.now()
        cards = self.session.scheduler.next_cards(self.session.catalog.cards, DRILL_SIZE, now)
        if not cards:
            next_at = self.session.scheduler.next_due_at(self.session.catalog.cards)
            later = f"; the next review is {when(next_at, now)}" if next_at else ""
            self.notify(f"Nothing is due{later}. To practise ahead, open a lesson and press d.",
                        timeout=6)
            return
        self.post_message(StartDrill(tuple(card.id for card in cards), "Drill: due and new"))

    # --- navigation: screens post these, the app pushes the screen ---------------------------

    def on_open_lesson(self, message: OpenLesson) -> None:
        from dojo.tui.screens import LessonScreen

        catalog = self.session.catalog
        if not catalog.has_lesson(message.lesson_id):
            self.notify(f"no lesson {message.lesson_id!r}", severity="error")
            return
        section, position = message.section, message.position
        if not section and position is None:
            record = self.session.store.lesson_progress().get(message.lesson_id)
            if record is not None:
                section, position = record.section, record.position
        self.push_screen(LessonScreen(self.session, catalog.lesson(message.lesson_id),
                                      section=section, position=position))

    def on_open_lab(self, message: OpenLab) -> None:
        from dojo.content.labs import LabError, find_lab
        from dojo.tui.screens import LabScreen

        try:
            lab = find_lab(message.lab_id, self.session.content_root)
        except (KeyError, LabError) as exc:
            self.notify(str(exc.args[0] if isinstance(exc, KeyError) else exc),
                        title="Cannot open the lab", severity="error", timeout=8)
            return
        self.push_screen(LabScreen(self.session, lab, stage=message.stage))

    def on_start_drill(self, message: StartDrill) -> None:
        from dojo.tui.screens import QuizScreen

        catalog = self.session.catalog
        cards = [catalog.card(card_id) for card_id in message.card_ids
                 if catalog.has_card(card_id)]
        if not cards:
            self.notify("No cards to drill.", severity="warning")
            return
        self.push_screen(QuizScreen(self.session, cards, title=message.title))

    def on_start_mock(self, message: StartMock) -> None:
        from dojo.quiz import build_mock_interview
        from dojo.tui.screens import MockScreen

        interview = build_mock_interview(self.session.catalog, message.questions,
                                         self.session.rng)
        if not interview.questions:
            self.notify("No lesson has a headline card yet.", severity="warning")
            return
        self.push_screen(MockScreen(self.session, interview))

    def on_open_progress(self, message: OpenProgress) -> None:
        from dojo.tui.screens import ProgressScreen

        self.push_screen(ProgressScreen(self.session))

    def on_start_services(self, message: StartServices) -> None:
        from dojo.tui.widgets import ServicesPanel

        panels = self.screen.query(ServicesPanel)
        if panels:
            panels.first().start()
        else:
            self.notify("Services start from Home or a lab (u), or by themselves when you run "
                        "checks.", timeout=5)

    def on_continue_last(self, message: ContinueLast) -> None:
        place = self.session.store.last_place()
        if place is None:
            self.notify("Nothing to continue yet.", timeout=3)
        elif place.kind == "lesson":
            self.post_message(OpenLesson(place.target))
        elif place.kind == "lab":
            self.post_message(OpenLab(place.target, place.detail))
        elif place.kind == "quiz" and self.session.catalog.has_card(place.target):
            # the card that was on screen first, then what the lesson has due or new
            card = self.session.catalog.card(place.target)
            lesson = self.session.catalog.lesson_of(card)
            rest = self.session.scheduler.next_cards(lesson.cards, len(lesson.cards),
                                                     self.session.now())
            reviews = self.session.store.reviews(card.id)
            graded = bool(reviews) and reviews[-1].reviewed_at >= place.at
            ids = dict.fromkeys([*([] if graded else [card.id]), *(other.id for other in rest)])
            if not ids:
                ids = dict.fromkeys(other.id for other in lesson.cards)
            self.post_message(StartDrill(tuple(ids), f"Drill: {lesson.title}"))
