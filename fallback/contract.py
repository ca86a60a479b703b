"""The backend contract both engines implement (builtin SQLite engine and qmd sidecar).

All methods are async (anyio). Blocking work (SQLite, file reads) runs in
``anyio.to_thread.run_sync``. See ``DESIGN.md`` "The backend contract".
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from fallback.models import MemoryReadResult, MemorySearchResult, MemoryStatus, Source

__all__ = ["MemoryBackend"]


@runtime_checkable
class MemoryBackend(Protocol):
    """What ``MemoryManager`` needs from a backend.

    ``search`` returns hits best first, already cut to ``max_results`` and filtered by
    ``min_score``; it never decorates citations (the manager does). ``read_file`` raises
    ``PathRefusedError`` for anything that is not a memory file and returns empty text with
    ``missing=True`` for a memory file that does not exist.
    """

    name: str

    async def search(self, query: str, *, max_results: int | None = None,
                     min_score: float | None = None, session_key: str | None = None,
                     sources: list[Source] | None = None) -> list[MemorySearchResult]:
        """Search; raises ``UsageError`` for a blank query, ``BackendUnavailableError`` when
        the backend cannot answer."""
        ...

    async def read_file(self, rel_path: str, *, from_line: int | None = None,
                        lines: int | None = None) -> MemoryReadResult:
        """Read a memory file page (defaults 120 lines / 12,000 chars)."""
        ...

    async def status(self) -> MemoryStatus:
        """Counters and health."""
        ...

    async def sync(self, *, reason: str, force: bool = False) -> None:
        """Bring the index up to date (``force``: full rebuild, swapped in atomically)."""
        ...

    async def probe_embeddings(self) -> tuple[bool, str | None]:
        """Embed a ping text: ``(ok, error)``."""
        ...

    async def probe_vector(self) -> bool:
        """Whether vector search is available."""
        ...

    async def close(self) -> None:
        """Stop timers and watchers, close stores; idempotent."""
        ...
