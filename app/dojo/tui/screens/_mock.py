"""A mock interview: N headline questions, each followed by a follow-up, under the clock.

Answers are scored silently (as an interviewer would) and the report comes at the end.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.content import Content
from textual.screen import Screen
from textual.widgets import Header

from dojo.tui.widgets import AnswerPanel, KeyFooter

if TYPE_CHECKING:
    from dojo.content import Card
    from dojo.quiz import MockInterview, Score
    from dojo.tui.session import Session


class MockScreen(Screen[None]):
    """Every answer is recorded as it is given (mode "mock")."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "end", "End interview"),
    ]

    def __init__(self, session: Session, interview: MockInterview) -> None:
        super().__init__()
        self.session = session
        self.interview = interview
        self.turns: list[tuple[int, Card, bool]] = [
            (number, card, card is not question.headline)
            for number, question in enumerate(interview.questions, start=1)
            for card in question.cards]
        self.index = 0
        self.scores: dict[str, Score] = {}
        self._end_armed = False

    def compose(self) -> ComposeResult:
        yield Header()
        yield AnswerPanel(id="mock-answer", cursor_blink=getattr(self.app, "cursor_blink", True))
        yield KeyFooter()

    def on_mount(self) -> None:
        self.title = f"Mock interview · {len(self.interview.questions)} questions"
        self._ask()

    def _ask(self) -> None:
        from dojo.quiz import Countdown

        number, card, follow_up = self.turns[self.index]
        self._end_armed = False
        self.sub_title = f"answer {self.index + 1} of {len(self.turns)}"
        lesson = self.session.catalog.lesson_of(card)
        meta = Content.assemble(
            (f"Question {number} of {len(self.interview.questions)}", "bold"),
            (" · follow-up" if follow_up else "", "$text-accent"),
            (f" · {lesson.title}", "$text-muted"))
        self.query_one(AnswerPanel).ask(card, meta, Countdown(self.session.quiz_seconds,
                                                               self.session.clock))

    def on_answer_panel_answered(self, message: AnswerPanel.Answered) -> None:
        from dojo.quiz import score_answer

        card = message.card
        score = score_answer(card, message.text)
        self.scores[card.id] = score
        self.session.store.record_answer(
            card.id, message.text, coverage=score.coverage, raw_coverage=score.raw_coverage,
            matched_ids=score.matched_ids, keyword_list=score.keyword_list, mode="mock",
            seconds_used=message.seconds_used)
        if message.timed_out:
            self.notify("Time. Next question.", timeout=2)
        self.index += 1
        if self.index < len(self.turns):
            self._ask()
        else:
            self._report()

    def _report(self) -> None:
        from dojo.quiz import mock_report
        from dojo.tui.screens._mock_report import MockReportScreen

        report = mock_report(self.interview, self.scores, self.session.content_root)
        self.app.switch_screen(MockReportScreen(self.session, report))

    def action_end(self) -> None:
        if not self._end_armed:
            self._end_armed = True
            self.notify("Press Esc again to end the interview now; unanswered questions count "
                        "as 0 in the report.", timeout=4)
            return
        self.query_one(AnswerPanel).stop()
        self._report()
