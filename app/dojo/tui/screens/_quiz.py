"""A drill: each card against the clock, scored, then self-graded into FSRS."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.content import Content
from textual.screen import Screen
from textual.widgets import ContentSwitcher, Footer, Header, Static

from dojo.tui.overview import when
from dojo.tui.widgets import AnswerPanel, GradeBar, ScoreCard

if TYPE_CHECKING:
    from dojo.content import Card
    from dojo.quiz import Score
    from dojo.tui.session import Session


class QuizScreen(Screen[None]):
    """Every answer and every grade is written to the store the moment it is given."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "leave", "Leave"),
        Binding("1", "grade(1)", "Again"),
        Binding("2", "grade(2)", "Hard"),
        Binding("3", "grade(3)", "Good"),
        Binding("4", "grade(4)", "Easy"),
        Binding("enter", "accept", "Accept", show=False),
        Binding("j,down", "scroll_score(1)", "Scroll down", show=False),
        Binding("k,up", "scroll_score(-1)", "Scroll up", show=False),
    ]

    def __init__(self, session: Session, cards: list[Card], *, title: str = "Drill") -> None:
        super().__init__()
        self.session = session
        self.cards = cards
        self.round_title = title
        self.index = 0
        self.phase = "answering"  # answering | scored | done
        self.scores: list[Score] = []
        self._score: Score | None = None
        self._seconds_used = 0.0
        self._suggested = 3
        self._leave_armed = False
        self._last_grade = ""  # "Good: again in 3 days", shown beside the next question

    def compose(self) -> ComposeResult:
        yield Header()
        with ContentSwitcher(initial="quiz-answering", id="quiz-phases"):
            yield AnswerPanel(id="quiz-answering",
                              cursor_blink=getattr(self.app, "cursor_blink", True))
            with Vertical(id="quiz-scored"):
                yield Static("", id="quiz-scored-question", classes="quiz-head")
                yield ScoreCard(id="quiz-score")
                yield GradeBar(id="quiz-grades")
            yield Static("", id="quiz-done")
        yield Footer()

    def on_mount(self) -> None:
        self.title = self.round_title
        self._ask()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Grade keys only once the answer is scored (the footer shows what works now)."""
        if action in ("grade", "scroll_score"):
            return self.phase == "scored"
        return True

    def _set_phase(self, phase: str) -> None:
        self.phase = phase
        self.refresh_bindings()

    # --- one card ------------------------------------------------------------------------

    @property
    def card(self) -> Card:
        return self.cards[self.index]

    def _ask(self) -> None:
        from dojo.quiz import Countdown

        card = self.card
        self._set_phase("answering")
        self._leave_armed = False
        self.sub_title = f"card {self.index + 1} of {len(self.cards)}"
        lesson = self.session.catalog.lesson_of(card)
        meta = Content.assemble((lesson.title, "bold"), (f" · {card.kind}", "$text-muted"),
                                (f"   last card: {self._last_grade}" if self._last_grade
                                 else "", "$text-muted"))
        self.query_one(ContentSwitcher).current = "quiz-answering"
        self.query_one(AnswerPanel).ask(card, meta, Countdown(self.session.quiz_seconds,
                                                               self.session.clock))
        self.session.store.set_last_place("quiz", card.id, card.lesson_id)

    def on_answer_panel_answered(self, message: AnswerPanel.Answered) -> None:
        from dojo.quiz import score_answer, suggested_grade

        card = message.card
        score = score_answer(card, message.text)
        self.session.store.record_answer(
            card.id, message.text, coverage=score.coverage, raw_coverage=score.raw_coverage,
            matched_ids=score.matched_ids, keyword_list=score.keyword_list, mode="drill",
            seconds_used=message.seconds_used)
        self._score, self._seconds_used = score, message.seconds_used
        self.scores.append(score)
        self._set_phase("scored")
        self.query_one("#quiz-scored-question", Static).update(
            Content.assemble(("Q ", "bold $text-primary"), card.question))
        self.query_one(ScoreCard).show(card, score, message.timed_out)
        self.query_one(ContentSwitcher).current = "quiz-scored"
        self._suggested = int(suggested_grade(score))
        self.query_one(GradeBar).suggest(self._suggested)

    def on_grade_bar_graded(self, message: GradeBar.Graded) -> None:
        self.action_grade(message.value)

    def action_accept(self) -> None:
        if self.phase == "scored":
            self.action_grade(self._suggested)
        elif self.phase == "done":
            self.dismiss()

    def action_scroll_score(self, step: int) -> None:
        if self.phase == "scored":
            score = self.query_one(ScoreCard)
            score.scroll_to(y=score.scroll_y + 2 * step, animate=False)

    def action_grade(self, value: int) -> None:
        if self.phase != "scored":
            return
        from dojo.quiz import SelfGrade

        grade = SelfGrade(value)
        now = self.session.now()
        state = self.session.scheduler.review(self.card.id, grade, at=now,
                                              duration_ms=round(self._seconds_used * 1000))
        self._last_grade = f"{grade.label}, again {when(state.due, now)}"
        self._set_phase("graded")
        if self.index + 1 < len(self.cards):
            self.index += 1
            self._ask()
        else:
            self._finish()

    # --- the end -------------------------------------------------------------------------

    def _finish(self) -> None:
        self._set_phase("done")
        self.sub_title = "done"
        scheduler, now = self.session.scheduler, self.session.now()
        mean = sum(score.coverage for score in self.scores) / len(self.scores)
        pool = self.session.catalog.cards
        next_at = scheduler.next_due_at(pool)
        due = len(scheduler.due(pool, now))
        lines: list[str | tuple[str, str] | Content] = [
            (f"{len(self.scores)} answered", "bold"), ", mean coverage ",
            (f"{round(mean * 100)}%", "bold $text-accent"), "\n\n",
        ]
        for card, score in zip(self.cards, self.scores, strict=False):
            mark = ("✓ ", "$text-success") if score.coverage >= 0.65 else ("✗ ", "$text-error")
            lines += [mark, f"{score.percent:>3}%  ", card.question[:70], "\n"]
        lines.append("\n")
        if due:
            lines += [(f"{due} more card(s) due now.", "$text-accent"), "\n"]
        elif next_at is not None:
            lines += ["Next review ", (when(next_at, now), "bold"), ".\n"]
        lines += ["\n", ("Enter", "bold $text-accent"), " or ", ("Esc", "bold $text-accent"),
                  " goes back."]
        done = self.query_one("#quiz-done", Static)
        done.update(Content.assemble(*lines))
        self.query_one(ContentSwitcher).current = "quiz-done"
        self.set_focus(None)

    def action_leave(self) -> None:
        if self.phase == "answering" and self.query_one(AnswerPanel).text.strip() \
                and not self._leave_armed:
            self._leave_armed = True
            self.notify("Press Esc again to leave; this answer is not scored.", timeout=3)
            return
        self.dismiss()
