"""Readable documents as lines: lessons and lab instructions rendered once per width.

A document is a list of blocks (a title, headings, Markdown prose, fenced code and diagrams,
highlighted callouts). `render_document` turns them into lines of segments with Rich, in a
worker thread, and notes where each Markdown link landed (`RenderedDocument.links`: the
lesson cross-references a reader can follow). A 1000-line lesson renders in ~0.15 s
(Textual's Markdown widget needs ~1 s and thousands of widgets for the same page). Prose
wraps to the width; fenced blocks keep their natural width and never wrap, so a diagram
reads as drawn and scrolls sideways when the terminal is narrower than it.
"""

from __future__ import annotations

import io
import re
from dataclasses import dataclass, field

from rich.cells import cell_len
from rich.console import Console, RenderableType
from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from rich.theme import Theme
from textual.strip import Strip


@dataclass(frozen=True)
class Title:
    """The document's title, with lines under it (the interview question, what it links to)."""

    title: str
    lines: tuple[str, ...] = ()


@dataclass(frozen=True)
class Heading:
    """An H2 (level 2) or H3 (level 3) heading; `slug` makes it a place the TOC can go to."""

    title: str
    level: int = 2
    slug: str = ""


@dataclass(frozen=True)
class Prose:
    """Markdown without fences: paragraphs, lists, tables, quotes."""

    markdown: str


@dataclass(frozen=True)
class Fence:
    """A fenced block: `diagram` is drawn as is, other infos are syntax-highlighted."""

    code: str
    info: str = ""


@dataclass(frozen=True)
class Callout:
    """A highlighted box: the 60-second answer, what a stage proves, a hint."""

    title: str
    markdown: str
    subtitle: str = ""
    kind: str = "answer"  # answer | note | hint
    slug: str = ""


Block = Title | Heading | Prose | Fence | Callout

_FENCE = re.compile(r"^(?P<marks>```+|~~~+)\s*(?P<info>[\w+-]*)")


def split_fences(markdown: str) -> list[Block]:
    """Prose and fenced blocks in order; a fence is recognised at the start of a line."""
    blocks: list[Block] = []
    prose: list[str] = []
    code: list[str] = []
    fence: re.Match[str] | None = None
    for line in markdown.splitlines():
        if fence is None:
            opened = _FENCE.match(line)
            if opened:
                if "".join(prose).strip():
                    blocks.append(Prose("\n".join(prose).strip("\n")))
                prose, code, fence = [], [], opened
            else:
                prose.append(line)
        elif line.strip().startswith(fence["marks"]) and not line.strip().strip(fence["marks"][0]):
            blocks.append(Fence("\n".join(code), fence["info"]))
            fence = None
        else:
            code.append(line)
    if fence is not None:  # an unclosed fence: show what there is
        blocks.append(Fence("\n".join(code), fence["info"]))
    elif "".join(prose).strip():
        blocks.append(Prose("\n".join(prose).strip("\n")))
    return blocks


