"""`TableOfContents`: a lesson's H2 sections and H3 subsections as a tree."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from textual.binding import Binding, BindingType
from textual.events import Resize
from textual.message import Message
from textual.widgets import Tree
from textual.widgets.tree import TreeNode

if TYPE_CHECKING:
    from dojo.content import Lesson


class TableOfContents(Tree[str]):
    """Enter on an entry posts `TableOfContents.Selected` with its slug; `mark(slug)` moves
    the cursor to follow the reader without posting anything."""

    DEFAULT_CSS = """
    TableOfContents {
        width: 30;
        height: 1fr;
        padding: 0 1 0 0;
        border-right: vkey $foreground 20%;
        background: $surface;
        scrollbar-size-vertical: 1;
        overflow-x: hidden;
    }
    """

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("j", "cursor_down", "Down", show=False),
        Binding("k", "cursor_up", "Up", show=False),
        Binding("g,home", "first", "First section", show=False),
        Binding("G,end", "last", "Last section", show=False),
    ]

    @dataclass
    class Selected(Message):
        toc: TableOfContents
        slug: str

        @property
        def control(self) -> TableOfContents:
            return self.toc

    def __init__(self, lesson: Lesson, *, id: str | None = None) -> None:
        super().__init__("Contents", id=id)
        self.show_root = False
        self.auto_expand = False
        self.guide_depth = 2
        self._entries: dict[str, TreeNode[str]] = {}
        self._titles: dict[str, str] = {}  # slug -> the whole title (labels may be cut)
        self._fitted = 0
        for section in lesson.sections:
            self._titles[section.slug] = section.title
            self._titles.update({sub.slug: sub.title for sub in section.subsections})
            if section.subsections:
                node = self.root.add(section.title, data=section.slug, expand=True)
                for sub in section.subsections:
                    self._entries[sub.slug] = node.add_leaf(sub.title, data=sub.slug)
            else:
                node = self.root.add_leaf(section.title, data=section.slug)
            self._entries[section.slug] = node

    def mark(self, slug: str) -> None:
        """Put the cursor on the entry for `slug` (the section being read)."""
        node = self._entries.get(slug)
        if node is None:
            if self.cursor_node is None:
                self.move_cursor_to_line(0)
        elif self.cursor_node is not node:
            self.move_cursor(node, animate=False)

    def on_resize(self, event: Resize) -> None:
        """Titles longer than the column end in an ellipsis instead of being cut mid-word."""
        room = self.scrollable_content_region.width - 2  # the ▼ / ├ in front of a title
        if room == self._fitted or room <= 4:
            return
        self._fitted = room
        for slug, node in self._entries.items():
            title = self._titles[slug]
            node.set_label(title if len(title) <= room else title[:room - 1] + "…")

    def action_first(self) -> None:
        self.move_cursor_to_line(0, animate=False)

    def action_last(self) -> None:
        self.move_cursor_to_line(self.last_line, animate=False)

    def on_tree_node_selected(self, event: Tree.NodeSelected[str]) -> None:
        event.stop()
        if event.node.data:
            self.post_message(self.Selected(self, event.node.data))
