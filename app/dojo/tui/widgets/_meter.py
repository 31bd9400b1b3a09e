"""Small pieces of styled text the widgets share: bars, stage marks, percentages.

They use theme variables ($text-success, …), so they follow the light and dark themes.
"""

from __future__ import annotations

from textual.content import Content

STAGE_MARKS = {
    "pass": ("✓", "$text-success"),
    "fail": ("✗", "$text-error"),
    "error": ("!", "$text-error"),
    "needs-backend": ("~", "$text-warning"),
    "running": ("◌", "$text-accent"),
    "": ("·", "$text-muted"),
}
STATUS_WORDS = {"pass": "passed", "fail": "failed", "error": "error",
                "needs-backend": "needs Apache Kafka or a PostgreSQL setting",
                "running": "running", "": "not checked"}


def meter(fraction: float, width: int = 10, style: str = "$text-success") -> Content:
    """`███████░░░` for a fraction between 0 and 1 (eighths for the partial cell)."""
    fraction = min(max(fraction, 0.0), 1.0)
    eighths = round(fraction * width * 8)
    full, part = divmod(eighths, 8)
    filled = "█" * full + (" ▏▎▍▌▋▊▉"[part] if part and full < width else "")
    empty = "░" * (width - len(filled))
    return Content.assemble((filled, style), (empty, "$text-muted"))


def stage_mark(status: str) -> Content:
    """One character for a stage's latest status (· when never checked)."""
    mark, style = STAGE_MARKS.get(status, STAGE_MARKS[""])
    return Content.styled(mark, style)


def stage_marks(stage_ids: tuple[str, ...], statuses: dict[str, str]) -> Content:
    """`✓✓✗······`: every stage of a lab in order."""
    return Content.assemble(*(stage_mark(statuses.get(stage, "")) for stage in stage_ids))


def percent(fraction: float) -> str:
    return f"{round(fraction * 100):>3}%"


def fit(text: str, width: int) -> str:
    """`text` cut to `width` cells with an ellipsis, padded to exactly `width`."""
    if len(text) > width:
        text = text[:max(0, width - 1)] + "…"
    return text.ljust(width)
