"""The backend contract both engines implement (builtin SQLite engine and qmd sidecar).

``MemoryManager`` uses a backend only through :class:`MemoryBackend`: no private attributes,
no swapped callbacks. All methods are async (anyio); blocking work (SQLite, file reads) runs in
``anyio.to_thread.run_sync``.

Lifecycle: construct -> ``start(tasks)`` once -> any of ``prepare``, ``search``,
``read_file``, ``status``, ``sync`` -> ``close()``. A backend never creates its
own asyncio tasks: everything that outlives a call runs in the manager's task group through
the :class:`~fallback.background.BackgroundTasks` given to ``start``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from fallback.models import MemoryReadResult, MemorySearchResult, MemoryStatus

if TYPE_CHECKING:
    from fallback.background import BackgroundTasks
    from fallback.request import SearchRequest

__all__ = ["MemoryBackend", "ProgressCallback", "SearchOutcome"]

# Sync progress: ``progress(files_done, files_total, chunks_embedded, chunks_written)``, called
# after each file and each committed embedding batch.
ProgressCallback = Callable[[int, int, int, int], None]


@dataclass(frozen=True)
class SearchOutcome:
    """One search's answer, as a backend returns it.

    Attributes:
        results: the hits, best first, cut to ``max_results`` and filtered by ``min_score``
            (each with ``explain`` when asked and the backend has a trace).
        warnings: this search's non-fatal notes (a failed rerank, hits dropped as ambiguous,
            one-off events no answer told yet), then the backend's last non-fatal problem
            (failed sync, failed query embedding) when no note says it already.
        mode: the ranking that ran: ``hybrid`` | ``vector-only`` | ``fts-only`` (builtin) or
            ``search`` | ``vsearch`` | ``query`` (qmd); ``None`` only inside the ranking code
            when nothing was ranked.
        provider: embedding provider id (``none`` keyword-only; ``qmd`` for the sidecar);
            ``None`` only inside the ranking code.
        model: embedding model, or ``None``.
    """

    results: list[MemorySearchResult]
    warnings: list[str] = field(default_factory=list)
    mode: str | None = None
    provider: str | None = None
    model: str | None = None


@runtime_checkable
class MemoryBackend(Protocol):
    """What ``MemoryManager`` needs from a backend, and all it uses.

    ``search`` returns hits best first, already cut to ``max_results`` and filtered by
    ``min_score``; it never decorates citations (the manager does). ``read_file`` raises
    ``PathRefusedError`` for anything that is not a memory file and returns empty text with
    ``missing=True`` for a memory file that does not exist.
    """

    name: str

    async def start(self, tasks: BackgroundTasks) -> None:
        """Do the start-up work and begin background work (called once, before first use).

        ``tasks`` is the manager's task group: every background task (watcher, timers, boot
        sync or update) is started through it. Start-up steps run under their own budgets,
        never under a search deadline. Returns nothing.

        Raises:
            ManagerClosedError: the backend is closed.
            BackendUnavailableError: the backend cannot be started at all.
        """
        ...

    async def prepare(self) -> None:
        """Do the cheap local work a first search needs (open the store, create folders), so
        a fallback answer is ready at once; spawns no process. Returns nothing.

        Raises:
            IndexStoreError / BackendUnavailableError: it cannot be prepared.
        """
        ...

    async def search(self, request: SearchRequest, *, sync_budget_ms: int | None = None,
                     progress: ProgressCallback | None = None) -> SearchOutcome:
        """Search; hits best first with the notes, mode and provider the answer reports.

        Args:
            request: the checked request (:class:`~fallback.request.SearchRequest`: stripped
                query, limits in range); ``max_results`` / ``min_score`` ``None`` take the
                backend's defaults, ``session_key``'s scope rules are the manager's,
                ``sources`` restricts to ``memory`` and/or ``sessions``, ``explain`` attaches
                the ranking trace to every hit where the backend has one.
            sync_budget_ms: longest wait in ms for a pre-search index refresh (``None``: the
                backend's default).
            progress: sync progress for a pre-search sync this search runs (the builtin
                engine; qmd ignores it).

        Returns:
            :class:`SearchOutcome` (results, warnings, mode, provider, model all set).

        Raises:
            BackendUnavailableError: the backend cannot answer.
        """
        ...

    async def read_file(self, rel_path: str, *, from_line: int | None = None,
                        lines: int | None = None) -> MemoryReadResult:
        """Read a memory file page (defaults 120 lines / 12,000 chars).

        Returns:
            ``MemoryReadResult`` (``missing=True`` and empty text for an absent memory file).

        Raises:
            PathRefusedError: not a memory file.
        """
        ...

    async def status(self) -> MemoryStatus:
        """Counters and health of this backend (``MemoryStatus``)."""
        ...

    async def sync(self, *, reason: str, force: bool = False,
                   progress: ProgressCallback | None = None) -> object:
        """Bring the index up to date (``force``: full rebuild, swapped in atomically).

        Args:
            reason: why (``cli``, ``watch``, ``interval`` ...), for logs.
            force: full rebuild.
            progress: ``progress(files_done, files_total, chunks_embedded, chunks_written)`` for this sync,
                where the backend can tell (the builtin engine; qmd ignores it).

        Returns:
            The backend's own report (the builtin engine's ``SyncReport``; ``None`` for qmd);
            the manager does not read it.

        Raises:
            IndexStoreError / BackendUnavailableError: the sync failed.
        """
        ...

    async def close(self) -> None:
        """Stop this backend's background tasks, wait for a running sync, release stores and
        child processes; idempotent. Returns nothing."""
        ...
