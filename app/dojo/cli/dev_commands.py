"""What `dojo dev …` does (the parser, and the list of commands, are in `dojo.cli.dev`)."""

from __future__ import annotations

import argparse
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

from dojo.cli.errors import UsageProblem
from dojo.content.lab_checks import scan_checks
from dojo.content.labs import Lab, LabError, content_root, find_lab
from dojo.content.overlay import OverlayError, materialise, record
from dojo.content.scaffold import ScaffoldError

Handler = Callable[[argparse.Namespace], int]


def _guard(handler: Handler) -> Handler:
    def run(args: argparse.Namespace) -> int:
        try:
            code: int = handler(args)
            return code
        except (LabError, OverlayError, ScaffoldError, KeyError) as exc:
            text = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
            raise UsageProblem(str(text)) from None
    return run


def _new_lab(args: argparse.Namespace) -> int:
    from dojo.content.scaffold import new_lab
    from dojo.runner.mutants import record_golden

    root = (args.root or content_root()).resolve()
    created = new_lab(root, args.slug)
    for path in created:
        print(f"created {path.relative_to(root)}")
    lab = find_lab(args.slug, root)
    code = 0
    for mutant in lab.mutants():
        outcome = record_golden(lab, mutant, runs=1)
        if outcome.problem:
            print(f"could not record {mutant.name}'s golden message: {outcome.problem}; "
                  f"run `dojo dev golden {lab.id}` once that is fixed", file=sys.stderr)
            code = 1
        else:
            print(f"created {mutant.expected.relative_to(root)} (the golden message, recorded "
                  "by running the check)")
    print(f"\nnext: dojo lint --root {root}, then follow docs/add-a-lab.md")
    return code


def _new_lesson(args: argparse.Namespace) -> int:
    from dojo.content.scaffold import new_lesson

    root = (args.root or content_root()).resolve()
    created = new_lesson(root, args.slug, args.track)
    for path in created:
        print(f"created {path.relative_to(root)}")
    return 0


def _mutant_edit(args: argparse.Namespace) -> int:
    lab = find_lab(args.slug)
    folder = lab.mutants_dir / args.name
    dest: Path = args.dir
    if dest.exists() and any(dest.iterdir()):
        raise UsageProblem(f"{dest} is not empty; name a new or empty directory")
    if (folder / "mutant.yaml").is_file() and not args.from_solution:
        materialise(folder, lab.solution_dir, lab.files, dest)
        print(f"mutant {args.name}'s files are in {dest}; edit them, then: "
              f"dojo dev mutant save {lab.id} {args.name} --from {dest}")
    else:
        for name in lab.files:
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(lab.solution_dir / name, dest / name)
        print(f"a copy of the solution is in {dest}; put one mistake in it, then: "
              f"dojo dev mutant save {lab.id} {args.name} --from {dest} --check CHECK "
              "--mistake '...'")
    return 0


def _stage_of(lab: Lab, check: str) -> str:
    for found in scan_checks(lab.checks_dir).checks:
        if found.id == check:
            return found.stage
    raise UsageProblem(f"no check {check!r} in labs/{lab.id}/checks/")


def _yaml_text(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _mutant_save(args: argparse.Namespace) -> int:
    lab = find_lab(args.slug)
    source: Path = args.source
    missing = [name for name in lab.files if not (source / name).is_file()]
    if missing:
        raise UsageProblem(f"{source} lacks {', '.join(missing)}: it must hold every learner "
                           "file (`dojo dev mutant edit` writes them)")
    folder = lab.mutants_dir / args.name
    manifest = folder / "mutant.yaml"
    if manifest.is_file() and (args.check or args.mistake):
        # --check/--mistake announce a new mutant: a name already taken would lose the old
        # mistake's overlays without a word
        raise UsageProblem(f"mutant {args.name} exists already ({manifest}); pick another "
                           "name for a new mutant, or leave out --check and --mistake to "
                           "replace its overlays with DIR's changes")
    if not manifest.is_file():
        if not (args.check and args.mistake):
            raise UsageProblem(f"{args.name} is a new mutant: give --check and --mistake")
        stage = _stage_of(lab, args.check)
        folder.mkdir(parents=True, exist_ok=True)
        manifest.write_text(f"mistake: {_yaml_text(args.mistake)}\nstage: {stage}\n"
                            f"check: {args.check}\nmentions: []\n", encoding="utf-8")
        print(f"created {manifest} (add `mentions`: words its message must contain)")
    full_copies = [name for name in lab.files
                   if source.resolve() == folder.resolve() and (folder / name).is_file()]
    changed = record(source, lab.solution_dir, lab.files, folder)
    for name in full_copies:  # converting an old full-copy mutant in place
        (folder / name).unlink()
    if not changed:
        print(f"warning: {source} is the solution unchanged; {args.name} makes no mistake",
              file=sys.stderr)
        return 1
    print(f"saved {args.name}: overlays for {', '.join(changed)}")
    print(f"next: dojo dev golden {lab.id} --mutant {args.name}")
    return 0


def _golden(args: argparse.Namespace) -> int:
    from dojo.runner.mutants import record_golden

    lab = find_lab(args.slug)
    mutants = [lab.mutant(name) for name in args.mutant] or lab.mutants()
    failed = 0
    for mutant in mutants:
        outcome = record_golden(lab, mutant, runs=args.runs, merge_existing=args.merge)
        if outcome.problem:
            failed += 1
            print(f"{mutant.name}: NOT RECORDED: {outcome.problem}", flush=True)
        else:
            state = "updated" if outcome.changed else "unchanged"
            print(f"{mutant.name}: {state} ({mutant.expected})", flush=True)
    print(f"{len(mutants) - failed} of {len(mutants)} golden message(s) recorded")
    return 1 if failed else 0


# The handlers `dojo.cli.dev` names.
new_lab = _guard(_new_lab)
new_lesson = _guard(_new_lesson)
mutant_edit = _guard(_mutant_edit)
mutant_save = _guard(_mutant_save)
golden = _guard(_golden)
