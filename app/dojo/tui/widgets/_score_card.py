"""`ScoreCard`: how an answer covered the key points, and the model answer beside it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical, VerticalScroll
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


def key_point_rows(score: Score) -> list[Horizontal]:
    """✓ for each point made, ✗ (highlighted) for each one missed; wrapped lines hang
    under the text, not under the mark."""
    rows = []
    for made, points in ((True, score.matched), (False, score.missed)):
        for point in points:
            style = "$text-success" if made else "$text-error"
            rows.append(Horizontal(
                Static(Content.styled("✓" if made else "✗", f"bold {style}"),
                       classes="point-mark"),
                Static(Content.styled(point.text, style), classes="point-text"),
                classes="point -made" if made else "point -missed"))
    return rows


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
        & > #score-points { margin-top: 1; height: auto; }
        & .point { height: auto; }
        & .point-mark { width: 2; }
        & .point-text { width: 1fr; }
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
        yield Vertical(id="score-points")
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
        points = self.query_one("#score-points", Vertical)
        points.remove_children()
        points.mount_all(key_point_rows(score))
        model = self.query_one("#score-model", Static)
        model.border_title = "Model answer"
        model.update(Content(card.answer.strip()))
        measuring = self.query_one("#score-measuring", Static)
        measuring.update(Content.assemble(("What the interviewer is measuring: ", "bold"),
                                          card.measuring) if card.measuring else "")
        measuring.display = bool(card.measuring)
        self.scroll_home(animate=False)