@dataclass(frozen=True)
class Palette:
    """The colours of the app theme, as Rich colours (hex, no alpha)."""

    text: str
    muted: str
    primary: str
    accent: str
    warning: str
    success: str
    error: str
    code_background: str
    callout_background: str
    dark: bool = True

    @classmethod
    def from_variables(cls, variables: dict[str, str], dark: bool) -> Palette:
        """Build from Textual's CSS variables (`App.get_css_variables()`)."""
        from textual.color import Color

        background = Color.parse(variables.get("background", "#121212"))

        def solid(name: str, fallback: str) -> str:
            try:
                color = Color.parse(variables.get(name, fallback))
            except Exception:
                color = Color.parse(fallback)
            if color.a < 1:
                color = background + color
            return color.hex6

        return cls(
            text=solid("foreground", "#e0e0e0"),
            muted=solid("foreground-muted", "#a0a0a0"),
            primary=solid("text-primary", "#57a5e2"),
            accent=solid("text-accent", "#ffc473"),
            warning=solid("text-warning", "#ffc473"),
            success=solid("text-success", "#8ad4a1"),
            error=solid("text-error", "#d17e92"),
            code_background=solid("surface", "#1e1e1e"),
            callout_background=solid("panel", "#242f38"),
            dark=dark,
        )

    @property
    def syntax_theme(self) -> str:
        return "monokai" if self.dark else "friendly"

    def rich_theme(self) -> Theme:
        p = self
        return Theme({
            "markdown.paragraph": "", "markdown.text": "",
            "markdown.em": "italic", "markdown.strong": "bold", "markdown.s": "strike",
            "markdown.code": f"bold {p.accent} on {p.code_background}",
            "markdown.code_block": f"on {p.code_background}",
            "markdown.block_quote": f"italic {p.muted}",
            "markdown.item.bullet": f"bold {p.primary}",
            "markdown.item.number": f"bold {p.primary}",
            "markdown.hr": p.muted,
            "markdown.h1": f"bold {p.primary}", "markdown.h1.border": p.primary,
            "markdown.h2": f"bold {p.primary}", "markdown.h3": f"bold {p.primary}",
            "markdown.h4": f"bold {p.text}", "markdown.h5": "bold", "markdown.h6": "italic",
            # links keep only their text (hyperlinks=True) in link_url's style; the view
            # makes them followable
            "markdown.link": f"underline {p.primary}",
            "markdown.link_url": f"underline {p.primary}",
            "markdown.table.border": p.muted, "markdown.table.header": f"bold {p.text}",
        }, inherit=True)


DARK = Palette("#e0e0e0", "#9e9e9e", "#57a5e2", "#ffc473", "#ffc473", "#8ad4a1", "#d17e92",
               "#1e1e1e", "#242f38", True)


@dataclass
class DocLine:
    """One rendered line: its segments, its plain text (for search), and whether it belongs to
    a fenced block (those scroll sideways; prose never needs to)."""

    strip: Strip
    text: str
    scrolls: bool = False


@dataclass(frozen=True)
class Link:
    """A Markdown link as laid out: its target and where its text is, one span per line it
    covers (`(line, first cell, end cell)`; a link can wrap)."""

    target: str
    spans: tuple[tuple[int, int, int], ...]

    @property
    def line(self) -> int:
        return self.spans[0][0]

    def covers(self, line: int, cell: int) -> bool:
        return any(at == line and start <= cell < end for at, start, end in self.spans)


@dataclass
class RenderedDocument:
    """A document laid out at one width."""

    lines: list[DocLine]
    anchors: dict[str, int] = field(default_factory=dict)  # slug -> line of its heading
    width: int = 0  # the widest line: more than the view when a fence is wider
    links: list[Link] = field(default_factory=list)  # in reading order

    def section_at(self, line: int) -> str:
        """The slug of the last heading at or above `line` ("" before the first)."""
        found = ""
        for slug, at in self.anchors.items():
            if at <= line:
                found = slug
            else:
                break
        return found


def _strip(segments: list[Segment]) -> DocLine:
    strip = Strip(segments)
    return DocLine(strip, "".join(segment.text for segment in segments if not segment.control))


