"""Engine models as documents (`dojo.tui.document` blocks): lessons, lab instructions by
stage, the solution, the workspace diff. Layout only: which text goes in which block."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from dojo.tui.document import Block, Callout, Fence, Heading, Prose, Title, split_fences

if TYPE_CHECKING:
    from dojo.content import Catalog, Lesson
    from dojo.content.labs import Lab, Stage

# `lesson:<id>` or `lesson:<id>#<section>`, bare or as a whole code span
LESSON_REF = re.compile(r"`lesson:(?P<c_lesson>[a-z0-9]+(?:-[a-z0-9]+)*)"
                        r"(?:#(?P<c_section>[a-z0-9][a-z0-9_-]*))?`"
                        r"|(?<![\w/`])lesson:(?P<lesson>[a-z0-9]+(?:-[a-z0-9]+)*)"
                        r"(?:#(?P<section>[a-z0-9][a-z0-9_-]*[a-z0-9]))?")
TitleOf = Callable[[str, str], str | None]  # (lesson id, section slug) -> the link's text
_MARKDOWN_SPECIAL = re.compile(r"([\\`*_\[\]<>])")


def link_titles(catalog: Catalog, here: str = "") -> TitleOf:
    """Names for cross-references: a lesson's title, a section as `Lesson › Section` (only
    the section's title inside lesson `here`). None for a reference to nothing."""

    def title_of(lesson_id: str, section: str) -> str | None:
        if not catalog.has_lesson(lesson_id):
            return None
        lesson = catalog.lesson(lesson_id)
        if not section:
            return lesson.title
        titles = {part.slug: part.title for part in lesson.sections}
        titles.update({sub.slug: sub.title for part in lesson.sections
                       for sub in part.subsections})
        if section not in titles:
            return None
        return titles[section] if lesson_id == here else f"{lesson.title} › {titles[section]}"

    return title_of


def link_lessons(markdown: str, title_of: TitleOf | None) -> str:
    """Turn each `lesson:<id>[#section]` into a Markdown link named by its title; a reference
    that names nothing stays as written (the linter reports it)."""
    if title_of is None or "lesson:" not in markdown:
        return markdown

    def link(match: re.Match[str]) -> str:
        lesson = match["lesson"] or match["c_lesson"]
        section = match["section"] or match["c_section"] or ""
        title = title_of(lesson, section)
        if title is None:
            return match[0]
        target = f"lesson:{lesson}" + (f"#{section}" if section else "")
        text = _MARKDOWN_SPECIAL.sub(r"\\\1", title)
        return f"[{text}]({target})"

    return LESSON_REF.sub(link, markdown)


def with_links(blocks: list[Block], title_of: TitleOf | None) -> list[Block]:
    """The blocks with their prose's lesson references as followable links."""
    if title_of is None:
        return blocks
    out: list[Block] = []
    for block in blocks:
        if isinstance(block, Prose):
            block = Prose(link_lessons(block.markdown, title_of))
        elif isinstance(block, Callout):
            block = replace(block, markdown=link_lessons(block.markdown, title_of))
        out.append(block)
    return out

SIXTY_SECONDS = "The 60-second answer"
_H2 = re.compile(r"^##\s+(?P<title>.+?)\s*#*\s*$")
_H1 = re.compile(r"^#\s+(?P<title>.+?)\s*#*\s*$")
_FENCE = re.compile(r"^\s*(```|~~~)")


def lesson_page(lesson: Lesson, links: tuple[str, ...] = (),
                title_of: TitleOf | None = None) -> list[Block]:
    """The whole lesson: title and question, the 60-second answer as a highlighted box, then
    every section with its H3 subsections (each a place the table of contents goes to).
    With `title_of`, references to lessons become links named by their titles."""
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
    return with_links(blocks, title_of)


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


def lab_overview_page(lab: Lab, readme: LabReadme, workspace: str,
                      title_of: TitleOf | None = None) -> list[Block]:
    """What the learner reads first: the README's introduction and its general sections."""
    blocks: list[Block] = [Title(readme.title, (
        f"[b]{len(lab.stages)} stages[/b] · your files and this README are in "
        f"[b]{workspace}[/b]",))]
    blocks += split_fences(readme.intro)
    for section in readme.others:
        blocks.append(Heading(section.title, 2))
        blocks += split_fences(section.body)
    return with_links(blocks, title_of)


def lab_stage_page(lab: Lab, stage: Stage, readme: LabReadme,
                   hints: list[tuple[int, str]], title_of: TitleOf | None = None
                   ) -> list[Block]:
    """One stage: what it proves (and the lesson section to read), its README section, the
    hints asked for so far."""
    number = lab.stage_ids.index(stage.id) + 1
    section = readme.stages.get(stage.id)
    proves = stage.proves + (f"\n\nRead: lesson:{stage.lesson}" if stage.lesson else "")
    blocks: list[Block] = [
        Heading(f"{number}. {stage.title} ({stage.id})", 2),
        Callout("What the checks prove", proves, kind="note"),
    ]
    if section:
        blocks += split_fences(section.body)
    for shown, text in hints:
        blocks.append(Callout(f"Hint {shown} of {len(stage.hints)}", text, kind="hint"))
    return with_links(blocks, title_of)


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
