"""`dojo dev …`: commands for lab and lesson authors (docs/add-a-lab.md).

    dojo dev new-lab SLUG            a lint-clean lab skeleton: lab.yaml, README, starter,
                                     one check, one mutant with its golden, the solution
    dojo dev new-lesson SLUG         lessons/NN-SLUG/ with lesson.md and cards.yaml
    dojo dev mutant edit SLUG NAME DIR    the full files of a mutant (or of the solution,
                                          for a new one) in DIR, to edit
    dojo dev mutant save SLUG NAME --from DIR   store DIR's differences from the solution
                                                as the mutant's overlays
    dojo dev golden SLUG [--mutant NAME]  run mutants and record expected.txt

Exit codes: 0 done, 1 something did not work (said why), 2 a usage problem.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

from dojo.content.lab_checks import scan_checks
from dojo.content.labs import Lab, LabError, content_root, find_lab
from dojo.content.overlay import OverlayError, materialise, record
from dojo.content.scaffold import ScaffoldError


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg,unused-ignore]
    parser = sub.add_parser("dev", help="authoring: new labs and lessons, mutants, goldens")
    actions = parser.add_subparsers(dest="dev_action", metavar="ACTION")

    p_lab = actions.add_parser("new-lab", help="create a lint-clean lab skeleton")
    p_lab.add_argument("slug")
    p_lab.add_argument("--root", type=Path, default=None, help="content root (default: this "
                                                               "checkout or DOJO_CONTENT_ROOT)")
    p_lab.set_defaults(handler=_guard(_new_lab))

    p_lesson = actions.add_parser("new-lesson", help="create a lint-clean lesson skeleton")
    p_lesson.add_argument("slug")
    p_lesson.add_argument("--root", type=Path, default=None)
    p_lesson.add_argument("--track", default="next", choices=("interview", "next", "craft"))
    p_lesson.set_defaults(handler=_guard(_new_lesson))

    p_mutant = actions.add_parser("mutant", help="edit and save mutants as overlays")
    mutant_actions = p_mutant.add_subparsers(dest="mutant_action", metavar="ACTION")
    p_edit = mutant_actions.add_parser("edit", help="write a mutant's full files to DIR")
    p_edit.add_argument("slug")
    p_edit.add_argument("name")
    p_edit.add_argument("dir", type=Path)
    p_edit.add_argument("--from-solution", action="store_true",
                        help="start from the solution even when the mutant exists (its "
                             "overlay no longer applies: put the mistake in again)")
    p_edit.set_defaults(handler=_guard(_mutant_edit))
    p_save = mutant_actions.add_parser("save", help="store DIR's changes as overlays")
    p_save.add_argument("slug")
    p_save.add_argument("name")
    p_save.add_argument("--from", dest="source", type=Path, required=True, metavar="DIR")
    p_save.add_argument("--check", help="the check that must reject it (new mutants)")
    p_save.add_argument("--mistake", help="the mistake, in a sentence (new mutants)")
    p_save.set_defaults(handler=_guard(_mutant_save))
    p_mutant.set_defaults(handler=lambda args: (p_mutant.print_help(), 2)[1])

    p_golden = actions.add_parser("golden", help="record mutants' golden messages")
    p_golden.add_argument("slug")
    p_golden.add_argument("--mutant", action="append", default=[], metavar="NAME",
                          help="only this mutant (repeatable; default: all)")
    p_golden.add_argument("--runs", type=int, default=2,
                          help="runs per mutant; where they differ, expected.txt gets <…>")
    p_golden.add_argument("--merge", action="store_true",
                          help="merge with the existing expected.txt (a run on another "
                               "broker) instead of replacing it")
    p_golden.set_defaults(handler=_guard(_golden))
    parser.set_defaults(handler=lambda args: (parser.print_help(), 2)[1])


class UsageProblem(Exception):
    """Something typed that cannot work: `error: …`, exit 2."""


Handler = Callable[[argparse.Namespace], int]


def _guard(handler: Handler) -> Handler:
    def run(args: argparse.Namespace) -> int:
        try:
            code: int = handler(args)
            return code
        except (UsageProblem, LabError, OverlayError, ScaffoldError, KeyError) as exc:
            text = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
            print(f"error: {text}", file=sys.stderr)
            return 2
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
