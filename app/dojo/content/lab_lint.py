"""The lab linter: every problem in `labs/` and `solutions/`, each naming file and line.

Like rustlings' `dev check`, it refuses what would let a learner down: a stage without hints
or checks, a check no stage owns, stray or missing files, a mutant that names a check that
does not exist, a README without a section per stage. It reads files; it runs no code.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from dojo.content.lab_checks import scan_checks
from dojo.content.labs import MUTANT_FIELDS, Lab, LabError, load_lab, read_yaml
from dojo.content.lesson_refs import lesson_refs
from dojo.content.mutant_lint import mutant_files, mutant_overlays
from dojo.content.problems import Problem
from dojo.content.seed_lint import lab_seed_mentions
from dojo.content.yaml_lines import YamlDoc

LAB_ENTRIES = {"lab.yaml", "README.md", "starter", "checks", "mutants"}
IGNORED = {"__pycache__", ".DS_Store", ".pytest_cache"}
_H2 = re.compile(r"^##\s+(?P<title>.+?)\s*#*\s*$")
_FENCE = re.compile(r"^\s*(```|~~~)")


def _learner_files(folder: Path) -> set[str]:
    """Relative paths of the files under `folder`, without caches."""
    found: set[str] = set()
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = [d for d in dirnames if d not in IGNORED]
        for name in filenames:
            if name not in IGNORED and not name.endswith(".pyc"):
                found.add(str((Path(dirpath) / name).relative_to(folder)))
    return found


class _LabLinter:
    def __init__(self, lab: Lab, doc: YamlDoc) -> None:
        self.lab = lab
        self.doc = doc
        self.problems: list[Problem] = []
        self._checks: dict[str, str] = {}  # check id -> stage, filled by checks()

    def add(self, path: Path, line: int, message: str) -> None:
        self.problems.append(Problem(path, line, message))

    def at_manifest(self, message: str, *keys: str | int) -> None:
        self.add(self.lab.manifest, self.doc.line(*keys), message)

    def run(self) -> list[Problem]:
        for keys, line in self.doc.duplicate_keys:
            self.add(self.lab.manifest, line, f"`{'.'.join(map(str, keys))}` is given twice; "
                                              "YAML keeps only the last one")
        self.stages()
        self.lab_entries()
        self.file_set(self.lab.starter_dir, "starter/")
        if self.lab.solution_dir.is_dir():
            self.file_set(self.lab.solution_dir, f"solutions/{self.lab.id}/")
        else:
            self.at_manifest(f"there is no reference solution: solutions/{self.lab.id}/ is "
                             "missing")
        self.checks()
        self.mutants()
        self.readme()
        return self.problems

    def stages(self) -> None:
        limits = self.lab.time_limits
        if limits.check_seconds > limits.run_seconds:
            self.at_manifest("time_limits.check_seconds is longer than run_seconds",
                             "time_limits")
        for index, stage in enumerate(self.lab.stages):
            for key in ("title", "proves"):
                if not getattr(stage, key):
                    self.at_manifest(f"stage {stage.id!r}: `{key}` is empty", "stages", index, key)
            if not stage.hints:
                self.at_manifest(f"stage {stage.id!r} has no hints; give at least one, gentle "
                                 "first", "stages", index)
            for number, hint in enumerate(stage.hints):
                if not hint:
                    self.at_manifest(f"stage {stage.id!r}: hint {number + 1} is empty",
                                     "stages", index, "hints", number)

    def lab_entries(self) -> None:
        for entry in sorted(self.lab.dir.iterdir()):
            if entry.name not in LAB_ENTRIES and entry.name not in IGNORED:
                self.add(entry, 1, f"stray {'folder' if entry.is_dir() else 'file'} in the lab: "
                                   f"a lab holds only {', '.join(sorted(LAB_ENTRIES))}")
        for needed in ("README.md", "starter", "checks"):
            if not (self.lab.dir / needed).exists():
                self.at_manifest(f"{needed} is missing from {self.lab.dir.name}/")

    def file_set(self, folder: Path, label: str, ignore: frozenset[str] = frozenset()) -> None:
        """`folder` holds exactly the learner files lab.yaml lists."""
        if not folder.is_dir():
            return
        present = _learner_files(folder) - ignore
        for missing in sorted(set(self.lab.files) - present):
            self.at_manifest(f"{label} lacks {missing}, which `files` lists", "files")
        for stray in sorted(present - set(self.lab.files)):
            self.add(folder / stray, 1, f"stray file in {label}: {stray} is not in lab.yaml "
                                        "`files`")

    def checks(self) -> None:
        folder = self.lab.checks_dir
        if not folder.is_dir():
            return
        for entry in sorted(folder.iterdir()):
            name = entry.name
            allowed = (name in IGNORED or name in ("conftest.py", "__init__.py")
                       or name.startswith("_") or (name.startswith("test_")
                                                   and name.endswith(".py")))
            if not allowed:
                self.add(entry, 1, "stray file in checks/: checks are test_*.py; helpers are "
                                   "conftest.py or start with _ (like _support.py)")
        scan = scan_checks(folder)
        for path, line, message in scan.syntax_errors:
            self.add(path, line, message)
        stage_ids = set(self.lab.stage_ids)
        seen: dict[str, Path] = {}
        for check in scan.checks:
            if not check.stage:
                self.add(check.file, check.line, f"check {check.id!r} has no stage marker: add "
                                                 "@pytest.mark.stage(\"<stage id>\")")
            elif check.stage not in stage_ids:
                self.add(check.file, check.stage_line,
                         f"check {check.id!r} is marked with stage {check.stage!r}, which "
                         f"lab.yaml does not define (stages: {', '.join(self.lab.stage_ids)})")
            if check.id in seen:
                self.add(check.file, check.line, f"check id {check.id!r} is also defined in "
                                                 f"{seen[check.id].name}; mutants name checks "
                                                 "by id, so ids must be unique")
            seen.setdefault(check.id, check.file)
        marked = {check.stage for check in scan.checks}
        for index, stage in enumerate(self.lab.stages):
            if stage.id not in marked:
                self.at_manifest(f"stage {stage.id!r} has no check: mark one with "
                                 f"@pytest.mark.stage({stage.id!r})", "stages", index)
        self._checks = {check.id: check.stage for check in scan.checks}

    def mutants(self) -> None:
        folder = self.lab.mutants_dir
        if not folder.is_dir():
            return
        folders = []
        for entry in sorted(folder.iterdir()):
            if entry.name in IGNORED:
                continue
            if not entry.is_dir():
                self.add(entry, 1, "stray file in mutants/: each mutant is a folder")
                continue
            if self.mutant(entry):
                folders.append(entry)
        self.problems += mutant_overlays(self.lab, folders)

    def mutant(self, folder: Path) -> bool:
        """Lint one mutant's manifest and files; False when it has no readable manifest."""
        manifest = folder / "mutant.yaml"
        if not manifest.is_file():
            self.add(folder, 1, "mutant without mutant.yaml (mistake, stage, check, mentions)")
            return False
        try:
            doc = read_yaml(manifest)
        except LabError as exc:
            self.add(exc.path, exc.line, exc.message)
            return False
        for keys, line in doc.duplicate_keys:
            self.add(manifest, line, f"`{'.'.join(map(str, keys))}` is given twice")
        data = doc.data if isinstance(doc.data, dict) else {}
        for key in MUTANT_FIELDS:
            if key not in data or data[key] in (None, "", []):
                self.add(manifest, doc.line(key) if key in data else 1,
                         f"mutant.yaml: `{key}` is missing or empty")
        mentions = data.get("mentions")
        if mentions is not None and not (isinstance(mentions, list)
                                         and all(isinstance(m, str) and m for m in mentions)):
            self.add(manifest, doc.line("mentions"), "mutant.yaml: `mentions` must be a list "
                                                     "of non-empty strings")
        stage, check = data.get("stage"), data.get("check")
        if stage and stage not in self.lab.stage_ids:
            self.add(manifest, doc.line("stage"), f"mutant names stage {stage!r}, which "
                                                  "lab.yaml does not define")
        checks = self._checks
        if check and check not in checks:
            self.add(manifest, doc.line("check"), f"mutant names check {check!r}, which no "
                                                  "checks/test_*.py defines")
        elif check and stage in self.lab.stage_ids and checks.get(check) != stage:
            self.add(manifest, doc.line("check"), f"check {check!r} belongs to stage "
                                                  f"{checks.get(check)!r}, not {stage!r}")
        self.problems += mutant_files(self.lab, folder)
        return True

    def readme(self) -> None:
        path = self.lab.readme
        if not path.is_file():
            return
        headings: list[tuple[int, str]] = []
        fenced = False
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if _FENCE.match(line):
                fenced = not fenced
            elif not fenced and (match := _H2.match(line)):
                headings.append((number, match["title"].lower()))
        position = 0
        for stage in self.lab.stages:
            wanted = [n for n, (_, title) in enumerate(headings)
                      if stage.title.lower() in title or stage.id.lower() in title]
            if not wanted:
                # point where the section belongs: at the next heading, else the last one
                after = headings[position:] or headings[-1:] or [(1, "")]
                self.add(path, after[0][0], f"README.md has no `## …` section for stage "
                                          f"{stage.id!r} ({stage.title}); one per stage, in "
                                          "lab.yaml order")
                continue
            later = [n for n in wanted if n >= position]
            if not later:
                self.add(path, headings[wanted[0]][0], f"the section for stage {stage.id!r} "
                                                       "is out of order; follow lab.yaml")
                continue
            position = later[0] + 1


