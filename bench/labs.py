"""Lab benchmark: how long each lab's reference solution takes to pass its full check run.

    python bench/labs.py [LAB ...] [--runs 1]

Runs `dojo lab check LAB --solution --json` on the services this shell points at (the same
ones a learner's `dojo lab check` uses: embedded PostgreSQL and Tansu unless DOJO_DATABASE_URL
/ DOJO_KAFKA_BOOTSTRAP say otherwise; start them first with `dojo services up`, so their start
is not counted). Prints, per lab, the wall time of the run (median over --runs), the seconds
spent in each stage's checks, and the target; then the load average, because on a shared
2-core machine a loaded run is slower. Asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections import defaultdict

from startup import dojo_command  # bench/ is on sys.path when run as a script

# Seconds for the solution's full run on embedded services (issues 12, 15, 16, 17).
TARGETS = {"outbox": 30.0, "money": 60.0, "dlq": 60.0, "tracing": 45.0, "incident": 60.0,
           "container": 45.0}


def labs_on_disk() -> list[str]:
    listing = subprocess.run([*dojo_command(), "lab", "list", "--json"], capture_output=True,
                             text=True, check=True)
    return [lab["id"] for lab in json.loads(listing.stdout)]


def one_run(lab: str) -> tuple[float, dict[str, float], dict[str, int]]:
    """(wall seconds, seconds per stage, count per status) of one solution run."""
    started = time.monotonic()
    proc = subprocess.run([*dojo_command(), "lab", "check", lab, "--solution", "--json"],
                          capture_output=True, text=True, check=False)
    wall = time.monotonic() - started
    per_stage: dict[str, float] = defaultdict(float)
    statuses: dict[str, int] = defaultdict(int)
    for line in proc.stdout.splitlines():
        if not line.startswith("{"):
            continue
        result = json.loads(line)
        if result.get("event") not in (None, "result"):
            continue
        per_stage[result["stage"]] += float(result.get("duration", 0.0))
        statuses[result["status"]] += 1
    if not statuses:
        print(f"  {lab}: no results (exit {proc.returncode}): {proc.stderr.strip()[-400:]}",
              file=sys.stderr)
    return wall, dict(per_stage), dict(statuses)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("labs", nargs="*", help="default: every lab")
    parser.add_argument("--runs", type=int, default=1)
    args = parser.parse_args()
    labs = args.labs or labs_on_disk()
    load_before = os.getloadavg()[0]
    print(f"{'lab':<11} {'wall s':>7} {'target':>7} {'ratio':>6}  statuses; seconds per stage")
    for lab in labs:
        runs = [one_run(lab) for _ in range(args.runs)]
        wall = statistics.median(run[0] for run in runs)
        per_stage, statuses = runs[-1][1], runs[-1][2]
        target = TARGETS.get(lab)
        ratio = f"{wall / target:5.2f}" if target else "  -  "
        target_text = f"{target:7.0f}" if target else "      -"
        counts = " ".join(f"{status}={count}" for status, count in sorted(statuses.items()))
        stages = ", ".join(f"{stage} {seconds:.1f}" for stage, seconds in per_stage.items())
        print(f"{lab:<11} {wall:7.1f} {target_text} {ratio}  {counts}; {stages}", flush=True)
    print(f"load average (1 min): {load_before:.1f} before, {os.getloadavg()[0]:.1f} after, "
          f"on {os.cpu_count()} cores; ratio > 1 is over target")
    return 0


if __name__ == "__main__":
    sys.exit(main())
