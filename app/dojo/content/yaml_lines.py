"""YAML parsing that remembers where every key and list item came from.

PyYAML's `safe_load` throws the positions away, so problems could only name the file. Here the
document is composed into nodes first (each node keeps its `start_mark`), then constructed, and
the line of every mapping key and sequence item is recorded under its path, e.g.
`("cards", 3, "key_points", 0, "patterns", 1)`. Syntax errors become a `Problem` at the line
PyYAML reports, so malformed files never crash a loader.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

YamlPath = tuple[str | int, ...]

# libyaml's parser keeps the same marks and is ~10x faster (the catalog loads at app start).
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@dataclass(frozen=True)
class YamlDoc:
    """Parsed YAML data plus the 1-based file line of every key and item inside it."""

    path: Path
    data: Any
    lines: dict[YamlPath, int] = field(default_factory=dict)
    duplicate_keys: tuple[tuple[YamlPath, int], ...] = ()

    def line(self, *keys: str | int) -> int:
        """The line of `keys`, else of the nearest parent that has one, else the first line."""
        path: YamlPath = tuple(keys)
        while path and path not in self.lines:
            path = path[:-1]
        return self.lines.get(path, self.lines.get((), 1))


class YamlSyntaxError(ValueError):
    """A YAML document that does not parse, with the file line of the error."""

    def __init__(self, path: Path, line: int, message: str) -> None:
        super().__init__(f"{path}:{line}: {message}")
        self.path = path
        self.line = line
        self.message = message


def parse_yaml(text: str, path: Path, first_line: int = 1) -> YamlDoc:
    """Parse one YAML document from `text`, whose first line is line `first_line` of `path`.

    Raises:
        YamlSyntaxError: the text is not valid YAML (or holds more than one document).
    """
    offset = first_line - 1
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = (mark.line + 1 if mark else 1) + offset
        what = exc.problem or exc.context or "cannot parse"
        raise YamlSyntaxError(path, line, f"invalid YAML: {what}") from exc
    except yaml.YAMLError as exc:
        raise YamlSyntaxError(path, first_line, f"invalid YAML: {exc}") from exc
    finally:
        loader.dispose()
    lines: dict[YamlPath, int] = {}
    duplicates: list[tuple[YamlPath, int]] = []
    if node is not None:
        _record_lines(node, (), lines, duplicates, offset)
    return YamlDoc(path, data, lines, tuple(duplicates))


def _record_lines(node: yaml.Node, path: YamlPath, lines: dict[YamlPath, int],
                  duplicates: list[tuple[YamlPath, int]], offset: int) -> None:
    lines.setdefault(path, node.start_mark.line + 1 + offset)
    if isinstance(node, yaml.MappingNode):
        seen: set[str] = set()
        for key_node, value_node in node.value:
            key = str(key_node.value) if isinstance(key_node, yaml.ScalarNode) else str(key_node)
            key_line = key_node.start_mark.line + 1 + offset
            if key in seen:
                # safe_load silently keeps the last one; a writer almost never means that.
                duplicates.append(((*path, key), key_line))
            seen.add(key)
            lines[(*path, key)] = key_line
            _record_lines(value_node, (*path, key), lines, duplicates, offset)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            _record_lines(item, (*path, index), lines, duplicates, offset)
