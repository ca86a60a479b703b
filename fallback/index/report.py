"""What one index sync did (:class:`SyncReport`), shared by the indexer and its embedding step."""

from __future__ import annotations

from dataclasses import dataclass, field

from fallback.errors import EmbeddingProviderError
from fallback.skipped import SkippedFile

__all__ = ["SyncReport"]


@dataclass
class SyncReport:
    """What one sync did.

    Attributes:
        full: True when it was a full (swapped-in) reindex.
        full_reason: why a full reindex ran (``force`` or a ``full_reindex_reason``).
        files_total: files discovered.
        files_read: files read again (new, their stamps changed, racily clean, or not indexed
            by the last sync); the others were trusted by their ``(mtime, size, ctime)``.
        files_indexed: files (re-)chunked and written (a read file whose content hash is
            unchanged only gets its stamps written and is not counted here).
        files_deleted: indexed files whose rows were removed (vanished or now skipped).
        chunks_written: chunks written.
        chunks_embedded: chunks that got their vectors in this sync (from the provider or the
            embedding cache); written or filled in, never more than those.
        windows_embedded: embedding window texts sent to the provider (cache misses; a chunk
            is embedded as one or more windows, ``fallback/index/windows.py``).
        chunks_filled: chunks written earlier without a vector that got one in this sync.
        chunks_pending: chunks still without a vector after this sync (the provider failed or
            the sync's embedding deadline passed; a later sync fills them in).
        embedding_error: the provider error that stopped embedding in this sync, or ``None``.
        embedding_exception: that error itself (live mode raises it after the sync, so the
            background task reports it and retries with backoff), or ``None``.
        embedding_deferred: True when the sync's embedding deadline stopped embedding.
        skipped: files skipped or indexed with a caveat (memory and sessions).
        issues: scan issues (missing memory dir, legacy ``memory.md`` split, transcript
            enumeration failure ...).
        session_sizes: absolute transcript path -> size in bytes as indexed, for every
            transcript the index now holds (the engine resets its delta tracker with it).
        workspace_switched_from: the other workspace the store held before this sync
            re-indexed it for the configured one, or ``None``.
        notes: one-off events to tell the user once (the workspace switch), one line each.
    """

    full: bool = False
    full_reason: str | None = None
    files_total: int = 0
    files_read: int = 0
    files_indexed: int = 0
    files_deleted: int = 0
    chunks_written: int = 0
    chunks_embedded: int = 0
    windows_embedded: int = 0
    chunks_filled: int = 0
    chunks_pending: int = 0
    embedding_error: str | None = None
    embedding_exception: EmbeddingProviderError | None = field(default=None, repr=False,
                                                                compare=False)
    embedding_deferred: bool = False
    skipped: list[SkippedFile] = field(default_factory=list)
    issues: list[str] = field(default_factory=list)
    session_sizes: dict[str, int] = field(default_factory=dict)
    workspace_switched_from: str | None = None
    notes: list[str] = field(default_factory=list)
