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
from dojo.quiz.scoring import Score

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


def timer_header(label: str, remaining: float, style: Style) -> str:
    """The ticking line above the answer: warns in the last ten seconds."""
    hint = style.dim("  type your answer; an empty line or Ctrl-D sends it")
    shown = style.bad(label) if remaining <= 10 else style.bold(label)
    return shown + hint


def score_block(score: Score, style: Style) -> str:
    total = len(score.matched) + len(score.missed)
    lines = [style.bold(f"Coverage {score.percent}%") +
             f"  ({len(score.matched)} of {total} key points)"]
    if score.keyword_list:
        lines.append(style.warn(wrap(f"⚠ {score.shape.reason} Scored "
                                     f"{score.percent}% instead of "
                                     f"{round(score.raw_coverage * 100)}%.", "")))
    for point in score.matched:
        lines.append(style.good(f"  ✓ {point.text}"))
    for point in score.missed:
        lines.append(style.bad(f"  ✗ {point.text}"))
    return "\n".join(lines)


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
    return "\n".join(lines)
