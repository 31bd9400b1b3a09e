"""`ScoreCard`: how an answer covered the key points, and the model answer beside it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.content import Content
from textual.widgets import Static

from dojo.tui.widgets._meter import meter

if TYPE_CHECKING:
    from dojo.content import Card
    from dojo.quiz import Score


def coverage_line(score: Score) -> Content:
    total = len(score.matched) + len(score.missed)
    style = "$text-success" if score.coverage >= 0.65 else \
        "$text-warning" if score.coverage >= 0.35 else "$text-error"
    return Content.assemble(("Coverage ", "bold"), (f"{score.percent}% ", f"bold {style}"),
                            meter(score.coverage, 12, style),
                            (f"  {len(score.matched)} of {total} key points", "$text-muted"))


def key_points(score: Score) -> Content:
    """✓ for each point made, ✗ (highlighted) for each one missed."""
    lines: list[Content] = []
    for point in score.matched:
        lines.append(Content.assemble(("✓ ", "bold $text-success"), (point.text, "$text-success")))
    for point in score.missed:
        lines.append(Content.assemble(("✗ ", "bold $text-error"),
                                      (point.text, "bold $text-error")))
    return Content("\n").join(lines)


class ScoreCard(VerticalScroll, can_focus=True):
    """Set with `show(card, score, timed_out)`; scrolls with j/k or the arrows."""

    DEFAULT_CSS = """
    ScoreCard {
        height: 1fr;
        padding: 0 1;
        scrollbar-size-vertical: 1;
        & > Static { height: auto; }
        & > #score-warning {
            color: $text-warning; background: $warning 15%; padding: 0 1; margin-top: 1;
        }
        & > #score-points { margin-top: 1; }
        & > #score-model {
            margin-top: 1; padding: 0 1;
            border: round $accent; border-title-color: $text-accent;
        }
        & > #score-measuring { margin-top: 1; color: $text-muted; }
    }
    """

    BINDINGS = [("j", "scroll_down", "Down"), ("k", "scroll_up", "Up")]

    def compose(self) -> ComposeResult:
        yield Static("", id="score-coverage")
        yield Static("", id="score-warning")
        yield Static("", id="score-points")
        yield Static("", id="score-model")
        yield Static("", id="score-measuring")

    def show(self, card: Card, score: Score, timed_out: bool) -> None:
        head = coverage_line(score)
        if timed_out:
            head = Content.assemble(head, ("   time was up", "$text-warning"))
        self.query_one("#score-coverage", Static).update(head)
        warning = self.query_one("#score-warning", Static)
        if score.keyword_list:
            warning.update(Content(f"⚠ {score.shape.reason[:1].upper()}{score.shape.reason[1:]}"))
        elif score.empty:
            warning.update("⚠ Nothing was typed. Read the model answer, then say it aloud.")
        warning.display = score.keyword_list or score.empty
        self.query_one("#score-points", Static).update(key_points(score))
        model = self.query_one("#score-model", Static)
        model.border_title = "Model answer"
        model.update(Content(card.answer.strip()))
        measuring = self.query_one("#score-measuring", Static)
        measuring.update(Content.assemble(("What the interviewer is measuring: ", "bold"),
                                          card.measuring) if card.measuring else "")
        measuring.display = bool(card.measuring)
        self.scroll_home(animate=False)
