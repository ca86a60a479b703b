"""qmdbridge: memory_search / memory_get for AI agents over qmd, with a builtin SQLite fallback.

The public names are imported lazily (on first attribute access), so ``qmdbridge search``
starts without loading what it does not use.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (a served `qmdbridge search` skips it)

__all__ = [
    "BackendTimeoutError",
    "BackendUnavailableError",
    "BlockingMemoryManager",
    "ConfigError",
    "EmbeddingProviderError",
    "FallbackInfo",
    "IndexStoreError",
    "MEMORY_GET_SCHEMA",
    "MEMORY_SEARCH_SCHEMA",
    "ManagerClosedError",
    "MemoryFileNotFoundError",
    "MemoryManager",
    "MemoryReadResult",
    "MemorySearchError",
    "MemorySearchResult",
    "MemoryStatus",
    "PathRefusedError",
    "ResolvedAgent",
    "SearchResponse",
    "UsageError",
    "handle_memory_get",
    "handle_memory_search",
    "load_config",
    "resolve_agent",
]

# The modules that define the public names, searched in this order (the lightest first).
_MODULES = ("fallback.errors", "fallback.models", "qmdbridge.config", "qmdbridge.manager", "qmdbridge.tools")

if TYPE_CHECKING:  # pragma: no cover
    from typing import Any

    from fallback.errors import (
        BackendTimeoutError,
        BackendUnavailableError,
        ConfigError,
        EmbeddingProviderError,
        IndexStoreError,
        ManagerClosedError,
        MemoryFileNotFoundError,
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
    from qmdbridge.config import ResolvedAgent, load_config, resolve_agent
    from qmdbridge.manager import BlockingMemoryManager, MemoryManager
    from qmdbridge.tools import (
        MEMORY_GET_SCHEMA,
        MEMORY_SEARCH_SCHEMA,
        handle_memory_get,
        handle_memory_search,
    )


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module 'qmdbridge' has no attribute {name!r}")
    from importlib import import_module  # here, not at the top: `qmdbridge search` imports this package

    value = next(getattr(m, name) for m in map(import_module, _MODULES) if hasattr(m, name))
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
