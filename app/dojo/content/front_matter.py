"""The YAML front matter of lesson.md: split it off, parse it with lines, check its schema."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dojo.content.models import TRACKS, LabLink
from dojo.content.problems import Problem
from dojo.content.yaml_lines import YamlDoc, YamlSyntaxError, parse_yaml

REQUIRED_KEYS = ("id", "title", "track", "order", "question", "seconds", "sources")
OPTIONAL_KEYS = ("labs", "related")
SLUG = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")
FOLDER = re.compile(r"(\d\d)-([a-z0-9]+(?:-[a-z0-9]+)*)")


@dataclass(frozen=True)
class FrontMatter:
    """The checked front matter; fields that were wrong hold a safe fallback."""

    id: str
    title: str
    track: str
    order: int
    question: str
    seconds: int
    labs: tuple[LabLink, ...]
    related: tuple[tuple[str, int], ...]  # id and line, so broken references can be pointed at
    sources: tuple[str, ...]
    doc: YamlDoc


def split_front_matter(text: str) -> tuple[str, str, int] | None:
    """(front matter YAML, body, file line where the body starts), or None when the file does
    not open with a `---` fenced front matter block."""
    lines = text.split("\n")
    if not lines or lines[0].strip() != "---":
        return None
    for index in range(1, len(lines)):
        if lines[index].strip() in ("---", "..."):
            return "\n".join(lines[1:index]), "\n".join(lines[index + 1:]), index + 2
    return None


def folder_slug(lesson_dir: Path) -> str | None:
    """`dead-letter-queue` for `01-dead-letter-queue`; None when the name breaks NN-slug."""
    match = FOLDER.fullmatch(lesson_dir.name)
    return match.group(2) if match else None


def read_front_matter(path: Path, yaml_text: str) -> tuple[FrontMatter | None, list[Problem]]:
    """Parse and check the front matter of `path` (its YAML starts on file line 2)."""
    try:
        doc = parse_yaml(yaml_text, path, first_line=2)
    except YamlSyntaxError as exc:
        return None, [Problem(path, exc.line, exc.message)]
    if not isinstance(doc.data, dict):
        return None, [Problem(path, 1, "front matter must be a YAML mapping (id, title, …)")]
    checker = _Checker(path, doc)
    return checker.front_matter(), checker.problems


class _Checker:
    def __init__(self, path: Path, doc: YamlDoc) -> None:
        self.path = path
        self.doc = doc
        self.data: dict[str, Any] = doc.data
        self.problems: list[Problem] = []

    def problem(self, message: str, *keys: str | int) -> None:
        self.problems.append(Problem(self.path, self.doc.line(*keys), message))

    def front_matter(self) -> FrontMatter:
        for key_path, line in self.doc.duplicate_keys:
            self.problems.append(Problem(self.path, line, f"`{key_path[-1]}` appears twice"))
        for key in self.data:
            if key not in REQUIRED_KEYS + OPTIONAL_KEYS:
                known = ", ".join(REQUIRED_KEYS + OPTIONAL_KEYS)
                self.problem(f"unknown front matter key `{key}` (known: {known})", str(key))
        for key in REQUIRED_KEYS:
            if key not in self.data:
                self.problem(f"front matter is missing `{key}`")
        lesson_id = self.text("id")
        if lesson_id and not SLUG.fullmatch(lesson_id):
            self.problem(f"id {lesson_id!r} must be a slug: lower-case letters, digits, hyphens",
                         "id")
        track = self.text("track")
        if track and track not in TRACKS:
            self.problem(f"track {track!r} must be one of {', '.join(TRACKS)}", "track")
        return FrontMatter(
            id=lesson_id,
            title=self.text("title"),
            track=track if track in TRACKS else TRACKS[-1],
            order=self.positive_int("order"),
            question=self.text("question"),
            seconds=self.positive_int("seconds"),
            labs=self.labs(),
            related=self.related(),
            sources=self.sources(),
            doc=self.doc,
        )

    def text(self, key: str) -> str:
        value = self.data.get(key)
        if value is None:
            return ""
        if not isinstance(value, str) or not value.strip():
            self.problem(f"`{key}` must be non-empty text", key)
            return ""
        return value.strip()

    def positive_int(self, key: str) -> int:
        value = self.data.get(key)
        if value is None:
            return 0
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            self.problem(f"`{key}` must be a positive whole number, not {value!r}", key)
            return 0
        return value

    def labs(self) -> tuple[LabLink, ...]:
        value = self.data.get("labs")
        if value is None:
            return ()
        if not isinstance(value, list):
            self.problem("`labs` must be a list of {lab: <id>, stage: <stage id>}", "labs")
            return ()
        links = []
        for index, item in enumerate(value):
            if (not isinstance(item, dict) or set(item) != {"lab", "stage"}
                    or not all(isinstance(item[k], str) and item[k] for k in ("lab", "stage"))):
                self.problem("each `labs` item must be {lab: <id>, stage: <stage id>}",
                             "labs", index)
                continue
            links.append(LabLink(item["lab"], item["stage"], self.doc.line("labs", index)))
        return tuple(links)

    def related(self) -> tuple[tuple[str, int], ...]:
        value = self.data.get("related")
        if value is None:
            return ()
        if not isinstance(value, list):
            self.problem("`related` must be a list of lesson ids", "related")
            return ()
        out = []
        for index, item in enumerate(value):
            if not isinstance(item, str) or not item:
                self.problem("each `related` item must be a lesson id", "related", index)
                continue
            out.append((item, self.doc.line("related", index)))
        return tuple(out)

    def sources(self) -> tuple[str, ...]:
        value = self.data.get("sources")
        if value is None:
            return ()
        if not isinstance(value, list) or not value:
            self.problem("`sources` must be a non-empty list of where the facts come from",
                         "sources")
            return ()
        out = []
        for index, item in enumerate(value):
            if not isinstance(item, str) or not item.strip():
                self.problem("each `sources` item must be non-empty text", "sources", index)
                continue
            out.append(item.strip())
        return tuple(out)
