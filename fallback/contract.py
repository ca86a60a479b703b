"""The backend contract both engines implement (builtin SQLite engine and qmd sidecar).

``MemoryManager`` uses a backend only through :class:`MemoryBackend` (async; blocking work in
``anyio.to_thread``). Lifecycle: construct -> ``start(tasks)`` once -> any of ``prepare``,
``search``, ``read_file``, ``status``, ``sync`` -> ``close()``; whatever outlives a call runs
in the manager's :class:`~fallback.background.BackgroundTasks`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from fallback.models import MemoryReadResult, MemorySearchResult, MemoryStatus

if TYPE_CHECKING:
    from fallback.background import BackgroundTasks
    from fallback.request import SearchRequest

__all__ = ["STALE_WARNING", "MemoryBackend", "ProgressCallback", "SearchOutcome"]

# The warning of an answer given while the index may miss changes it knows of (either backend).
STALE_WARNING = "index stale: {reason}; the newest content may be missing"

# Sync progress: ``progress(files_done, files_total, chunks_embedded, chunks_written)``, called
# after each file and each committed embedding batch.
ProgressCallback = Callable[[int, int, int, int], None]


@dataclass(frozen=True)
class SearchOutcome:
    """One search's answer, as a backend returns it: the hits (best first, cut to
    ``max_results``, filtered by ``min_score``), the search's non-fatal notes then the backend's
    last non-fatal problem when no note says it, and the fields of the same names of
    :class:`~fallback.models.SearchResponse`."""

    results: list[MemorySearchResult]
    warnings: list[str] = field(default_factory=list)
    mode: str | None = None
    provider: str | None = None
    model: str | None = None


@runtime_checkable
class MemoryBackend(Protocol):
    """What ``MemoryManager`` needs from a backend, and all it uses (citations are the
    manager's)."""

    name: str

    async def start(self, tasks: BackgroundTasks) -> None:
        """Do the start-up work and begin background work in ``tasks``, the manager's task
        group (once, before first use, never under a search deadline).

        Raises ``ManagerClosedError`` (closed) or ``BackendUnavailableError`` (cannot start).
        """
        ...

    async def prepare(self) -> None:
        """Do the cheap local work a first search needs, so a fallback answer is ready at once
        (spawns no process). Raises ``IndexStoreError`` / ``BackendUnavailableError``."""
        ...

    async def search(self, request: SearchRequest, *, sync_budget_ms: int | None = None,
                     progress: ProgressCallback | None = None) -> SearchOutcome:
        """Answer one search (scope rules are the manager's).

        Args:
            request: the checked request (``None`` limits: the backend's defaults).
            sync_budget_ms: longest wait in ms for a pre-search index refresh (``None``: the backend's).
            progress: of that refresh (qmd ignores it).

        Returns:
            A :class:`SearchOutcome`, every field set.

        Raises:
            BackendUnavailableError: the backend cannot answer.
        """
        ...

    async def read_file(self, rel_path: str, *, from_line: int | None = None,
                        lines: int | None = None, from_char: int | None = None) -> MemoryReadResult:
        """Read a memory file page (``missing=True`` and empty text for an absent one) from
        code point ``from_char`` of line ``from_line`` (``read_page.page_text``).

        Raises ``PathRefusedError``: not a memory file.
        """
        ...

    async def status(self) -> MemoryStatus:
        """Counters and health of this backend."""
        ...

    async def sync(self, *, reason: str, force: bool = False,
                   progress: ProgressCallback | None = None) -> object:
        """Bring the index up to date (``reason``: ``cli``, ``watch`` ..., for logs; ``force``: a
        full rebuild, swapped in atomically; ``progress``: qmd ignores it) and return the
        backend's own report, which the manager does not read.

        Raises ``IndexStoreError`` / ``BackendUnavailableError``: the sync failed.
        """
        ...

    async def close(self) -> None:
        """Stop background tasks, wait for a running sync, release stores and child
        processes; idempotent."""
        ...
