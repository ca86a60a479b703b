"""The builtin memory engine: FTS5 BM25 + vectors over Markdown memory files in SQLite.

Knows nothing about qmd. ``qmdbridge`` builds on it.
"""

from fallback.errors import (
    BackendTimeoutError,
    BackendUnavailableError,
    ConfigError,
    EmbeddingProviderError,
    IndexStoreError,
    ManagerClosedError,
    MemorySearchError,
    PathRefusedError,
    UsageError,
)
from fallback.models import (
    FallbackInfo,
    MemoryReadResult,
    MemorySearchResult,
    MemoryStatus,
    SearchResponse,
)

__all__ = [
    "BackendTimeoutError",
    "BackendUnavailableError",
    "ConfigError",
    "EmbeddingProviderError",
    "FallbackInfo",
    "IndexStoreError",
    "ManagerClosedError",
    "MemoryReadResult",
    "MemorySearchError",
    "MemorySearchResult",
    "MemoryStatus",
    "PathRefusedError",
    "SearchResponse",
    "UsageError",
]
