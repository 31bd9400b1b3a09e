"""Lab progress: how each stage went last time, and how many hints the learner has seen.

The single place the lab engine talks to the progress store (`dojo.store.ProgressStore`):
`record_stage_results` is called after every check run against the learner's workspace
(never the solution or a mutant). The store has no table for hints, so the hint position of
each stage is a small JSON file next to the store's database (same data dir).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from dojo.content.labs import Lab
from dojo.runner.results import RunSummary
from dojo.store import ProgressStore, data_dir

HINTS_FILE = "lab-hints.json"


def record_stage_results(lab: Lab, summary: RunSummary) -> None:
    """Store the status of every stage that ran, and the stage the learner is on."""
    with ProgressStore() as store:
        for stage in summary.stages():
            if not stage.ran or stage.stage not in lab.stage_ids:
                continue
            if stage.status == "infra":
                continue  # a broken service says nothing about the code: keep what was there
            failing = next((r for r in stage.results if not r.passed), None)
            message = failing.message.splitlines()[0][:300] if failing and failing.message \
                else ""
            store.record_stage_result(lab.id, stage.stage, stage.status, message)
        statuses = {k: v.status for (_, k), v in store.stage_results(lab.id).items()}
        store.set_last_place("lab", lab.id, _first_unfinished(lab, statuses))


def stage_statuses(lab: Lab) -> dict[str, str]:
    """Stage id → the status of its latest run; stages never checked are absent."""
    with ProgressStore() as store:
        records = store.stage_results(lab.id)
    return {stage: record.status for (_, stage), record in records.items()
            if stage in lab.stage_ids}


def _first_unfinished(lab: Lab, statuses: dict[str, str]) -> str:
    for stage_id in lab.stage_ids:
        if statuses.get(stage_id) != "pass":
            return stage_id
    return lab.stage_ids[-1]


def first_unfinished_stage(lab: Lab) -> str:
    """The first stage whose latest run did not pass (the last stage once all passed)."""
    return _first_unfinished(lab, stage_statuses(lab))


def _hints_path() -> Path:
    return data_dir() / HINTS_FILE


def _load_hints() -> dict[str, Any]:
    try:
        data = json.loads(_hints_path().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _save_hints(data: dict[str, Any]) -> None:
    path = _hints_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    # write-then-rename: a hint asked for in two terminals never leaves half a file
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".hints-")
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        json.dump(data, handle, indent=2, sort_keys=True)
    os.replace(tmp, path)


def next_hint(lab: Lab, stage_id: str) -> tuple[int, str]:
    """The next hint of `stage_id` as (1-based number, text); once all were shown the last
    one repeats; (0, "") for a stage without hints. KeyError for an unknown stage."""
    stage = lab.stage(stage_id)
    if not stage.hints:
        return 0, ""
    data = _load_hints()
    shown = data.setdefault(lab.id, {})
    number = min(int(shown.get(stage_id, 0)) + 1, len(stage.hints))
    shown[stage_id] = number
    _save_hints(data)
    return number, stage.hints[number - 1]