def lint_lab(lab: Lab) -> list[Problem]:
    """Every problem in one loaded lab and its solution."""
    return sorted(_LabLinter(lab, read_yaml(lab.manifest)).run())


def _lesson_anchors(root: Path) -> dict[str, frozenset[str]]:
    """Lesson id → the section slugs a `lesson#section` link may name."""
    if not (root / "lessons").is_dir():
        return {}
    from dojo.content import load_catalog

    return {lesson.id: lesson.anchors() for lesson in load_catalog(root).lessons}


def _lesson_links(lab: Lab, known: dict[str, frozenset[str]]) -> list[Problem]:
    doc = read_yaml(lab.manifest)
    problems = [Problem(lab.manifest, doc.line("lessons", i), f"lesson {lesson!r} does not "
                                                                  "exist under lessons/")
                for i, lesson in enumerate(lab.lessons) if lesson not in known]
    for index, stage in enumerate(lab.stages):
        lesson, _, section = stage.lesson.partition("#")
        line = doc.line("stages", index, "lesson")
        if lesson and lesson not in known:
            problems.append(Problem(lab.manifest, line, f"stage {stage.id!r} links lesson "
                                                         f"{lesson!r}, which does not exist "
                                                         "under lessons/"))
        elif lesson and section and section not in known[lesson]:
            problems.append(Problem(lab.manifest, line, f"stage {stage.id!r} links "
                                                         f"{stage.lesson!r}, but lesson "
                                                         f"{lesson!r} has no section with "
                                                         f"that slug"))
    return problems


