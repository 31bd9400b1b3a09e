"""Every `lesson:<id>` and `lesson:<id>#<section>` written anywhere in lessons/ and labs/ resolves.

`dojo lint` checks the links its Markdown parser sees in lesson bodies; this reads the raw
text of every lesson, card file, lab README and lab.yaml instead (inline code included), so a
link in a card answer, a lab hint or between backticks cannot point at nothing either.
"""

from __future__ import annotations

import re
from pathlib import Path

from dojo.content import content_root, load_catalog

_LINK = re.compile(r"(?<![\w-])lesson:([a-z0-9][a-z0-9-]*)(?:#([\w-]+))?")
_GLOBS = ("lessons/*/lesson.md", "lessons/*/cards.yaml", "labs/*/README.md", "labs/*/lab.yaml")


def _links(root: Path) -> list[tuple[str, int, str, str | None]]:
    found = []
    for pattern in _GLOBS:
        for path in sorted(root.glob(pattern)):
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                for match in _LINK.finditer(line):
                    found.append((f"{path.relative_to(root)}:{number}", number,
                                  match.group(1), match.group(2)))
    return found


def test_the_content_has_lesson_links_to_check() -> None:
    # Guards the scan itself: if the globs or the pattern broke, the test below would pass empty.
    assert len(_links(content_root())) > 20


def test_every_lesson_link_in_lessons_and_labs_resolves() -> None:
    root = content_root()
    lessons = {lesson.id: lesson for lesson in load_catalog(root).lessons}
    broken = []
    for where, _, lesson_id, section in _links(root):
        lesson = lessons.get(lesson_id)
        if lesson is None:
            broken.append(f"{where}: lesson:{lesson_id} is no lesson")
        elif section is not None and section not in lesson.anchors():
            broken.append(f"{where}: lesson:{lesson_id}#{section} is no heading of that lesson")
    assert not broken, "\n".join(broken)
