"""The labs lessons point at: their stage ids, and whether a lab is on disk.

The catalog is what is in labs/: no table in code lists labs or stages. Availability is
computed, never written in a lesson: a lab is ready when `labs/<lab>/lab.yaml` exists, and
coming otherwise (a lesson naming a lab that is not there fails the linter).
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path

from dojo.content.yaml_lines import YamlSyntaxError, parse_yaml


class LabAvailability(StrEnum):
    """Whether a lab can be started today."""

    READY = "ready"
    COMING = "coming"


def lab_availability(root: Path, lab_id: str) -> LabAvailability:
    """READY when `root/labs/<lab_id>/lab.yaml` exists, else COMING."""
    return (LabAvailability.READY if (root / "labs" / lab_id / "lab.yaml").is_file()
            else LabAvailability.COMING)


def known_labs(root: Path) -> tuple[str, ...]:
    """Every lab folder with a lab.yaml, sorted."""
    labs = root / "labs"
    if not labs.is_dir():
        return ()
    return tuple(sorted(path.name for path in labs.iterdir() if (path / "lab.yaml").is_file()))


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
    """The stages a lesson may name for `lab_id`: its manifest's, empty when it has none."""
    return built_stage_ids(root, lab_id) or ()
