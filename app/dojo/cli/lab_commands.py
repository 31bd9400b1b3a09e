"""What `dojo lab …` does (the parser is in `dojo.cli.lab`): a thin layer over the runner.

`dojo lab check SLUG --mutant NAME` runs a mutant (its overlays on the solution, in a scratch
directory); `--impl DIR` checks any full directory.

Exit codes: 0 everything passed (or the action succeeded), 1 a check did not pass or the
learner declined, 2 a usage problem (unknown lab or stage, workspace not started).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

from dojo.cli.errors import UsageProblem
from dojo.cli.lab_render import Printer, paint_diff, progress_marks, use_colour
from dojo.content.labs import Lab, LabError, content_root, find_lab, lab_dirs, load_lab
from dojo.content.overlay import OverlayError
from dojo.runner import progress, workspace
from dojo.runner.execute import CheckRun, RunOptions, left_out_thorough
from dojo.runner.mutants import materialised
from dojo.runner.results import CheckResult, RunSummary

Handler = Callable[[argparse.Namespace], int]


def _guard(handler: Handler) -> Handler:
    """An unknown lab, stage, check or mutant is a usage problem (`error: …`, exit 2), never
    a traceback."""

    def run(args: argparse.Namespace) -> int:
        try:
            code: int = handler(args)
            return code
        except (LabError, KeyError) as exc:
            text = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
            raise UsageProblem(str(text)) from None
    return run


def _lab(slug: str) -> Lab:
    return find_lab(slug)


def _impl(lab: Lab, args: argparse.Namespace, scratch: ExitStack | None = None
          ) -> tuple[Path, str, bool]:
    """The directory to check, how to name it, and whether it is the learner's workspace.
    A mutant is materialised in a scratch directory that `scratch` removes when it closes."""
    if getattr(args, "mutant", None) and scratch is not None:
        mutant = lab.mutant(args.mutant)  # KeyError names the mutants there are
        try:
            impl = scratch.enter_context(materialised(lab, mutant))
        except OverlayError as exc:
            raise UsageProblem(f"mutant {mutant.name!r} does not apply to "
                               f"solutions/{lab.id}/: {exc}") from exc
        return impl, f"mutants/{mutant.name} (on solutions/{lab.id})", False
    if args.solution:
        return lab.solution_dir, f"solutions/{lab.id}", False
    if args.impl:
        if not args.impl.is_dir():
            raise UsageProblem(f"--impl {args.impl}: no such directory")
        return args.impl.resolve(), str(args.impl), False
    target = workspace.workspace_dir(lab)
    if not target.is_dir():
        raise UsageProblem(f"you have not started {lab.id!r} yet: run `dojo lab start {lab.id}`")
    return target, f"workspace/{lab.id}", True


def _list(args: argparse.Namespace) -> int:
    root = content_root()
    folders = list(lab_dirs(root))
    rows: list[dict[str, object]] = []
    colour = use_colour(sys.stdout)
    for folder in folders:
        try:
            lab = load_lab(folder, root)
        except LabError as exc:  # one broken manifest must not hide the other labs
            rows.append({"id": folder.name, "error": str(exc)})
            if not args.json:
                print(f"{folder.name:<10} (cannot load: {exc})")
            continue
        started = workspace.workspace_dir(lab).is_dir()
        statuses = progress.stage_statuses(lab)
        passed = sum(1 for s in lab.stage_ids if statuses.get(s) == "pass")
        rows.append({"id": lab.id, "title": lab.title, "started": started,
                     "workspace": str(workspace.workspace_dir(lab)), "passed": passed,
                     "stages": [{"id": stage.id, "title": stage.title,
                                 "status": statuses.get(stage.id, "")}
                                for stage in lab.stages]})
        if not args.json:
            state = f"{passed}/{len(lab.stages)} stages" if started else "not started"
            print(f"{lab.id:<10} {progress_marks(lab, statuses, colour)}  {state:<12} "
                  f"{lab.title}")
    if args.json:
        print(json.dumps(rows, indent=2, ensure_ascii=False))
    elif not folders:
        print(f"no labs yet under {root / 'labs'}")
    else:
        print("\n✓ passed  ✗ failed  ! error  ~ needs Apache Kafka  · not checked yet")
    return 0


def _start(args: argparse.Namespace) -> int:
    lab = _lab(args.slug)
    outcome = workspace.start(lab)
    if outcome.created:
        print(f"started {lab.id}: your files are in {outcome.path}")
    elif outcome.copied:
        print(f"{outcome.path} exists; copied the missing starter files: "
              f"{', '.join(outcome.copied)}")
    else:
        print(f"{outcome.path} exists already; your work is untouched "
              f"(`dojo lab reset {lab.id}` starts over)")
    print(f"read {workspace.readme_path(lab)}, then: dojo lab check {lab.id}   "
          f"(or: dojo lab watch {lab.id})")
    return 0


def _run(lab: Lab, impl: Path, options: RunOptions, printer: Printer | None,
         json_out: bool) -> RunSummary:
    run = CheckRun(lab, impl, options)
    for event in run:
        if json_out:
            if isinstance(event, CheckResult):
                print(event.to_json(), flush=True)
        elif printer is not None:
            printer.event(event)
    return run.summary


def _check(args: argparse.Namespace) -> int:
    lab = _lab(args.slug)
    for stage in args.stage:
        lab.stage(stage)  # KeyError names the stages there are
    with ExitStack() as scratch:
        impl, label, is_workspace = _impl(lab, args, scratch)
        checks = tuple(args.check)
        if args.mutant and not checks and not args.stage:
            checks = (lab.mutant(args.mutant).check,)
        options = RunOptions(stages=tuple(args.stage), checks=checks,
                             stop_at_failing_stage=args.stop_at_failing_stage,
                             thorough=args.thorough)
        printer = None if args.json else Printer(lab, colour=use_colour(sys.stdout))
        if printer:
            printer.header(label)
        summary = _run(lab, impl, options, printer, args.json)
    if args.check and not summary.results:
        raise UsageProblem(f"no check called {', '.join(args.check)} in {lab.id!r}")
    if is_workspace:
        progress.record_stage_results(lab, summary)
    if printer:
        printer.summary(summary, stopped_early=args.stop_at_failing_stage,
                        left_out=left_out_thorough(lab, options, summary))
    return check_exit_code(summary)


def check_exit_code(summary: RunSummary) -> int:
    """0 every check passed; 1 a check failed or your code raised; 3 nothing of yours failed
    but a service broke under a check; 4 nothing failed, but some checks need another
    broker (Apache Kafka) to be verified. (2 is a usage problem, as everywhere in dojo.)"""
    if summary.passed:
        return 0
    if summary.count("fail") or summary.count("error"):
        return 1
    if summary.count("infra"):
        return 3
    if summary.count("needs-backend"):
        return 4
    return 1


def _watch(args: argparse.Namespace) -> int:
    from watchfiles import watch

    lab = _lab(args.slug)
    impl, label, is_workspace = _impl(lab, args)
    colour = use_colour(sys.stdout)

    def run_once() -> None:
        if colour:
            print("\033[2J\033[H", end="")  # a fresh screen per run, like rustlings
        printer = Printer(lab, colour=colour)
        printer.header(label)
        # the stage being worked on first, then the ones before it, then the later ones
        first = progress.first_unfinished_stage(lab) if is_workspace else ""
        summary = _run(lab, impl, RunOptions(stop_at_failing_stage=True, first_stage=first),
                       printer, False)
        if is_workspace:
            progress.record_stage_results(lab, summary)
        printer.summary(summary, stopped_early=True)
        print(f"\nwatching {impl} — save a file to check again, Ctrl-C to stop", flush=True)

    try:
        seen = _python_files_state(impl)
        run_once()
        # The watcher only sees events after it starts, and a save may land while checks
        # run: so every wake-up (change or timeout) compares the files with the state the
        # last run saw, and nothing saved in between is missed.
        for _changes in watch(impl, watch_filter=lambda _, path: path.endswith(".py"),
                              debounce=300, rust_timeout=500, yield_on_timeout=True):
            now = _python_files_state(impl)
            if now != seen:
                seen = now
                run_once()
    except KeyboardInterrupt:
        print("\nstopped watching")
    return 0


def _python_files_state(folder: Path) -> dict[Path, tuple[int, int]]:
    """Modification time and size of every .py file under `folder` (caches excluded)."""
    state = {}
    for path in folder.rglob("*.py"):
        if "__pycache__" in path.parts:
            continue
        try:
            stat = path.stat()
        except OSError:  # deleted between listing and looking: an editor's temp file
            continue
        state[path] = (stat.st_mtime_ns, stat.st_size)
    return state


def _hint(args: argparse.Namespace) -> int:
    lab = _lab(args.slug)
    stage_id = args.stage or progress.first_unfinished_stage(lab)
    stage = lab.stage(stage_id)
    number, text = progress.next_hint(lab, stage_id)
    position = lab.stage_ids.index(stage_id) + 1
    print(f"stage {position} · {stage.id} — {stage.title}")
    print(f"proves: {stage.proves}")
    if not text:
        print("this stage has no hints")
        return 0
    print(f"\nhint {number} of {len(stage.hints)}: {text}")
    if number < len(stage.hints):
        print(f"\n(`dojo lab hint {lab.id} {stage.id}` again for the next one)")
    if stage.lesson:
        print(f"read: lesson {stage.lesson}")
    return 0


def _confirm(question: str) -> bool:
    print(f"{question} [y/N] ", end="", flush=True)
    try:
        answer = input()
    except EOFError:
        print()
        return False
    return answer.strip().lower() in ("y", "yes")


def _reset(args: argparse.Namespace) -> int:
    lab = _lab(args.slug)
    target = workspace.workspace_dir(lab)
    if not target.is_dir():
        raise UsageProblem(f"nothing to reset: {lab.id!r} is not started "
                           f"(`dojo lab start {lab.id}`)")
    changed = workspace.changed_files(lab)
    if not changed:
        print(f"{target} already matches the starter; nothing to reset")
        return 0
    if not args.yes and not _confirm(
            f"Reset {target}? Your changes to {', '.join(changed)} will be lost "
            f"(see them first with `dojo lab diff {lab.id}`)."):
        print("nothing changed")
        return 1
    workspace.reset(lab)
    print(f"reset {', '.join(changed)} to the starter")
    return 0


def _diff(args: argparse.Namespace) -> int:
    lab = _lab(args.slug)
    if not workspace.workspace_dir(lab).is_dir():
        raise UsageProblem(f"{lab.id!r} is not started (`dojo lab start {lab.id}`)")
    text = workspace.diff(lab)
    if not text:
        print("no changes: your workspace matches the starter")
        return 0
    sys.stdout.write(paint_diff(text, use_colour(sys.stdout)))
    return 0


# The handlers `dojo.cli.lab` names.
list_labs = _guard(_list)
start = _guard(_start)
check = _guard(_check)
watch = _guard(_watch)
hint = _guard(_hint)
reset = _guard(_reset)
diff = _guard(_diff)
