"""Tracing: the reference solution."""

from __future__ import annotations


def unique_events(events: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The events with every redelivery (an id seen before) dropped, in delivery order."""
    seen: set[str] = set()
    kept = []
    for event_id, payload in events:
        if event_id in seen:
            continue
        seen.add(event_id)
        kept.append((event_id, payload))
    return kept
