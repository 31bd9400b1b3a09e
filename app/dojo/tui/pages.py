"""Engine models as documents (`dojo.tui.document` blocks): lessons, lab instructions by
stage, the solution, the workspace diff. Layout only: which text goes in which block."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from dojo.tui.document import Block, Callout, Fence, Heading, Prose, Title, split_fences

if TYPE_CHECKING:
    from dojo.content import Lesson
    from dojo.content.labs import Lab, Stage

SIXTY_SECONDS = "The 60-second answer"
_H2 = re.compile(r"^##\s+(?P<title>.+?)\s*#*\s*$")
_H1 = re.compile(r"^#\s+(?P<title>.+?)\s*#*\s*$")
_FENCE = re.compile(r"^\s*(```|~~~)")


def lesson_page(lesson: Lesson, links: tuple[str, ...] = ()) -> list[Block]:
    """The whole lesson: title and question, the 60-second answer as a highlighted box, then
    every section with its H3 subsections (each a place the table of contents goes to)."""
    blocks: list[Block] = [Title(lesson.title, (f"[i]“{lesson.question}”[/i]", *links))]
    for section in lesson.sections:
        if section.title == SIXTY_SECONDS:
            blocks.append(Callout(SIXTY_SECONDS, section.intro,
                                  subtitle=f"say it out loud · {lesson.seconds} s",
                                  slug=section.slug))
            continue
        blocks.append(Heading(section.title, 2, section.slug))
        blocks += split_fences(section.intro)
        for sub in section.subsections:
            blocks.append(Heading(sub.title, 3, sub.slug))
            blocks += split_fences(sub.text)
    return blocks


@dataclass(frozen=True)
class ReadmeSection:
    title: str
    body: str


@dataclass(frozen=True)
class LabReadme:
    """A lab README cut at its H2 headings: the title, the text before the first H2, the
    sections of the stages (by stage id) and the others (working on the lab, your files…)."""

    title: str
    intro: str
    stages: dict[str, ReadmeSection]
    others: tuple[ReadmeSection, ...]


def _sections(text: str) -> tuple[str, str, list[ReadmeSection]]:
    title, intro, sections = "", [], []
    current: tuple[str, list[str]] | None = None
    fenced = False
    for line in text.splitlines():
        if _FENCE.match(line):
            fenced = not fenced
        heading = None if fenced else _H2.match(line)
        top = None if fenced or title else _H1.match(line)
        if heading:
            if current:
                sections.append(ReadmeSection(current[0], "\n".join(current[1]).strip()))
            current = (heading["title"], [])
        elif top and current is None:
            title = top["title"]
        elif current is None:
            intro.append(line)
        else:
            current[1].append(line)
    if current:
        sections.append(ReadmeSection(current[0], "\n".join(current[1]).strip()))
    return title, "\n".join(intro).strip(), sections


def read_lab_readme(lab: Lab) -> LabReadme:
    """Match each stage to its README section as the lab linter does: the first heading, in
    order, that contains the stage's title or id."""
    try:
        text = lab.readme.read_text(encoding="utf-8")
    except OSError:
        text = ""
    title, intro, sections = _sections(text)
    stages: dict[str, ReadmeSection] = {}
    used: set[int] = set()
    position = 0
    for stage in lab.stages:
        for index in range(position, len(sections)):
            heading = sections[index].title.lower()
            if stage.title.lower() in heading or stage.id.lower() in heading:
                stages[stage.id] = sections[index]
                used.add(index)
                position = index + 1
                break
    others = tuple(section for index, section in enumerate(sections) if index not in used)
    return LabReadme(title or lab.title, intro, stages, others)


def lab_overview_page(lab: Lab, readme: LabReadme, workspace: str) -> list[Block]:
    """What the learner reads first: the README's introduction and its general sections."""
    blocks: list[Block] = [Title(readme.title, (
        f"[b]{len(lab.stages)} stages[/b] · your files are in [b]{workspace}[/b]",))]
    blocks += split_fences(readme.intro)
    for section in readme.others:
        blocks.append(Heading(section.title, 2))
        blocks += split_fences(section.body)
    return blocks


def lab_stage_page(lab: Lab, stage: Stage, readme: LabReadme,
                   hints: list[tuple[int, str]]) -> list[Block]:
    """One stage: what it proves, its README section, the hints asked for so far."""
    number = lab.stage_ids.index(stage.id) + 1
    section = readme.stages.get(stage.id)
    blocks: list[Block] = [
        Heading(f"{number}. {stage.title} ({stage.id})", 2),
        Callout("What the checks prove", stage.proves, kind="note",
                subtitle=f"read: lesson {stage.lesson}" if stage.lesson else ""),
    ]
    if section:
        blocks += split_fences(section.body)
    for shown, text in hints:
        blocks.append(Callout(f"Hint {shown} of {len(stage.hints)}", text, kind="hint"))
    return blocks


_LEXERS = {".py": "python", ".sql": "sql", ".yaml": "yaml", ".yml": "yaml", ".md": "markdown"}


def files_page(title: str, folder: Path, names: tuple[str, ...]) -> list[Block]:
    """Each file under a heading, as highlighted code (the reference solution)."""
    blocks: list[Block] = [Title(title, (f"[dim]{folder}[/dim]",))]
    for name in names:
        path = folder / name
        try:
            code = path.read_text(encoding="utf-8")
        except OSError as exc:
            code = f"(cannot read {path}: {exc.strerror or exc})"
        blocks.append(Heading(name, 2, slug=name))
        blocks.append(Fence(code, _LEXERS.get(path.suffix, "text")))
    return blocks


def diff_page(lab_id: str, diff: str) -> list[Block]:
    """The workspace against the starter."""
    if not diff:
        return [Title("No changes yet", (f"workspace/{lab_id} matches the starter.",))]
    return [Title(f"Your changes in workspace/{lab_id}", ("against the starter files",)),
            Fence(diff, "diff")]


def text_page(title: str, text: str) -> list[Block]:
    return [Title(title), Prose(text)]
