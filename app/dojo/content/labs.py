"""Typed lab models and the loader for `labs/<slug>/lab.yaml` and `mutants/<name>/mutant.yaml`.

The files on disk are the source of truth (docs/lab-contract.md). Loading validates shapes and
types and raises `LabError` naming file and line; content rules that need the whole lab (hints,
stray files, checks per stage) belong to the linter, `dojo.content.lab_lint`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dojo.content.overlay import materialise, overlay_files
from dojo.content.root import content_root as content_root  # re-exported for lab callers
from dojo.content.yaml_lines import YamlDoc, YamlSyntaxError, parse_yaml

KNOWN_SERVICES = ("postgres", "kafka")
DEFAULT_CHECK_SECONDS = 60.0
DEFAULT_RUN_SECONDS = 300.0
MUTANT_FIELDS = ("mistake", "stage", "check", "mentions")
EXPECTED_FILE = "expected.txt"

class LabError(ValueError):
    """A lab file that cannot be loaded; `str()` reads `path:line: message`."""

    def __init__(self, path: Path, line: int, message: str) -> None:
        super().__init__(f"{path}:{line}: {message}")
        self.path = path
        self.line = line
        self.message = message


def read_yaml(path: Path) -> YamlDoc:
    """Parse `path` with line tracking; unreadable or invalid YAML raises `LabError`."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise LabError(path, 1, f"cannot read: {exc.strerror or exc}") from exc
    try:
        return parse_yaml(text, path)
    except YamlSyntaxError as exc:
        raise LabError(path, exc.line, exc.message) from exc


def _error(doc: YamlDoc, message: str, *keys: str | int) -> LabError:
    return LabError(doc.path, doc.line(*keys), message)


@dataclass(frozen=True)
class Stage:
    """One stage of a lab: what it proves, the lesson section behind it, and its hints."""

    id: str
    title: str
    proves: str
    lesson: str
    hints: tuple[str, ...]
    line: int  # in lab.yaml, for messages that point back at the manifest

    @property
    def first_hint(self) -> str:
        return self.hints[0] if self.hints else ""


@dataclass(frozen=True)
class TimeLimits:
    check_seconds: float = DEFAULT_CHECK_SECONDS
    run_seconds: float = DEFAULT_RUN_SECONDS


@dataclass(frozen=True)
class Lab:
    """A loaded `labs/<slug>/lab.yaml`, with the paths of the lab's parts."""

    id: str
    title: str
    lessons: tuple[str, ...]
    services: tuple[str, ...]
    files: tuple[str, ...]
    time_limits: TimeLimits
    stages: tuple[Stage, ...]
    dir: Path
    content_root: Path = field(compare=False)

    @property
    def manifest(self) -> Path:
        return self.dir / "lab.yaml"

    @property
    def readme(self) -> Path:
        return self.dir / "README.md"

    @property
    def starter_dir(self) -> Path:
        return self.dir / "starter"

    @property
    def checks_dir(self) -> Path:
        return self.dir / "checks"

    @property
    def mutants_dir(self) -> Path:
        return self.dir / "mutants"

    @property
    def solution_dir(self) -> Path:
        return self.content_root / "solutions" / self.id

    @property
    def stage_ids(self) -> tuple[str, ...]:
        return tuple(stage.id for stage in self.stages)

    def stage(self, stage_id: str) -> Stage:
        """The stage called `stage_id`; KeyError names the stages there are."""
        for stage in self.stages:
            if stage.id == stage_id:
                return stage
        raise KeyError(f"lab {self.id!r} has no stage {stage_id!r}; its stages are "
                       f"{', '.join(self.stage_ids)}")

    def mutant(self, name: str) -> Mutant:
        """The mutant called `name`; KeyError names the mutants there are."""
        path = self.mutants_dir / name
        if not (path / "mutant.yaml").is_file():
            known = ", ".join(m.name for m in self.mutants()) or "none"
            raise KeyError(f"lab {self.id!r} has no mutant {name!r}; its mutants: {known}")
        return load_mutant(path)

    def mutants(self) -> list[Mutant]:
        """Every `mutants/<name>/` of this lab, loaded; the first broken mutant.yaml raises."""
        if not self.mutants_dir.is_dir():
            return []
        return [load_mutant(path) for path in sorted(self.mutants_dir.iterdir())
                if path.is_dir() and not path.name.startswith((".", "__"))]


@dataclass(frozen=True)
class Mutant:
    """One classic mistake, stored as overlays on the solution (`<file>.patch`, see
    `dojo.content.overlay`), the check that must catch it and that check's golden message."""

    name: str
    mistake: str
    stage: str
    check: str
    mentions: tuple[str, ...]
    dir: Path

    @property
    def manifest(self) -> Path:
        return self.dir / "mutant.yaml"

    @property
    def expected(self) -> Path:
        """The golden failure message (`expected.txt`), compared after normalising."""
        return self.dir / EXPECTED_FILE

    def overlays(self) -> list[Path]:
        """The `<file>.patch` overlays, sorted."""
        return overlay_files(self.dir)

    def materialise(self, lab: Lab, dest: Path) -> Path:
        """Write the full learner files of this mutant into `dest` (the solution with the
        overlays applied) and return `dest`; an overlay that no longer applies raises
        `dojo.content.overlay.OverlayError`."""
        return materialise(self.dir, lab.solution_dir, lab.files, dest)


def _text(doc: YamlDoc, mapping: dict[str, Any], key: str, *where: str | int,
          required: bool = True) -> str:
    value = mapping.get(key)
    if value is None:
        if required:
            raise _error(doc, f"`{key}` is missing", *where)
        return ""
    if not isinstance(value, str | int | float) or isinstance(value, bool):
        raise _error(doc, f"`{key}` must be text, not {type(value).__name__}", *where, key)
    return str(value).strip()


