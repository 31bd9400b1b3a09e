"""The app's own preferences (the theme), in a small JSON file beside the progress database.

Read before the first frame, so it cannot go through `dojo.store` (whose package imports
SQLAlchemy, ~0.3 s); `settings_dir()` follows the same rule as `dojo.store.data_dir()` and a
test keeps the two equal.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

SETTINGS_FILE = "tui.json"
DEFAULT_THEME = "textual-dark"


def settings_dir() -> Path:
    """DOJO_DATA_DIR when set, else the user's data dir (as `dojo.store.data_dir()`)."""
    override = os.environ.get("DOJO_DATA_DIR")
    if override:
        return Path(override).expanduser()
    import platformdirs

    return Path(platformdirs.user_data_dir("interview-dojo", appauthor=False))


@dataclass
class UiSettings:
    """What the app remembers between runs."""

    theme: str = DEFAULT_THEME

    @classmethod
    def load(cls, path: Path | None = None) -> UiSettings:
        """The saved settings; defaults when the file is missing or unreadable."""
        path = path or settings_dir() / SETTINGS_FILE
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return cls()
        theme = data.get("theme") if isinstance(data, dict) else None
        return cls(theme=theme if isinstance(theme, str) and theme else DEFAULT_THEME)

    def save(self, path: Path | None = None) -> None:
        """Write atomically (temp file + rename): a kill never leaves half a file."""
        path = path or settings_dir() / SETTINGS_FILE
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tui-")
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                json.dump(asdict(self), handle)
            os.replace(tmp, path)
        except OSError:
            pass  # a read-only data dir costs the preference, never the session
