"""The builtin memory engine: FTS5 BM25 + vectors over Markdown memory files in SQLite.

Knows nothing about qmd. The public names are imported on first access, so importing a
submodule loads no pydantic.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing

__all__ = ["BackendTimeoutError", "BackendUnavailableError", "ConfigError",
           "EmbeddingProviderError", "FallbackInfo", "IndexStoreError", "ManagerClosedError",
           "MemoryReadResult", "MemorySearchError", "MemorySearchResult", "MemoryStatus",
           "PathRefusedError", "SearchResponse", "UsageError"]

_MODELS = frozenset({"FallbackInfo", "MemoryReadResult", "MemorySearchResult", "MemoryStatus",
                     "SearchResponse"})

if TYPE_CHECKING:  # pragma: no cover
    from typing import Any

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


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module 'fallback' has no attribute {name!r}")
    from importlib import import_module

    value = getattr(import_module("fallback.models" if name in _MODELS else "fallback.errors"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
