"""Home: the lessons and labs with progress, what is due, the services, where you left off."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.content import Content
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Header, Static

from dojo.tui.navigation import (
    ContinueLast,
    OpenLab,
    OpenLesson,
    OpenProgress,
    StartDrill,
    StartMock,
)
from dojo.tui.overview import Overview, gather, when
from dojo.tui.widgets import KeyFooter, LessonList, PathBar, ServicesPanel

if TYPE_CHECKING:
    from dojo.tui.session import Session

MOCK_QUESTIONS = 3


class HomeScreen(Screen[None]):
    """The first screen. Everything on it loads in a worker after the first frame."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("n", "next_step", "Next", tooltip="the next step of the interview path"),
        Binding("c", "continue", "Continue", tooltip="where you left off"),
        Binding("d", "app.drill", "Drill", tooltip="the cards due now, then new ones"),
        Binding("m", "mock", "Mock", tooltip="a mock interview: questions with follow-ups"),
        Binding("p", "progress", "Progress", tooltip="mastery, lab stages, review history"),
        Binding("u", "services_up", "Services", tooltip="start PostgreSQL and Kafka"),
        Binding("q", "app.quit", "Quit"),
    ]

    @dataclass
    class _Loaded(Message):
        overview: Overview | None
        generation: int
        error: str = ""

    def __init__(self, session: Session) -> None:
        super().__init__()
        self.session = session
        self.overview: Overview | None = None
        self._generation = 0  # a gather older than the latest is dropped when it lands
        self._left = False  # another screen covered Home since it last gathered

    def compose(self) -> ComposeResult:
        yield Header()
        yield PathBar(id="home-path")
        with Horizontal(id="home-main"):
            yield LessonList(id="home-lessons")
            with Vertical(id="home-side"):
                yield Static("loading…", id="home-continue", classes="home-box")
                yield Static("", id="home-today", classes="home-box")
                yield ServicesPanel(self.session.services, id="home-services")
        yield KeyFooter()

    def on_mount(self) -> None:
        self.sub_title = "prepare for a senior backend interview"
        self.query_one("#home-continue").border_title = "Continue"
        self.query_one("#home-today").border_title = "Today"
        self.query_one(LessonList).focus()
        self.call_after_refresh(self.reload)

    def on_screen_suspend(self) -> None:
        self._left = True

    def on_screen_resume(self) -> None:
        """Back on Home from a lesson, a drill or a lab: show what changed there (also when
        the first load has not landed yet: it was gathered before the visit)."""
        if self._left:
            self._left = False
            self.reload()

    def reload(self) -> None:
        self._generation += 1
        self._gather(self._generation)

    @work(thread=True, group="home")
    def _gather(self, generation: int) -> None:
        try:
            self.post_message(self._Loaded(gather(self.session), generation))
        except Exception as exc:  # shown on screen: the app must open even on bad content
            self.post_message(self._Loaded(None, generation, f"{type(exc).__name__}: {exc}"))

    @on(_Loaded)
    def _loaded(self, message: _Loaded) -> None:
        if message.generation != self._generation:
            return  # a newer gather is on its way
        if message.overview is None:
            self.query_one("#home-continue", Static).update(
                Content.styled(f"could not load: {message.error}", "$text-error"))
            return
        first = self.overview is None
        self.overview = overview = message.overview
        self.query_one(LessonList).show(overview)
        if overview.path is not None:
            self.query_one(PathBar).show(overview.path)
        self._draw_continue(overview)
        self._draw_today(overview)
        if first and overview.problems:
            self.notify(f"{overview.problems} content problem(s) were skipped; "
                        "`dojo lint` names them", severity="warning", timeout=6)

    def _draw_continue(self, overview: Overview) -> None:
        box = self.query_one("#home-continue", Static)
        last = overview.last
        if last is None:
            box.update(Content.assemble(("Nothing yet. ", "$text-muted"),
                                        ("n", "bold $text-accent"), " follows the path above; ",
                                        "Enter opens the highlighted lesson."))
            return
        box.update(Content.assemble((last.label, "bold"), "\n", (last.where, "$text-muted"),
                                    "\n", ("c", "bold $text-accent"), " to go on"))

    def _draw_today(self, overview: Overview) -> None:
        box = self.query_one("#home-today", Static)
        later = overview.due_today - overview.due_now
        lines: list[str | tuple[str, str]] = [
            ("Due now     ", "$text-muted"),
            (f"{overview.due_now}", "bold $text-accent" if overview.due_now else "bold"),
            " card\n" if overview.due_now == 1 else " cards\n",
        ]
        if later:
            lines += [("Later today ", "$text-muted"), f"{later}\n"]
        lines += [("New         ", "$text-muted"), f"{overview.new_cards}\n"]
        if not overview.due_now and overview.next_due is not None:
            lines += [("Next review ", "$text-muted"),
                      f"{when(overview.next_due, self.session.now())}\n"]
        lines += [("d", "bold $text-accent"), " drill  ", ("m", "bold $text-accent"),
                  " mock interview"]
        box.update(Content.assemble(*lines))

    # --- actions ---------------------------------------------------------------------------

    def on_lesson_list_lesson_chosen(self, message: LessonList.LessonChosen) -> None:
        progress = self._lesson_place(message.lesson_id)
        self.post_message(OpenLesson(message.lesson_id, *progress))

    def _lesson_place(self, lesson_id: str) -> tuple[str, int | None]:
        if not self.session.loaded:
            return "", None
        record = self.session.store.lesson_progress().get(lesson_id)
        return (record.section, record.position) if record else ("", None)

    def on_lesson_list_lab_chosen(self, message: LessonList.LabChosen) -> None:
        row = next((lab for lab in (self.overview.labs if self.overview else ())
                    if lab.lab_id == message.lab_id), None)
        if row is not None and not row.ready:
            self.notify(row.error or f"The {row.lab_id} lab is coming: its lesson is ready "
                        "to read, and the lab will appear here when it is built.",
                        severity="warning" if not row.error else "error")
            return
        self.post_message(OpenLab(message.lab_id))

    def action_continue(self) -> None:
        if self.overview is None:
            return
        if self.overview.last is None:
            self.notify("Nothing to continue yet: open a lesson with Enter.", timeout=4)
            return
        self.post_message(ContinueLast())

    def action_next_step(self) -> None:
        """n: the next step of the guided path, wherever it is."""
        path = self.overview.path if self.overview else None
        if path is None:
            return
        step = path.next_step
        question = step.question
        if step.kind == "done" or question is None:
            self.action_mock()
        elif step.kind == "read":
            self.post_message(OpenLesson(question.lesson.id))
        elif step.kind == "drill":
            scheduler = self.session.scheduler
            cards = question.lesson.cards
            order = scheduler.new(cards) + scheduler.due(cards, self.session.now())
            self.post_message(StartDrill(tuple(dict.fromkeys(card.id for card in order or cards)),
                                         f"Drill: {question.lesson.title}"))
        else:
            self.post_message(OpenLab(step.lab, step.stage))

    def action_mock(self) -> None:
        if not self.session.loaded:
            return
        from dojo.tui.screens._confirm import ConfirmScreen

        def start(go: bool | None) -> None:
            if go:
                self.post_message(StartMock(MOCK_QUESTIONS))

        seconds = round(self.session.quiz_seconds)
        self.app.push_screen(ConfirmScreen(
            f"Mock interview: {MOCK_QUESTIONS} questions",
            f"Each question comes with a follow-up, {seconds} s per answer, no scores until "
            "the end — like the real thing. The report names your weakest lessons and labs.",
            confirm="Start", danger=False), start)

    def action_progress(self) -> None:
        if self.session.loaded:
            self.post_message(OpenProgress())

    def action_services_up(self) -> None:
        self.query_one(ServicesPanel).start()
