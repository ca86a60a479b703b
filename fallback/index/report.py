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
        files_read: files read (the others were trusted by their ``(mtime, size, ctime)``).
        files_indexed: files (re-)chunked and written.
        files_deleted: indexed files whose rows were removed (vanished or now skipped).
        chunks_written: chunks written.
        chunks_embedded: chunks that got their vectors in this sync (provider or cache).
        windows_embedded: embedding window texts sent to the provider.
        chunks_filled: chunks written earlier without a vector that got one in this sync.
        chunks_pending: chunks still without a vector after this sync.
        embedding_error: the provider error that stopped embedding in this sync, or ``None``.
        embedding_exception: that error itself (live mode raises it after the sync).
        embedding_deferred: True when the sync's embedding deadline stopped embedding.
        skipped: files skipped or indexed with a caveat.
        issues: scan issues (missing memory dir, legacy ``memory.md`` split ...).
        session_sizes: absolute transcript path -> size in bytes as indexed.
        workspace_switched_from: the other workspace the store held before this sync, or
            ``None``.
        notes: one-off events to tell the user once, one line each.
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
