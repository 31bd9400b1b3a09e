"""The learner's progress: FSRS card states and review logs, quiz answers, lesson reads, lab
stage results and the last place, in a SQLite file (`DOJO_DATA_DIR` or the user data dir)."""

from dojo.store.database import SCHEMA_VERSION, StoreError
from dojo.store.paths import data_dir, database_path
from dojo.store.progress import (
    LessonProgress,
    Place,
    ProgressStore,
    StageRecord,
    StoredAnswer,
    StoredReview,
)

__all__ = [
    "SCHEMA_VERSION",
    "LessonProgress",
    "Place",
    "ProgressStore",
    "StageRecord",
    "StoreError",
    "StoredAnswer",
    "StoredReview",
    "data_dir",
    "database_path",
]
