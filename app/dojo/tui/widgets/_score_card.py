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


# Keys that tick or untick the checklist's points (j and k scroll, 1–4 grade).
POINT_KEYS = "abcdefghil"


def coverage_line(score: Score) -> Content:
    essentials = score.essentials
    made = sum(r.made for r in essentials)
    style = "$text-success" if score.coverage >= 0.65 else \
        "$text-warning" if score.coverage >= 0.35 else "$text-error"
    detail = f"  {made} of {len(essentials)} essentials"
    if score.bonus:
        detail += f", {sum(r.made for r in score.bonus)} of {len(score.bonus)} bonus"
    if score.confirmed:
        detail += " · your checklist"
    return Content.assemble(("Coverage ", "bold"), (f"{score.percent}% ", f"bold {style}"),
                            meter(score.coverage, 12, style), (detail, "$text-muted"))


def _quote(text: str, spans: tuple[tuple[int, int], ...], limit: int = 80) -> str:
    if not spans:
        return ""
    quote = " ".join(text[min(s for s, _ in spans):max(e for _, e in spans)].split())
    return quote if len(quote) <= limit else quote[:limit - 1] + "…"


def key_point_rows(score: Score) -> list[Horizontal]:
    """The checklist: ✓ made (with the words that earned it), ✗ missed, ⊘ said the
    opposite; each with the key that flips it. Wrapped lines hang under the text."""
    rows = []
    for index, result in enumerate(score.results):
        key = POINT_KEYS[index] if index < len(POINT_KEYS) else " "
        if result.made:
            mark, style, kind = "✓", "$text-success", "-made"
        elif result.contradicted:
            mark, style, kind = "⊘", "$text-error", "-contradicted"
        else:
            mark, style, kind = "✗", "$text-error", "-missed"
        parts: list[str | tuple[str, str]] = [(result.point.text, style)]
        if result.point.bonus:
            parts.insert(0, ("bonus · ", "$text-muted"))
        if result.by_learner:
            parts.append((" (your tick)" if result.made else " (you unticked it)",
                          "$text-muted"))
        elif result.made and result.spans:
            parts.append((f"\n“{_quote(score.text, result.spans)}”", "$text-muted"))
        elif result.contradicted:
            why = "" if result.because == "negated" else f" — {result.because}"
            parts.append((f"\nyou said the opposite{why}: “{_quote(score.text, result.spans)}”",
                          "$text-error"))
        rows.append(Horizontal(
            Static(Content.styled(key, "bold $text-accent"), classes="point-key"),
            Static(Content.styled(mark, f"bold {style}"), classes="point-mark"),
            Static(Content.assemble(*parts), classes="point-text"),
            classes=f"point {kind}"))
    return rows


def highlighted_answer(score: Score) -> Content:
    """The learner's answer with each span that earned a ✓ in green and each contradiction
    in red."""
    marks = sorted((start, end, result.contradicted)
                   for result in score.results if result.made or result.contradicted
                   for start, end in result.spans)
    parts: list[str | tuple[str, str]] = []
    position = 0
    for start, end, bad in marks:
        if start < position:
            continue
        parts.append(score.text[position:start])
        parts.append((score.text[start:end],
                      "bold $text-error underline" if bad else "bold $text-success"))
        position = end
    parts.append(score.text[position:])
    return Content.assemble(*parts)


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
        & .point-key { width: 2; }
        & .point-mark { width: 2; }
        & > #score-answer {
            margin-top: 1; padding: 0 1;
            border: round $foreground 30%; border-title-color: $text-muted;
        }
        & > #score-hint { color: $text-muted; }
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
        yield Static("", id="score-hint")
        yield Static("", id="score-answer")
        yield Static("", id="score-model")
        yield Static("", id="score-measuring")

    def show(self, card: Card, score: Score, timed_out: bool, *, aloud: bool = False) -> None:
        self.update_points(score, timed_out, aloud=aloud)
        answer = self.query_one("#score-answer", Static)
        answer.border_title = "Your answer"
        answer.update(highlighted_answer(score))
        answer.display = bool(score.text.strip())
        model = self.query_one("#score-model", Static)
        model.border_title = "Model answer"
        model.update(Content(card.answer.strip()))
        measuring = self.query_one("#score-measuring", Static)
        measuring.update(Content.assemble(("What the interviewer is measuring: ", "bold"),
                                          card.measuring) if card.measuring else "")
        measuring.display = bool(card.measuring)
        self.scroll_home(animate=False)

    def update_points(self, score: Score, timed_out: bool = False, *,
                      aloud: bool = False) -> None:
        """The coverage line, warnings and checklist (after a tick or untick too)."""
        head = coverage_line(score)
        if timed_out:
            head = Content.assemble(head, ("   time was up", "$text-warning"))
        self.query_one("#score-coverage", Static).update(head)
        warning = self.query_one("#score-warning", Static)
        if score.keyword_list:
            warning.update(Content(f"⚠ {score.shape.reason[:1].upper()}{score.shape.reason[1:]}"))
        elif score.contradicted:
            warning.update(f"⊘ You said the opposite of {len(score.contradicted)} point(s): "
                           "the answer counts at most 20 %.")
        elif aloud:
            warning.update("Said aloud: tick the points you made, then grade.")
        elif score.empty:
            warning.update("⚠ Nothing was typed. Read the model answer, then say it aloud.")
        warning.display = score.keyword_list or score.empty or bool(score.contradicted) \
            or aloud
        points = self.query_one("#score-points", Vertical)
        points.remove_children()
        points.mount_all(key_point_rows(score))
        last = POINT_KEYS[min(len(score.results), len(POINT_KEYS)) - 1]
        self.query_one("#score-hint", Static).update(
            f"a–{last} ticks or unticks a point: the grade follows your checklist")
