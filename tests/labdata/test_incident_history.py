"""The incident lab's recorded windows agree with its README in exact arithmetic.

The checks compare a learner's impact() with the scenario's designed onset and endpoint. That
is fair only if the README's rules, computed exactly (fractions, no floats), give the same
answer on every window the checker can draw, and if no minute sits exactly on a threshold,
where floating point and exact arithmetic could disagree ("at least 3 x baseline":
3 * 0.025 = 0.07500000000000001 in floats), decides a verdict. This test recomputes both
over many runs.
"""

from __future__ import annotations

import importlib.util
import math
import sys
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest


def _load_history() -> Any:
    """The lab's _history.py under a name of its own (the checks folder is not a package, and
    its module names must not leak into this process's imports)."""
    path = Path(__file__).resolve().parents[2] / "labs" / "incident" / "checks" / "_history.py"
    spec = importlib.util.spec_from_file_location("incident_checks_history", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it is created
    spec.loader.exec_module(module)
    return module


_history = _load_history()
BASELINE_MINUTES = _history.BASELINE_MINUTES
ENDPOINTS = _history.ENDPOINTS
KINDS = _history.KINDS
build = _history.build
record = _history.record

RUNS = range(1, 61)


def _p95(values: list[float]) -> Fraction:
    ordered = sorted(Fraction(v) for v in values)
    return ordered[math.ceil(Fraction(19, 20) * len(ordered)) - 1]


def _verdicts(rows: list[dict[str, Any]]) -> list[bool]:
    """Each minute bad or not, by the README's rule in exact arithmetic; no minute on a
    threshold, and the float computation agrees."""
    base = rows[:BASELINE_MINUTES]
    base_rate = Fraction(sum(r["errors"] for r in base), sum(r["requests"] for r in base))
    base_p95 = _p95([d for r in base for d in r["durations_ms"]])
    float_rate = sum(r["errors"] for r in base) / sum(r["requests"] for r in base)
    float_p95 = float(base_p95)
    verdicts = []
    for row in rows:
        rate = Fraction(row["errors"], row["requests"])
        floor = max(Fraction(1, 20), 3 * base_rate)
        slow = _p95(row["durations_ms"])
        exact = row["requests"] >= 10 and (rate >= floor or slow >= 3 * base_p95)
        strict = row["requests"] >= 10 and (rate > floor or slow > 3 * base_p95)
        assert exact == strict, f"{row['minute']}: the verdict rests on a tie"
        inexact = row["requests"] >= 10 and (
            row["errors"] / row["requests"] >= max(0.05, 3 * float_rate)
            or float(slow) >= 3 * float_p95)
        assert exact == inexact, f"{row['minute']}: floats and fractions disagree"
        verdicts.append(exact)
    return verdicts


@pytest.mark.parametrize("kind", [*KINDS, None])
def test_the_designed_incident_is_the_readmes_incident(kind: str | None) -> None:
    for run in RUNS:
        scenario = build(kind, run)
        minutes = record(scenario).minutes
        incidents: dict[str, tuple[int, int]] = {}
        for endpoint in ENDPOINTS:
            rows = sorted((r for r in minutes if r["endpoint"] == endpoint),
                          key=lambda r: r["minute"])
            bad = _verdicts(rows)
            start = len(rows)
            while start > 0 and bad[start - 1]:
                start -= 1
            if start < len(rows):
                incidents[endpoint] = (start, sum(r["errors"] for r in rows[start:]))
        if kind is None:
            assert not incidents, f"run {run}: the healthy window has an incident {incidents}"
            continue
        chosen = max(incidents, key=lambda e: incidents[e][1])
        assert chosen == scenario.endpoint, f"run {run}: {incidents}"
        assert incidents[chosen][0] == scenario.onset, f"run {run}: {incidents}"
        if kind == "provider-timeout":
            # a bad minute, then a quiet one (under 10 requests, failing at an incident's
            # rate), then the incident: the quiet minute ends the first run
            rows = sorted((r for r in minutes if r["endpoint"] == scenario.endpoint),
                          key=lambda r: r["minute"])
            bad = _verdicts(rows)
            quiet = rows[scenario.onset - 1]
            assert bad[scenario.onset - 2] and not bad[scenario.onset - 1], f"run {run}"
            assert quiet["requests"] < 10, f"run {run}: {quiet['requests']} requests"
            assert quiet["errors"] / quiet["requests"] > 0.5, f"run {run}: {quiet}"
            # the latency check's baseline: only the nearest rank is within 15 % of itself;
            # the ranks around it, and any interpolation between them, are not
            durations = sorted(d for r in rows[:BASELINE_MINUTES] for d in r["durations_ms"])
            rank = math.ceil(Fraction(19, 20) * len(durations))
            assert len(durations) % 20 == 15, f"run {run}: {len(durations)} requests"
            below, nearest, above = durations[rank - 2], durations[rank - 1], durations[rank]
            assert below <= 342 and 610 <= nearest <= 640 and above >= 1300, (
                f"run {run}: ranks {rank - 1} to {rank + 1}: {below}, {nearest}, {above}")
        if kind == "pricing-flag":
            # the second endpoint: a higher rate, an earlier onset, fewer failures
            assert set(incidents) == {"GET /orders", "POST /orders"}, f"run {run}"
            assert incidents["POST /orders"][0] < incidents["GET /orders"][0]

