"""A process that writes to a progress store as fast as it can until it is killed.

Run by test_kill_safety: `python writer_process.py DB ROUND`. After each committed write it
prints the write's sequence number, so the parent knows which writes must survive.
"""

from __future__ import annotations

import sys
from datetime import UTC, datetime
from itertools import count
from pathlib import Path

import fsrs

from dojo.store import ProgressStore


def main() -> None:
    path, round_no = Path(sys.argv[1]), int(sys.argv[2])
    scheduler = fsrs.Scheduler(enable_fuzzing=False)
    with ProgressStore(path) as store:
        for seq in count():
            card_id = f"card-{seq % 3}"
            card = store.card_state(card_id) or fsrs.Card(card_id=seq % 3 + 1)
            card, log = scheduler.review_card(card, fsrs.Rating.Good, datetime.now(UTC))
            store.record_review(card_id, card, log)
            store.record_answer(card_id, f"{round_no}:{seq}", coverage=0.5, raw_coverage=0.5,
                                matched_ids=["a", "b"], keyword_list=False)
            print(f"{round_no}:{seq}", flush=True)


if __name__ == "__main__":
    main()
