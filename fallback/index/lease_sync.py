"""Index sync into a store that writes through a sync lease (the postgres store).

One :func:`sync_through_lease` takes the store's lease (one sync of an agent's workspace at a
time across hosts), reads every discovered file (memory files, and transcripts when the
``sessions`` source is on), chunks a file whose content hash differs from what the lease's
generation holds exactly as the SQLite sync does (:func:`~fallback.index.indexer.file_chunks`),
writes the changed files in batches, leaves out the files no longer discovered, and publishes:
readers see the whole sync at once, or nothing of it. Keyword rows only: chunks are written
without vectors.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fallback.index.identity import FTS_ONLY_MODEL
from fallback.index.indexer import file_chunks, read_notes
from fallback.index.report import SyncReport
from fallback.settings import EngineSettings
from fallback.skipped import SkippedFile
from fallback.sources.file_text import VANISHED, list_session_files, read_memory_text, read_session_text
from fallback.sources.memory_files import MemoryFile, list_memory_files
from fallback.store.errors import IndexStoreLockedError
from fallback.store.fts_rows import note_title
from fallback.text.terms import derived_terms

if TYPE_CHECKING:
    from fallback.store.postgres.seam import PostgresSearchStore
    from fallback.store.postgres.store import FileRows

__all__ = ["LEASE_WAIT_MS", "WRITE_BATCH_FILES", "sync_through_lease"]

# How long a sync waits for another host's sync of the same agent and workspace, ms.
LEASE_WAIT_MS = 30_000
# Files written per transaction (the store writes a batch in a fixed number of statements).
WRITE_BATCH_FILES = 100


def sync_through_lease(settings: EngineSettings, store: PostgresSearchStore, *, force: bool = False,
                       wait_ms: int = LEASE_WAIT_MS) -> SyncReport:
    """Bring the store's index of ``settings``' workspace up to date (blocking).

    Args:
        settings: the engine settings (workspace, extra paths, sources, chunking).
        store: the open store.
        force: rewrite every file, whatever the lease's generation holds (a full reindex,
            published at once like any sync).
        wait_ms: longest wait for another sync's lease, ms.

    Returns:
        The :class:`SyncReport` (``files_read`` counts every file read: the lease compares
        content hashes, not stamps).

    Raises:
        IndexStoreLockedError: another sync held the lease past ``wait_ms`` (named).
        PostgresUnavailableError / PostgresTimeoutError / PostgresStoreError: the database failed
            (nothing of this sync is published).
    """
    from fallback.store.postgres.store import ChunkRow, FileRows

    s = settings.search
    report = SyncReport(full=force, full_reason="force" if force else None)
    found = list_memory_files(settings.workspace_dir, s.extra_paths, max_file_bytes=s.max_file_bytes)
    report.issues = list(found.issues)
    skipped: list[SkippedFile] = list(found.skipped)
    files: list[MemoryFile] = list(found.files)
    if "sessions" in s.sources:
        transcripts, error = list_session_files(settings.sessions_dir)
        files += transcripts
        if error is not None:
            report.issues.append(error)
    report.files_total = len(files)
    lease = store.sync_lease(wait_ms=wait_ms)
    if lease is None:
        raise IndexStoreLockedError(store.busy_reason or "another sync holds the lease")
    with lease:
        held = {src: store.lease_paths(lease, src) for src in ("memory", "sessions")}
        active: set[tuple[str, str]] = set()
        batch: list[FileRows] = []
        for mf in files:
            if mf.source == "sessions":
                read, line_map = read_session_text(mf)
            else:
                read, line_map = read_memory_text(mf, max_file_bytes=s.max_file_bytes), None
            report.files_read += 1
            if isinstance(read, SkippedFile):
                if read.reason != VANISHED:
                    skipped.append(read)
                continue
            active.add((mf.source, mf.rel_path))
            skipped.extend(read_notes(mf, read))
            if not force and held[mf.source].get(mf.rel_path) == read.content_hash:
                continue
            chunks = file_chunks(settings, mf, read.text, line_map=line_map, model=FTS_ONLY_MODEL)
            batch.append(FileRows(
                mf.rel_path, mf.source, read.content_hash, read.mtime_ms, read.size,
                note_title(mf.rel_path, read.text),
                tuple(ChunkRow(cid, c.start_line, c.end_line, c.content_hash, FTS_ONLY_MODEL,
                               c.text, derived_terms(c.text)) for cid, c in chunks)))
            report.files_indexed += 1
            report.chunks_written += len(chunks)
            if len(batch) >= WRITE_BATCH_FILES:
                lease.write_files(batch)
                batch = []
        lease.write_files(batch)
        for source, paths in held.items():
            for path in sorted(set(paths) - {p for src, p in active if src == source}):
                lease.delete_file(path, source)
                report.files_deleted += 1
        lease.publish()
    report.skipped = skipped
    return report
