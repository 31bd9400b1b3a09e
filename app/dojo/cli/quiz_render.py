"""What `dojo quiz` prints: questions, scores, model answers, the mock interview report.

Pure functions from engine results to text, so the terminal code stays small and the output
can be tested without a terminal. Colour only when asked for (a TTY without NO_COLOR).
"""

from __future__ import annotations

import os
import shutil
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from dojo.content.lab_links import LabAvailability
from dojo.content.models import Card, Lesson
from dojo.quiz.mock import MockReport
from dojo.quiz.scoring import CONTRADICTION_CAP, PointResult, Score, Verdict

MAX_WIDTH = 88
KIND_LABEL = {"headline": "headline", "followup": "follow-up",
              "spot-the-mistake": "spot the mistake"}


def use_colour(stream: TextIO) -> bool:
    return stream.isatty() and "NO_COLOR" not in os.environ


@dataclass(frozen=True)
class Style:
    """ANSI styling that turns itself off for pipes."""

    colour: bool = False

    def _sgr(self, code: str, text: str) -> str:
        return f"\x1b[{code}m{text}\x1b[0m" if self.colour else text

    def bold(self, text: str) -> str:
        return self._sgr("1", text)

    def dim(self, text: str) -> str:
        return self._sgr("2", text)

    def good(self, text: str) -> str:
        return self._sgr("32", text)

    def bad(self, text: str) -> str:
        return self._sgr("31", text)

    def warn(self, text: str) -> str:
        return self._sgr("33", text)


def width() -> int:
    return min(MAX_WIDTH, shutil.get_terminal_size((80, 24)).columns) - 2


def wrap(text: str, indent: str = "  ") -> str:
    """Re-flow prose to the terminal, keeping paragraph breaks."""
    paragraphs = [" ".join(p.split()) for p in text.strip().split("\n\n")]
    return "\n\n".join(textwrap.fill(p, width(), initial_indent=indent,
                                     subsequent_indent=indent) for p in paragraphs if p)


def question_block(card: Card, lesson: Lesson, number: int, total: int, style: Style) -> str:
    head = style.dim(f"[{number}/{total}] {lesson.title} · {KIND_LABEL.get(card.kind, card.kind)}")
    return f"\n{head}\n{style.bold(wrap(card.question, ''))}"


def timer_header(label: str, remaining: float, style: Style, hint: str | None = None) -> str:
    """The ticking line above the answer: warns in the last ten seconds."""
    hint = style.dim(hint or "  type your answer; an empty line or Ctrl-D sends it")
    shown = style.bad(label) if remaining <= 10 else style.bold(label)
    return shown + hint


def _numbered(score: Score) -> list[tuple[int, PointResult]]:
    """Points as the checklist numbers them: essentials first, then bonus points."""
    return list(enumerate(score.results, start=1))


def score_block(score: Score, style: Style, *, aloud: bool = False) -> str:
    """Coverage, then the checklist: ✓ made (with the words that earned it), ✗ missed (the
    model phrasing), ⊘ said the opposite. Numbered so the learner can tick and untick."""
    essentials = score.essentials
    made = sum(r.made for r in essentials)
    bonus = score.bonus
    head = style.bold(f"Coverage {score.percent}%")
    head += f"  ({made} of {len(essentials)} essentials"
    head += f", {sum(r.made for r in bonus)} of {len(bonus)} bonus)" if bonus else ")"
    if score.confirmed:
        head += style.dim("  · your checklist")
    elif aloud:
        head = style.bold("Tick what you said") + f"  ({len(essentials)} essentials)"
    lines = [head]
    if score.keyword_list and not aloud:
        lines.append(style.warn(wrap(f"⚠ {score.shape.reason} Scored {score.percent}% "
                                     f"instead of {round(score.raw_coverage * 100)}%.", "")))
    if score.contradicted:
        lines.append(style.bad(wrap(f"⊘ You said the opposite of {len(score.contradicted)} "
                                    "point(s): the answer counts at most "
                                    f"{round(CONTRADICTION_CAP * 100)}%.", "")))
    for number, result in _numbered(score):
        if number == len(essentials) + 1:
            lines.append(style.dim("  bonus"))
        lines.append(_point_line(number, result, score.text, style))
    return "\n".join(lines)


def _point_line(number: int, result: PointResult, text: str, style: Style) -> str:
    point = result.point
    tag = f"{number:>3} "
    mine = style.dim(" (you)") if result.by_learner else ""
    if result.made:
        line = style.good(f"{tag}✓ {point.text}") + mine
        quote = _quote(text, result.spans)
        return line + (style.dim(f"\n        “{quote}”") if quote and not result.by_learner
                       else "")
    if result.contradicted:
        said = _quote(text, result.spans)
        why = result.because if result.because != "negated" else "negated"
        line = style.bad(f"{tag}⊘ {point.text}") + mine
        return line + style.bad(f"\n        you said the opposite ({why}): “{said}”")
    return style.bad(f"{tag}✗ {point.text}") + mine


def _quote(text: str, spans: tuple[tuple[int, int], ...], limit: int = 90) -> str:
    if not spans:
        return ""
    start, end = min(s for s, _ in spans), max(e for _, e in spans)
    quote = " ".join(text[start:end].split())
    return quote if len(quote) <= limit else quote[:limit - 1] + "…"


