"""The labs lessons point at: the planned stage ids, and whether a lab is built yet.

Availability is computed, never written in a lesson: a lab is ready when
`labs/<lab>/lab.yaml` exists, and coming otherwise (docs/content-format.md).
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path

from dojo.content.yaml_lines import YamlSyntaxError, parse_yaml

# The planned table of docs/content-format.md; tests/content check the two stay equal.
PLANNED_LAB_STAGES: dict[str, tuple[str, ...]] = {
    "outbox": ("schema", "atomic-write", "claim", "publish", "crash-safety", "backoff",
               "idempotent-consumer", "cleanup", "measure"),
    "dlq": ("classify", "dead-letter-record", "nothing-lost", "keep-flowing",
            "idempotent-effect", "system-wide-failure", "visibility", "replay", "order-per-key"),
    "money": ("schema", "deposit-withdraw", "idempotency", "transfer", "exchange",
              "reconciliation", "circuit-breaker", "lost-updates", "n-plus-one"),
}


class LabAvailability(StrEnum):
    """Whether a lab can be started today."""

    READY = "ready"
    COMING = "coming"


def lab_availability(root: Path, lab_id: str) -> LabAvailability:
    """READY when `root/labs/<lab_id>/lab.yaml` exists, else COMING."""
    return (LabAvailability.READY if (root / "labs" / lab_id / "lab.yaml").is_file()
            else LabAvailability.COMING)


def known_labs(root: Path) -> tuple[str, ...]:
    """The planned labs plus any lab folder with a lab.yaml, sorted."""
    built = set()
    labs = root / "labs"
    if labs.is_dir():
        built = {path.name for path in labs.iterdir() if (path / "lab.yaml").is_file()}
    return tuple(sorted(set(PLANNED_LAB_STAGES) | built))


def built_stage_ids(root: Path, lab_id: str) -> tuple[str, ...] | None:
    """The stage ids in `labs/<lab_id>/lab.yaml`, in order; None when the lab is not built or
    its manifest cannot be read (the lab linter reports why)."""
    path = root / "labs" / lab_id / "lab.yaml"
    try:
        doc = parse_yaml(path.read_text(encoding="utf-8"), path)
    except (OSError, UnicodeDecodeError, YamlSyntaxError):
        return None
    stages = doc.data.get("stages") if isinstance(doc.data, dict) else None
    if not isinstance(stages, list):
        return None
    return tuple(str(stage["id"]) for stage in stages
                 if isinstance(stage, dict) and isinstance(stage.get("id"), str))


def stage_ids(root: Path, lab_id: str) -> tuple[str, ...]:
    """The stages a lesson may name for `lab_id`: the built manifest's when the lab exists,
    else the planned ones (empty for a lab nobody planned)."""
    built = built_stage_ids(root, lab_id)
    return built if built is not None else PLANNED_LAB_STAGES.get(lab_id, ())
