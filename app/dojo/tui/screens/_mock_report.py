"""The report after a mock interview: coverage per question, the weakest lessons and labs,
and what to do next (each a line to press Enter on)."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.content import Content
from textual.screen import Screen
from textual.widgets import Header, OptionList, Static
from textual.widgets.option_list import Option

from dojo.tui.navigation import OpenLab, OpenLesson, StartDrill
from dojo.tui.widgets import KeyFooter
from dojo.tui.widgets._meter import fit, meter

if TYPE_CHECKING:
    from dojo.content import Card
    from dojo.quiz import MockReport, QuestionResult, Score
    from dojo.tui.session import Session


def _style(coverage: float) -> str:
    return "$text-success" if coverage >= 0.7 else \
        "$text-warning" if coverage >= 0.35 else "$text-error"


def _question_line(number: int, result: QuestionResult) -> Content:
    headline = result.headline.percent if result.headline else 0
    follow = (f"{result.follow_up.percent if result.follow_up else 0:>3}%"
              if result.question.follow_up else "   —")
    return Content.assemble(
        f"{number}. ", fit(result.question.lesson.title, 32), " ",
        meter(result.coverage, 8, _style(result.coverage)),
        (f" {round(result.coverage * 100):>3}%", f"bold {_style(result.coverage)}"),
        (f"  ({headline}% + {follow.strip()})", "$text-muted"))


def report_content(report: MockReport) -> Content:
    """The whole report as text (the screen adds the actions below it)."""
    parts: list[Content | str | tuple[str, str]] = [
        ("Overall ", "bold"), meter(report.overall, 16, _style(report.overall)),
        (f" {round(report.overall * 100)}%", f"bold {_style(report.overall)}"), "\n\n",
        ("Per question", "bold $text-primary"),
        ("  coverage (headline + follow-up)", "$text-muted"), "\n"]
    for number, result in enumerate(report.results, start=1):
        parts += [_question_line(number, result), "\n"]
    parts += ["\n", ("Weakest lessons", "bold $text-primary"), "\n"]
    if not report.weakest:
        parts += [("None below 70% — well done. Try a longer interview.", "$text-success"),
                  "\n"]
    for weak in report.weakest:
        parts += [(weak.lesson.title, "bold"),
                  (f"  {round(weak.coverage * 100)}%", _style(weak.coverage)), "\n"]
        for point in weak.missed[:5]:
            parts += [("  ✗ ", "$text-error"), point.text, "\n"]
        for lab in weak.labs[:3]:
            state = "ready" if lab.availability.value == "ready" else "coming"
            parts += [("  lab ", "$text-muted"), f"{lab.lab} · stage {lab.stage} ",
                      (state, "$text-success" if state == "ready" else "$text-muted"), "\n"]
    if report.review_next:
        parts += ["\n", ("Review next: ", "bold $text-primary"),
                  f"{len(report.review_next)} card(s) — the first action below drills them."]
    parts += ["\n\n", ("Question by question", "bold $text-primary"), "\n"]
    for number, result in enumerate(report.results, start=1):
        for card, score in ((result.question.headline, result.headline),
                            (result.question.follow_up, result.follow_up)):
            if card is not None:
                parts += ["\n", *_answer_section(number, card, score)]
    return Content.assemble(*parts)


def _answer_section(number: int, card: Card,
                    score: Score | None) -> list[Content | str | tuple[str, str]]:
    """One card of the interview: the question, what the learner said (the spans that
    earned points highlighted), the points, the model answer."""
    from dojo.tui.widgets._score_card import highlighted_answer

    kind = "follow-up" if card.kind == "followup" else "question"
    parts: list[Content | str | tuple[str, str]] = [
        (f"{number}. {kind}: ", "bold"), (card.question.strip(), "bold"), "\n"]
    if score is None:
        return [*parts, ("  not answered", "$text-muted"), "\n"]
    said = highlighted_answer(score) if score.text.strip() else Content.styled(
        "(nothing typed)", "$text-muted")
    parts += [("Your answer ", "$text-muted"), (f"{score.percent}%", f"bold "
              f"{_style(score.coverage)}"), "\n", said, "\n"]
    for result in score.results:
        mark, style = ("✓", "$text-success") if result.made else \
            ("⊘", "$text-error") if result.contradicted else ("✗", "$text-error")
        parts += [(f"  {mark} ", f"bold {style}"), (result.point.text, style)]
        if result.contradicted:
            parts.append((" — you said the opposite", "$text-error"))
        parts.append("\n")
    parts += [("Model answer", "$text-muted"), "\n", card.answer.strip(), "\n"]
    return parts


class MockReportScreen(Screen[None]):
    """Enter on an action goes there; Esc returns Home."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("q,escape", "back", "Back"),
    ]

    def __init__(self, session: Session, report: MockReport) -> None:
        super().__init__()
        self.session = session
        self.report = report

    def compose(self) -> ComposeResult:
        yield Header()
        with VerticalScroll(id="report-body"):
            yield Static(report_content(self.report), id="report-text")
        yield OptionList(*self._actions(), id="report-actions")
        yield KeyFooter()

    def _actions(self) -> list[Option]:
        actions = []
        if self.report.review_next:
            actions.append(Option(f"Drill the {len(self.report.review_next)} card(s) to review",
                                  id="drill"))
        for weak in self.report.weakest:
            actions.append(Option(f"Read: {weak.lesson.title}", id=f"lesson:{weak.lesson.id}"))
            for lab in weak.labs:
                if lab.availability.value == "ready":
                    actions.append(Option(f"Lab: {lab.lab} · stage {lab.stage}",
                                          id=f"lab:{lab.lab}:{lab.stage}"))
                    break
        actions.append(Option("Back to Home", id="home"))
        return actions

    def on_mount(self) -> None:
        self.title = "Mock interview report"
        self.sub_title = f"{len(self.report.results)} questions"
        self.query_one("#report-actions").border_title = "What next"
        self.query_one(OptionList).focus()

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        kind, _, rest = (event.option.id or "").partition(":")
        if kind == "drill":
            self.post_message(StartDrill(tuple(card.id for card in self.report.review_next),
                                         "Drill: after the mock interview"))
        elif kind == "lesson":
            self.post_message(OpenLesson(rest))
        elif kind == "lab":
            lab, _, stage = rest.partition(":")
            self.post_message(OpenLab(lab, stage))
        else:
            self.dismiss()

    def action_back(self) -> None:
        self.dismiss()