def evidence_block(score: Score, style: Style) -> str:
    """The learner's answer with each span that earned a ✓ marked `[n …]` (green), and each
    contradiction `[!n …]` (red)."""
    marks: list[tuple[int, int, int, bool]] = []
    for number, result in _numbered(score):
        if result.made or result.contradicted:
            for start, end in result.spans:
                marks.append((start, end, number, result.contradicted))
    marks.sort()
    out: list[str] = []
    position = 0
    for start, end, number, bad in marks:
        if start < position:
            continue  # overlaps a span already shown
        out.append(score.text[position:start])
        label = f"!{number}" if bad else f"{number}"
        piece = f"[{label} {score.text[start:end]}]"
        out.append(style.bad(piece) if bad else style.good(piece))
        position = end
    out.append(score.text[position:])
    body = " ".join("".join(out).split())
    return style.bold("Your answer") + "\n" + textwrap.fill(
        body, width(), initial_indent="  ", subsequent_indent="  ")


def score_json(card: Card, score: Score) -> dict[str, object]:
    """`dojo quiz score --json`: everything the text output shows, as data."""
    def point(result: PointResult) -> dict[str, object]:
        return {"id": result.point.id, "text": result.point.text,
                "bonus": result.point.bonus, "verdict": result.verdict.value,
                "because": result.because or None,
                "evidence": [{"start": s, "end": e, "text": score.text[s:e]}
                             for s, e in result.spans]}
    return {
        "card": card.id,
        "percent": score.percent,
        "coverage": round(score.coverage, 4),
        "raw_coverage": round(score.raw_coverage, 4),
        "keyword_list": score.keyword_list,
        "keyword_list_reason": score.shape.reason or None,
        "matched": [r.point.id for r in score.results if r.made],
        "missed": [r.point.id for r in score.results if r.verdict is Verdict.MISSED],
        "contradicted": [r.point.id for r in score.contradicted],
        "points": [point(r) for r in score.results],
    }


def model_answer_block(card: Card, style: Style) -> str:
    parts = [style.bold("Model answer"), wrap(card.answer)]
    if card.measuring:
        parts += [style.bold("What the interviewer is measuring"), wrap(card.measuring)]
    return "\n".join(parts)


def grade_prompt(suggested_label: str, suggested_value: int) -> str:
    return (f"Grade yourself: 1 Again  2 Hard  3 Good  4 Easy  "
            f"[Enter = {suggested_value} {suggested_label}, q = stop] ")


def _shown(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def _percent(value: float) -> str:
    return f"{round(value * 100):>3}%"


def mock_report_block(report: MockReport, style: Style) -> str:
    """The end of a mock interview: how each question went, where to go next."""
    lines = ["", style.bold(f"Mock interview report — overall {_percent(report.overall).strip()}")]
    for number, result in enumerate(report.results, start=1):
        question = result.question
        head = result.headline.percent if result.headline else None
        follow = result.follow_up.percent if result.follow_up else None
        shown_head = f"{head}%" if head is not None else "skipped"
        line = f"  {number}. {question.lesson.title}: question {shown_head}"
        if question.follow_up is not None:
            line += f", follow-up {f'{follow}%' if follow is not None else 'skipped'}"
        flagged = [s for s in (result.headline, result.follow_up) if s and s.keyword_list]
        if flagged:
            line += style.warn("  (read like a keyword list)")
        lines.append(line)
    if not report.weakest:
        lines += ["", style.good("No weak spots in this round. Try a longer mock, or harder "
                                 "follow-ups with `dojo quiz --due`.")]
        return "\n".join(lines)
    lines += ["", style.bold("Weakest lessons")]
    for weak in report.weakest:
        lines.append(f"  {weak.lesson.title} ({_percent(weak.coverage).strip()}) — reread "
                     f"{_shown(weak.lesson.path)}")
        for point in weak.missed:
            lines.append(style.bad(f"    ✗ {point.text}"))
        for lab in dict.fromkeys((pointer.lab, pointer.availability) for pointer in weak.labs):
            name, availability = lab
            stages = [p.stage for p in weak.labs if p.lab == name]
            if availability == LabAvailability.READY:
                lines.append(f"    lab: dojo lab start {name}  (stages: {', '.join(stages)})")
            else:
                lines.append(style.dim(f"    lab {name} (coming): stages {', '.join(stages)}"))
    if report.review_next:
        lines += ["", style.bold("Review next")]
        for lesson_id in dict.fromkeys(card.lesson_id for card in report.review_next):
            cards = [card.id for card in report.review_next if card.lesson_id == lesson_id]
            lines.append(f"  dojo quiz --lesson {lesson_id}   ({', '.join(cards)})")
    lines += _answers_section(report, style)
    return "\n".join(lines)


def _answers_section(report: MockReport, style: Style) -> list[str]:
    """Question by question: what was asked, the learner's answer with its evidence, the
    points, the model answer."""
    lines = ["", style.bold("Question by question")]
    for number, result in enumerate(report.results, start=1):
        for card, score in ((result.question.headline, result.headline),
                            (result.question.follow_up, result.follow_up)):
            if card is None:
                continue
            kind = "follow-up" if card.kind == "followup" else "question"
            lines += ["", style.bold(f"{number}. {kind}: ") + style.bold(wrap(card.question, ""))]
            if score is None:
                lines.append(style.dim("  not answered"))
                continue
            lines.append(score_block(score, style))
            if score.text.strip():
                lines.append(evidence_block(score, style))
            lines += [style.bold("Model answer"), wrap(card.answer)]
    return lines
