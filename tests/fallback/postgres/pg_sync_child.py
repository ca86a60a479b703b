"""A syncing process for the kill -9 test: takes the sync lease, writes one file (committed),
says so on stdout, then waits on stdin until it is killed."""

from __future__ import annotations

import sys

from fallback.store.postgres.store import ChunkRow, PostgresStore
from fallback.store.postgres.target import resolve_target


def main() -> None:
    store = PostgresStore(resolve_target(sys.argv[1]), agent_id="main", workspace="/ws")
    lease = store.sync_lease(wait_ms=10_000)
    assert lease is not None
    lease.write_file("memory/new.md", "memory", content_hash="new-hash", mtime_ms=2, size=2,
                     title="memory/new.md", chunks=[ChunkRow("new-1", 1, 1, "n1", "", "zebra crossing", "")])
    lease.flush()  # committed
    print("written", flush=True)
    sys.stdin.read()


if __name__ == "__main__":
    main()