def lint_labs(root: Path) -> list[Problem]:
    """Every problem in `root/labs/` and `root/solutions/`, sorted by file and line.
    Lesson links are checked when `root/lessons/` has lessons."""
    root = Path(root)
    problems: list[Problem] = []
    labs_dir = root / "labs"
    slugs: set[str] = set()
    known_lessons = _lesson_anchors(root)
    if labs_dir.is_dir():
        for folder in sorted(labs_dir.iterdir()):
            if folder.name in IGNORED or folder.name.startswith("."):
                continue
            slugs.add(folder.name)
            problems += lab_seed_mentions(folder)
            if not (folder / "lab.yaml").is_file():
                problems.append(Problem(folder, 1, "a lab folder without lab.yaml"))
                continue
            try:
                lab = load_lab(folder, root)
            except LabError as exc:
                problems.append(Problem(exc.path, exc.line, exc.message))
                continue
            problems += lint_lab(lab)
            if known_lessons:
                problems += _lesson_links(lab, known_lessons)
                problems += lesson_refs(lab, known_lessons)
    solutions = root / "solutions"
    if solutions.is_dir():
        for folder in sorted(solutions.iterdir()):
            if folder.name not in slugs and folder.name not in IGNORED:
                problems.append(Problem(folder, 1, f"a solution without a lab: labs/"
                                                      f"{folder.name}/ does not exist"))
    return sorted(problems)
