"""The command palette (Ctrl+P): the actions of the screen it was opened on, with their keys,
then the main actions, and every lesson and lab by name."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from textual.binding import Binding
from textual.command import DiscoveryHit, Hit, Hits, Provider
from textual.content import Content
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

# Global commands a screen may also bind: on that screen its own entry (with the key) is shown.
SCREEN_ACTIONS = {"Continue where you left off": "continue", "Drill: due and new cards":
                  "app.drill", "Progress": "progress", "Start services": "services_up"}
Command = tuple[str, str, Callable[[], None], str]  # name, help, callback, key ("" if none)


class DojoCommands(Provider):
    """Commands that run the current screen's actions or post the same navigation messages
    the screens post."""

    def _screen_commands(self) -> list[Command]:
        """Every key the current screen declares, as a command named by what it does."""
        from dojo.tui.screens._help import _bindings, section_for

        screen = self.screen
        found = section_for(type(screen))
        if found is None:
            return []
        title, owners = found
        commands: list[Command] = []
        seen: set[str] = set()
        for binding in _bindings(owners[0]):
            if binding.action in seen or not binding.description:
                continue
            seen.add(binding.action)
            key = " ".join(self.app.get_key_display(Binding(part.strip(), ""))
                           for part in binding.key.split(",")[:1])

            def run(action: str = binding.action) -> None:
                self.app.call_later(self.app.run_action, action, screen)

            commands.append((f"{title}: {binding.description}", binding.tooltip, run,
                             binding.key_display or key))
        return commands

    def _commands(self) -> list[Command]:
        app: DojoApp = self.app  # type: ignore[assignment]
        session = app.session
        own = self._screen_commands()
        bound = {binding.action for binding in getattr(type(self.screen), "BINDINGS", ())
                 if isinstance(binding, Binding)}

        def post(message: Message) -> Callable[[], None]:
            def send() -> None:
                app.post_message(message)

            return send

        general: list[Command] = [
            ("Continue where you left off", "the lesson, lab or drill you were last in",
             post(ContinueLast()), ""),
            ("Drill: due and new cards", "five cards against the 60-second clock",
             app.action_drill, ""),
            ("Mock interview: 3 questions", "each with a follow-up, then a report",
             post(StartMock(3)), ""),
            ("Mock interview: 5 questions", "each with a follow-up, then a report",
             post(StartMock(5)), ""),
            ("Progress", "mastery per lesson, lab stages, review history",
             post(OpenProgress()), ""),
            ("Start services", "PostgreSQL and Kafka for the labs", post(StartServices()), ""),
            ("Toggle light / dark theme", "remembered for next time", app.action_toggle_theme,
             "ctrl+t"),
            ("Keys", "the keys of this screen", app.action_help, "?"),
        ]
        commands = own + [command for command in general
                          if SCREEN_ACTIONS.get(command[0]) not in bound]
        if session.loaded:
            from dojo.tui.overview import load_labs

            for lesson in session.catalog.lessons:
                commands.append((f"Open lesson: {lesson.title}", lesson.question,
                                 post(OpenLesson(lesson.id)), ""))
                if lesson.cards:
                    commands.append((f"Drill lesson: {lesson.title}",
                                     f"its {len(lesson.cards)} cards",
                                     post(StartDrill(tuple(c.id for c in lesson.cards),
                                                     f"Drill: {lesson.title}")), ""))
            for lab_id, lab in load_labs(session).items():
                if not isinstance(lab, str):
                    commands.append((f"Open lab: {lab_id}", lab.title, post(OpenLab(lab_id)),
                                     ""))
        return commands

    @staticmethod
    def _shown(name: Content | str, key: str) -> Content:
        """The command's name with its key after it, dimmed (`Lab: Watch  w`)."""
        text = name if isinstance(name, Content) else Content(name)
        return Content.assemble(text, ("  " + key, "$text-muted")) if key else text

    async def discover(self) -> Hits:
        commands = self._commands()
        own = len(self._screen_commands())
        for name, help_text, callback, key in commands[:max(8, own + 4)]:
            yield DiscoveryHit(self._shown(name, key), callback, text=name, help=help_text)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for name, help_text, callback, key in self._commands():
            score = matcher.match(name)
            if score > 0:
                yield Hit(score, self._shown(matcher.highlight(name), key), callback, text=name,
                          help=help_text)
