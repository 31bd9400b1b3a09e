"""The command palette (Ctrl+P): the main actions, and every lesson and lab by name."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from textual.command import DiscoveryHit, Hit, Hits, Provider
from textual.message import Message

from dojo.tui.navigation import (
    ContinueLast,
    OpenLab,
    OpenLesson,
    OpenProgress,
    StartDrill,
    StartMock,
    StartServices,
)

if TYPE_CHECKING:
    from dojo.tui.app import DojoApp

class DojoCommands(Provider):
    """Commands that post the same navigation messages the screens post."""

    def _commands(self) -> list[tuple[str, str, Callable[[], None]]]:
        app: DojoApp = self.app  # type: ignore[assignment]
        session = app.session

        def post(message: Message) -> Callable[[], None]:
            def send() -> None:
                app.post_message(message)

            return send

        commands: list[tuple[str, str, Callable[[], None]]] = [
            ("Continue where you left off", "the lesson, lab or drill you were last in",
             post(ContinueLast())),
            ("Drill: due and new cards", "five cards against the 60-second clock",
             app.action_drill),
            ("Mock interview: 3 questions", "each with a follow-up, then a report",
             post(StartMock(3))),
            ("Mock interview: 5 questions", "each with a follow-up, then a report",
             post(StartMock(5))),
            ("Progress", "mastery per lesson, lab stages, review history",
             post(OpenProgress())),
            ("Start services", "PostgreSQL and Kafka for the labs", post(StartServices())),
            ("Toggle light / dark theme", "remembered for next time", app.action_toggle_theme),
            ("Keys", "every key on every screen", app.action_help),
        ]
        if session.loaded:
            from dojo.tui.overview import load_labs

            for lesson in session.catalog.lessons:
                commands.append((f"Open lesson: {lesson.title}", lesson.question,
                                 post(OpenLesson(lesson.id))))
                if lesson.cards:
                    commands.append((f"Drill lesson: {lesson.title}",
                                     f"its {len(lesson.cards)} cards",
                                     post(StartDrill(tuple(c.id for c in lesson.cards),
                                                     f"Drill: {lesson.title}"))))
            for lab_id, lab in load_labs(session).items():
                if not isinstance(lab, str):
                    commands.append((f"Open lab: {lab_id}", lab.title, post(OpenLab(lab_id))))
        return commands

    async def discover(self) -> Hits:
        for name, help_text, callback in self._commands()[:8]:
            yield DiscoveryHit(name, callback, help=help_text)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for name, help_text, callback in self._commands():
            score = matcher.match(name)
            if score > 0:
                yield Hit(score, matcher.highlight(name), callback, help=help_text)