def _text_list(doc: YamlDoc, mapping: dict[str, Any], key: str, *where: str | int
               ) -> tuple[str, ...]:
    value = mapping.get(key)
    if value is None:
        return ()
    if not isinstance(value, list):
        raise _error(doc, f"`{key}` must be a list", *where, key)
    out = []
    for index, item in enumerate(value):
        if not isinstance(item, str):
            raise _error(doc, f"`{key}` item {index + 1} must be text", *where, key, index)
        out.append(item.strip())
    return tuple(out)


def _seconds(doc: YamlDoc, limits: dict[str, Any], key: str, default: float) -> float:
    value = limits.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise _error(doc, f"time_limits.{key} must be a positive number of seconds",
                        "time_limits", key)
    return float(value)


def _stage(doc: YamlDoc, raw: Any, index: int) -> Stage:
    if not isinstance(raw, dict):
        raise _error(doc, "each stage must be a mapping with id, title, proves, hints",
                        "stages", index)
    where = ("stages", index)
    hints = raw.get("hints")
    if hints is not None and not isinstance(hints, list):
        raise _error(doc, "`hints` must be a list of text", *where, "hints")
    return Stage(
        id=_text(doc, raw, "id", *where),
        title=_text(doc, raw, "title", *where),
        proves=_text(doc, raw, "proves", *where),
        lesson=_text(doc, raw, "lesson", *where, required=False),
        hints=_text_list(doc, raw, "hints", *where),
        line=doc.line(*where),
    )


def load_lab(lab_dir: Path, root: Path | None = None) -> Lab:
    """Load `lab_dir/lab.yaml`. `root` is the content root (default: the lab's grandparent)."""
    lab_dir = lab_dir.resolve()
    doc = read_yaml(lab_dir / "lab.yaml")
    data = doc.data
    if not isinstance(data, dict):
        raise _error(doc, "lab.yaml must be a mapping (id, title, files, stages, …)")
    lab_id = _text(doc, data, "id")
    if lab_id != lab_dir.name:
        raise _error(doc, f"id {lab_id!r} must equal the folder name {lab_dir.name!r}", "id")
    services = _text_list(doc, data, "services")
    for index, service in enumerate(services):
        if service not in KNOWN_SERVICES:
            raise _error(doc, f"unknown service {service!r}; known: {', '.join(KNOWN_SERVICES)}",
                            "services", index)
    files = _text_list(doc, data, "files")
    if not files:
        raise _error(doc, "`files` must list the learner files (at least one)", "files")
    limits = data.get("time_limits") or {}
    if not isinstance(limits, dict):
        raise _error(doc, "time_limits must be a mapping {check_seconds, run_seconds}",
                        "time_limits")
    raw_stages = data.get("stages")
    if not isinstance(raw_stages, list) or not raw_stages:
        raise _error(doc, "`stages` must be a non-empty list", "stages")
    stages = tuple(_stage(doc, raw, index) for index, raw in enumerate(raw_stages))
    seen: set[str] = set()
    for index, stage in enumerate(stages):
        if stage.id in seen:
            raise _error(doc, f"stage id {stage.id!r} appears twice", "stages", index, "id")
        seen.add(stage.id)
    return Lab(
        id=lab_id,
        title=_text(doc, data, "title"),
        lessons=_text_list(doc, data, "lessons"),
        services=services,
        files=files,
        time_limits=TimeLimits(
            _seconds(doc, limits, "check_seconds", DEFAULT_CHECK_SECONDS),
            _seconds(doc, limits, "run_seconds", DEFAULT_RUN_SECONDS),
        ),
        stages=stages,
        dir=lab_dir,
        content_root=(root or lab_dir.parent.parent).resolve(),
    )


def load_mutant(mutant_dir: Path) -> Mutant:
    """Load `mutant_dir/mutant.yaml`; a missing field raises `LabError` at its line."""
    doc = read_yaml(mutant_dir / "mutant.yaml")
    data = doc.data
    if not isinstance(data, dict):
        raise _error(doc, f"mutant.yaml must be a mapping with {', '.join(MUTANT_FIELDS)}")
    mentions = _text_list(doc, data, "mentions")
    if "mentions" not in data:
        raise _error(doc, "`mentions` is missing")
    return Mutant(
        name=mutant_dir.name,
        mistake=_text(doc, data, "mistake"),
        stage=_text(doc, data, "stage"),
        check=_text(doc, data, "check"),
        mentions=mentions,
        dir=mutant_dir.resolve(),
    )


def lab_dirs(root: Path) -> Iterator[Path]:
    """Every `labs/<slug>/` folder that has a lab.yaml, sorted by slug."""
    labs = root / "labs"
    if not labs.is_dir():
        return
    for path in sorted(labs.iterdir()):
        if path.is_dir() and (path / "lab.yaml").is_file():
            yield path


def load_labs(root: Path | None = None) -> list[Lab]:
    """Every lab under the content root; the first broken lab.yaml raises `LabError`."""
    root = root or content_root()
    return [load_lab(path, root) for path in lab_dirs(root)]


def find_lab(slug: str, root: Path | None = None) -> Lab:
    """The lab called `slug`; KeyError names the labs there are."""
    root = root or content_root()
    path = root / "labs" / slug
    if not (path / "lab.yaml").is_file():
        known = ", ".join(p.name for p in lab_dirs(root)) or "none yet"
        raise KeyError(f"no lab {slug!r} under {root / 'labs'} (labs: {known})")
    return load_lab(path, root)
