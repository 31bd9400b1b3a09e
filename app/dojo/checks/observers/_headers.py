"""Kafka headers and bytes as a learner should read them in a failure message."""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from typing import Any

from dojo.checks.report import table

# Headers Spring Kafka writes as big-endian binary numbers, and their width in bytes.
SPRING_BINARY_HEADERS: dict[str, int] = {"kafka_dlt-original-partition": 4,
                                         "kafka_dlt-original-offset": 8,
                                         "kafka_dlt-original-timestamp": 8}


def java_int(value: bytes | None, size: int) -> int | None:
    """A Java int (4 bytes) or long (8 bytes), big-endian, as Java clients write them.

    Args:
        value: the bytes.
        size: 4 or 8.

    Returns:
        The number, or None when `value` is None or not exactly `size` bytes.
    """
    if value is None or len(value) != size:
        return None
    return int(struct.unpack(">i" if size == 4 else ">q", value)[0])


def show_header(name: str, value: bytes | None, width: int = 60,
                binary: Mapping[str, int] = SPRING_BINARY_HEADERS) -> str:
    """One header value for a message: a binary number decoded with its bytes shown, text
    decoded (newlines as ⏎), null as `(null)`.

    Args:
        name: the header's name (decides whether it is a binary number, see `binary`).
        value: its bytes.
        width: cut text to this many characters.
        binary: {header name: byte width} of the headers that hold big-endian numbers.

    Returns:
        The text.
    """
    if value is None:
        return "(null)"
    size = binary.get(name)
    if size is not None:
        decoded = java_int(value, size)
        hexed = value.hex(" ")
        if decoded is not None:
            return f"{decoded}  (bytes {hexed})"
        return f"{value!r} — {len(value)} bytes, not a {size}-byte big-endian number"
    text = value.decode("utf-8", "replace").replace("\n", "⏎")
    return text if len(text) <= width else text[:width - 1] + "…"


def show_bytes(value: bytes | None, width: int = 70) -> str:
    """Bytes as their repr, cut to `width` characters; None as `null`."""
    if value is None:
        return "null"
    shown = repr(value)
    return shown if len(shown) <= width else shown[:width - 1] + "…"


def headers_table(headers: Sequence[tuple[str, bytes | None]], names: Sequence[str] = (),
                  binary: Mapping[str, int] = SPRING_BINARY_HEADERS) -> str:
    """A record's headers as a table of name and value (see `show_header`).

    Args:
        headers: the record's headers, as confluent-kafka gives them.
        names: show these, in this order, `MISSING` where absent (default: all, in order).
        binary: see `show_header`.

    Returns:
        The table as text.
    """
    present: dict[str, bytes | None] = {}
    for key, value in headers:
        present[key] = value
    shown = list(names) or list(present)
    found: list[tuple[Any, ...]] = [
        (name, show_header(name, present[name], binary=binary) if name in present
         else "MISSING") for name in shown]
    return table(found, ("header", "value"), limit=40, empty="(no headers)")
