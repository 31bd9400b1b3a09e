"""Lab progress: how each stage went last time, and how many hints the learner has seen.

THE single call site for the progress store: `record_stage_results` is called after every
check run against the learner's workspace (never the solution or a mutant). Until
`dojo.store` offers `record_lab_stage(lab_id, stage_id, status)`, progress is kept in
`workspace/.dojo-progress.json` (git-ignored with the workspace), which also backs
`dojo lab list` and `dojo lab hint`.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dojo.content.labs import Lab
from dojo.runner.results import RunSummary


def _state_file(lab: Lab) -> Path:
    return lab.content_root / "workspace" / ".dojo-progress.json"


def _load(lab: Lab) -> dict[str, Any]:
    try:
        data = json.loads(_state_file(lab).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _save(lab: Lab, data: dict[str, Any]) -> None:
    path = _state_file(lab)
    path.parent.mkdir(parents=True, exist_ok=True)
    # write-then-rename: a watch run and a hint in another terminal never see half a file
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".progress-")
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        json.dump(data, handle, indent=2, sort_keys=True)
    os.replace(tmp, path)


def _store_recorder() -> Callable[[str, str, str], None] | None:
    try:
        import dojo.store as store
    except ImportError:
        return None
    recorder = getattr(store, "record_lab_stage", None)
    return recorder if callable(recorder) else None


def record_stage_results(lab: Lab, summary: RunSummary) -> None:
    """Remember the status of every stage that ran (pass, fail, error, needs-backend)."""
    data = _load(lab)
    stages = data.setdefault(lab.id, {}).setdefault("stages", {})
    recorder = _store_recorder()
    for stage in summary.stages():
        if not stage.ran or stage.stage not in lab.stage_ids:
            continue
        stages[stage.stage] = stage.status
        if recorder is not None:
            recorder(lab.id, stage.stage, stage.status)
    _save(lab, data)


def stage_statuses(lab: Lab) -> dict[str, str]:
    """Stage id → its last status; stages never checked are absent."""
    stages = _load(lab).get(lab.id, {}).get("stages", {})
    return {k: str(v) for k, v in stages.items() if k in lab.stage_ids}


def first_unfinished_stage(lab: Lab) -> str:
    """The first stage whose last check run did not pass (the first stage if none ran)."""
    statuses = stage_statuses(lab)
    for stage_id in lab.stage_ids:
        if statuses.get(stage_id) != "pass":
            return stage_id
    return lab.stage_ids[-1]


def next_hint(lab: Lab, stage_id: str) -> tuple[int, str]:
    """The next hint of `stage_id` (1-based number, text); the last one repeats once all
    have been shown. Raises KeyError for an unknown stage."""
    stage = lab.stage(stage_id)
    if not stage.hints:
        return 0, ""
    data = _load(lab)
    shown = data.setdefault(lab.id, {}).setdefault("hints_shown", {})
    number = min(int(shown.get(stage_id, 0)) + 1, len(stage.hints))
    shown[stage_id] = number
    _save(lab, data)
    return number, stage.hints[number - 1]
