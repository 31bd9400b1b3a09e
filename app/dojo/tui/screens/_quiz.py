"""A drill: each card against the clock, scored, then self-graded into FSRS."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.content import Content
from textual.screen import Screen
from textual.widgets import ContentSwitcher, Header, Static

from dojo.tui.overview import when
from dojo.tui.widgets import AnswerPanel, GradeBar, KeyFooter, ScoreCard
from dojo.tui.widgets._grade_bar import short_interval
from dojo.tui.widgets._score_card import POINT_KEYS

if TYPE_CHECKING:
    from dojo.content import Card
    from dojo.quiz import Score
    from dojo.tui.session import Session


class QuizScreen(Screen[None]):
    """Every answer and every grade is written to the store the moment it is given."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,q", "leave", "Leave"),
        Binding("1", "grade(1)", "Again"),
        Binding("2", "grade(2)", "Hard"),
        Binding("3", "grade(3)", "Good"),
        Binding("4", "grade(4)", "Easy"),
        Binding("enter", "accept", "Accept", show=False),
        Binding("ctrl+l", "aloud", "Aloud"),
        Binding("a", "tick(0)", "Tick/untick"),
        *(Binding(key, f"tick({index})", show=False)
          for index, key in enumerate(POINT_KEYS) if index),
        Binding("j,down", "scroll_score(1)", "Scroll down", show=False),
        Binding("k,up", "scroll_score(-1)", "Scroll up", show=False),
    ]

    def __init__(self, session: Session, cards: list[Card], *, title: str = "Drill",
                 aloud: bool = False) -> None:
        super().__init__()
        self.aloud = aloud
        self._timed_out = False
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
            yield Static("", id="quiz-ready")
            yield Static("", id="quiz-done")
        yield KeyFooter()

    def on_mount(self) -> None:
        self.title = self.round_title
        self._ask()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Grade keys only once the answer is scored (the footer shows what works now)."""
        if action in ("grade", "scroll_score", "tick"):
            return self.phase == "scored"
        if action == "aloud":
            return self.phase == "answering"
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
        panel = self.query_one(AnswerPanel)
        panel.ask(card, meta, Countdown(self.session.quiz_seconds, self.session.clock))
        panel.set_aloud(self.aloud)
        self.session.store.set_last_place("quiz", card.id, card.lesson_id)

    def _ready(self) -> None:
        """Between cards: the next clock starts only when the learner asks for it."""
        self._set_phase("ready")
        card = self.card
        self.sub_title = f"card {self.index + 1} of {len(self.cards)}"
        self.session.store.set_last_place("quiz", card.id, card.lesson_id)
        lesson = self.session.catalog.lesson_of(card)
        self.query_one("#quiz-ready", Static).update(Content.assemble(
            ("Last card: ", "bold"), self._last_grade, "\n\n",
            (f"Next: card {self.index + 1} of {len(self.cards)}", "bold"),
            (f" · {lesson.title}", "$text-muted"), "\n\n",
            ("Enter", "bold $text-accent"), " shows the question and starts the clock",
            (" (aloud)" if self.aloud else "", "$text-muted"), " · ",
            ("Esc", "bold $text-accent"), " leaves"))
        self.query_one(ContentSwitcher).current = "quiz-ready"
        self.set_focus(None)

    def action_aloud(self) -> None:
        """Switch this round to saying answers aloud (or back to typing)."""
        if self.phase != "answering":
            return
        self.aloud = not self.aloud
        self.query_one(AnswerPanel).set_aloud(self.aloud)
        self.notify("Say it out loud; ctrl+s when you are done." if self.aloud
                    else "Type your answer.", timeout=3)

    def action_tick(self, index: int) -> None:
        """The learner's word: tick a point the scorer missed, untick a false match."""
        if self.phase != "scored" or self._score is None or index >= len(self._score.results):
            return
        from dojo.quiz import suggested_grade

        self._score = self._score.toggled(self._score.results[index].point.id)
        if self.scores:
            self.scores[-1] = self._score
        self.query_one(ScoreCard).update_points(self._score, self._timed_out,
                                                aloud=self.aloud)
        self._suggested = int(suggested_grade(self._score))
        self.query_one(GradeBar).suggest(self._suggested)

    def on_answer_panel_answered(self, message: AnswerPanel.Answered) -> None:
        from dojo.quiz import score_answer, suggested_grade

        card = message.card
        text = "" if self.aloud else message.text
        score = score_answer(card, text)
        if self.aloud:
            score = score.with_checklist(())
        else:
            self.session.store.record_answer(
                card.id, text, coverage=score.coverage, raw_coverage=score.raw_coverage,
                matched_ids=score.matched_ids, keyword_list=score.keyword_list, mode="drill",
                seconds_used=message.seconds_used)
        self._timed_out = message.timed_out
        self._score, self._seconds_used = score, message.seconds_used
        self.scores.append(score)
        self._set_phase("scored")
        self.query_one("#quiz-scored-question", Static).update(
            Content.assemble(("Q ", "bold $text-primary"), card.question))
        self.query_one(ScoreCard).show(card, score, message.timed_out, aloud=self.aloud)
        self.query_one(ContentSwitcher).current = "quiz-scored"
        self._suggested = int(suggested_grade(score))
        bar = self.query_one(GradeBar)
        now = self.session.now()
        bar.intervals({int(grade): short_interval((due - now).total_seconds())
                       for grade, due in self.session.scheduler.preview(card.id, now).items()})
        bar.suggest(self._suggested)

    def on_grade_bar_graded(self, message: GradeBar.Graded) -> None:
        self.action_grade(message.value)

    def action_accept(self) -> None:
        if self.phase == "scored":
            self.action_grade(self._suggested)
        elif self.phase == "ready":
            self._ask()
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
            self._ready()
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
