"""Where the content lives: the folder holding `lessons/` and `labs/`."""

from __future__ import annotations

import os
from pathlib import Path


def content_root() -> Path:
    """DOJO_CONTENT_ROOT when set; else the checkout this package runs from (app/dojo -> ../..,
    an editable install); else the current directory."""
    override = os.environ.get("DOJO_CONTENT_ROOT")
    if override:
        return Path(override).expanduser().resolve()
    checkout = Path(__file__).resolve().parents[3]
    if (checkout / "lessons").is_dir() or (checkout / "labs").is_dir():
        return checkout
    return Path.cwd()