class _Renderer:
    def __init__(self, width: int, palette: Palette) -> None:
        self.width = max(width, 20)
        self.palette = palette
        self.console = Console(file=io.StringIO(), width=self.width, color_system="truecolor",
                               force_terminal=True, legacy_windows=False,
                               theme=palette.rich_theme(), emoji=False, highlight=False)
        self.lines: list[DocLine] = []
        self.anchors: dict[str, int] = {}
        self._links: dict[str, tuple[str, list[tuple[int, int, int]]]] = {}  # by link id

    def blank(self) -> None:
        if self.lines and self.lines[-1].text.strip():
            self.lines.append(DocLine(Strip([]), ""))

    def render(self, renderable: RenderableType, width: int | None = None,
               scrolls: bool = False) -> None:
        options = self.console.options.update(width=width or self.width)
        rendered = self.console.render_lines(renderable, options, pad=False)
        while rendered and not "".join(s.text for s in rendered[-1]).strip():
            rendered.pop()
        start = 0
        while start < len(rendered) and not "".join(s.text for s in rendered[start]).strip():
            start += 1
        for segments in rendered[start:]:
            line = _strip(self._take_links(segments, len(self.lines)))
            line.scrolls = scrolls
            self.lines.append(line)

    def _take_links(self, segments: list[Segment], line: int) -> list[Segment]:
        """Note where each link's text is on this line and drop the link from its style (the
        terminal must not open `lesson:…` itself; the view follows it)."""
        out: list[Segment] = []
        cell = 0
        for segment in segments:
            width = 0 if segment.control else cell_len(segment.text)
            style = segment.style
            if style is not None and style.link:
                target, spans = self._links.setdefault(style.link_id or style.link,
                                                       (style.link, []))
                if spans and spans[-1][0] == line and spans[-1][2] == cell:
                    spans[-1] = (line, spans[-1][1], cell + width)
                else:
                    spans.append((line, cell, cell + width))
                segment = Segment(segment.text, style.update_link(None), segment.control)
            out.append(segment)
            cell += width
        return out

    def links(self) -> list[Link]:
        found = [Link(target, tuple(spans)) for target, spans in self._links.values() if spans]
        return sorted(found, key=lambda link: link.spans[0][:2])

    def title(self, block: Title) -> None:
        p = self.palette
        self.render(Text(block.title, style=f"bold {p.primary}"))
        for extra in block.lines:
            self.render(Text.from_markup(extra, style=p.text))

    def heading(self, block: Heading) -> None:
        p = self.palette
        self.blank()
        if block.slug:
            self.anchors[block.slug] = len(self.lines)
        if block.level <= 2:
            text = Text(f"━━ {block.title} ", style=f"bold {p.primary}")
            text.append("━" * max(0, self.width - cell_len(text.plain)), style=p.primary)
        else:
            text = Text("▍", style=p.accent)
            text.append(block.title, style=f"bold {p.text}")
        self.render(text)

    def prose(self, block: Prose) -> None:
        from rich.markdown import Markdown

        self.blank()
        self.render(Markdown(block.markdown, code_theme=self.palette.syntax_theme,
                             hyperlinks=True))

    def fence(self, block: Fence) -> None:
        p = self.palette
        self.blank()
        code = block.code.expandtabs(4).rstrip("\n")
        natural = max((cell_len(line) for line in code.splitlines()), default=0)
        if block.info in ("diagram", "", "text"):
            style = Style.parse(f"{p.text} on {p.code_background}")
            for line in code.splitlines() or [""]:
                # one cell of margin on the left only: a 76-column diagram fits in 80
                padded = " " + line + " " * (natural - cell_len(line))
                self.lines.append(DocLine(Strip([Segment(padded, style)]), padded, True))
            return
        from rich.syntax import Syntax

        syntax = Syntax(code, block.info, theme=p.syntax_theme, word_wrap=False,
                        background_color=p.code_background, padding=(0, 1))
        self.render(syntax, width=natural + 2, scrolls=True)

    def callout(self, block: Callout) -> None:
        from rich import box
        from rich.markdown import Markdown
        from rich.panel import Panel

        p = self.palette
        colour = {"answer": p.accent, "hint": p.success}.get(block.kind, p.primary)
        self.blank()
        if block.slug:
            self.anchors[block.slug] = len(self.lines)
        panel = Panel(Markdown(block.markdown, hyperlinks=True),
                      title=Text(f" {block.title} ", style=f"bold {colour}"),
                      title_align="left",
                      subtitle=Text(f" {block.subtitle} ", style=p.muted) if block.subtitle
                      else None,
                      subtitle_align="right", border_style=colour, box=box.ROUNDED,
                      padding=(0, 1), style=f"on {p.callout_background}")
        self.render(panel)


def render_document(blocks: list[Block], width: int, palette: Palette = DARK
                    ) -> RenderedDocument:
    """Lay out `blocks` at `width` cells (pure: safe to call from a worker thread)."""
    renderer = _Renderer(width, palette)
    for block in blocks:
        if isinstance(block, Title):
            renderer.title(block)
        elif isinstance(block, Heading):
            renderer.heading(block)
        elif isinstance(block, Prose):
            renderer.prose(block)
        elif isinstance(block, Fence):
            renderer.fence(block)
        else:
            renderer.callout(block)
    widest = max((line.strip.cell_length for line in renderer.lines), default=0)
    return RenderedDocument(renderer.lines, renderer.anchors, max(widest, renderer.width),
                            renderer.links())
