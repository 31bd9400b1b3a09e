"""Stable integer ids derived from card ids, for FSRS cards and Anki notes, decks, models."""

from __future__ import annotations

import hashlib

ANKI_LOW, ANKI_HIGH = 1 << 30, 1 << 31  # the range genanki recommends for model and deck ids


def stable_id(key: str, low: int = ANKI_LOW, high: int = ANKI_HIGH) -> int:
    """An integer in [low, high) that depends only on `key`: the same on every machine and
    every run, so exported decks update in place instead of duplicating."""
    digest = int.from_bytes(hashlib.sha256(key.encode("utf-8")).digest()[:8], "big")
    return low + digest % (high - low)
