"""Observers: what a check looks at while learner code runs, always from the outside.

PostgreSQL:
- `record_sql(engine)`: every statement by worker thread and backend pid, with row counts,
  what it read back, its errors and (optionally) its transaction id; `count_queries`,
  `query_summary` for statement counts.
- `sessions(engine, tables)`, `open_transactions`, `blocked`, `lock_holders`: other sessions,
  their open transactions (idle in transaction, xact_start, backend_xid/xmin), who holds
  which lock and who waits (pg_locks, pg_blocking_pids); `row_locks` with pgrowlocks
  (`ensure_pgrowlocks` first).
- `snapshot(engine, table, columns)`: a table's rows, timestamps as text, for `table(...)`.

Kafka:
- `read_topic(kafka, topic)`: every record, complete on any broker (fence records), or
  without fences for topics code under test still reads; `Record`.
- `committed_offsets`, `CommitProbe`: a group's committed offsets, once or watched.
- `ConsumerTap`, `ProducerTap`: proxies around the clients learner code gets, recording
  deliveries, commits, pauses, produce calls and acknowledgements (and able to hold acks back
  or SIGKILL at a commit or an ack).
- `show_header`, `headers_table`, `show_bytes`, `java_int`: headers as a learner reads them.
"""

from dojo.checks.observers._headers import (
    SPRING_BINARY_HEADERS,
    headers_table,
    java_int,
    show_bytes,
    show_header,
)
from dojo.checks.observers._rows import snapshot
from dojo.checks.observers._sessions import (
    SESSION_COLUMNS,
    blocked,
    ensure_pgrowlocks,
    lock_holders,
    open_transactions,
    row_locks,
    sessions,
)
from dojo.checks.observers._sql import (
    Statement,
    StatementLog,
    count_queries,
    query_summary,
    record_sql,
)
from dojo.checks.observers._taps import (
    Commit,
    ConsumerTap,
    Delivery,
    Produced,
    ProducerTap,
    die,
    jsonl_log,
    read_jsonl,
)
from dojo.checks.observers._topics import (
    FENCE_HEADER,
    CommitProbe,
    Record,
    by_partition,
    committed_offsets,
    offsets_text,
    partition_count,
    read_topic,
)

__all__ = [
    "FENCE_HEADER",
    "SESSION_COLUMNS",
    "SPRING_BINARY_HEADERS",
    "Commit",
    "CommitProbe",
    "ConsumerTap",
    "Delivery",
    "Produced",
    "ProducerTap",
    "Record",
    "Statement",
    "StatementLog",
    "blocked",
    "by_partition",
    "committed_offsets",
    "count_queries",
    "die",
    "ensure_pgrowlocks",
    "headers_table",
    "java_int",
    "jsonl_log",
    "lock_holders",
    "offsets_text",
    "open_transactions",
    "partition_count",
    "query_summary",
    "read_jsonl",
    "read_topic",
    "record_sql",
    "row_locks",
    "sessions",
    "show_bytes",
    "show_header",
    "snapshot",
]
