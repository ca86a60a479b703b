"""What one index sync did (:class:`SyncReport`), shared by the indexer and its embedding step."""

from __future__ import annotations

from dataclasses import dataclass, field

from fallback.errors import EmbeddingProviderError
from fallback.skipped import SkippedFile

__all__ = ["SyncReport"]


@dataclass
class SyncReport:
    """What one sync did: a ``full`` reindex and why (``full_reason``); files discovered, read
    (the others trusted by their stamps), (re-)indexed and deleted; chunks written, embedded
    (provider or cache), filled in later and still ``pending`` a vector; window texts sent to
    the provider; the provider error that stopped embedding (``embedding_error``, the exception
    itself for live mode to raise); files skipped or indexed with a caveat; scan issues;
    transcript sizes as indexed (absolute path -> bytes); one-off ``notes`` to tell once."""

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
    skipped: list[SkippedFile] = field(default_factory=list)
    issues: list[str] = field(default_factory=list)
    session_sizes: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
