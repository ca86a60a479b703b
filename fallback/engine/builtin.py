"""BuiltinEngine: the in-process memory search backend (``MemoryBackend`` contract): FTS-only
without an embedding provider (spec §8.6), hybrid with one (spec §8.5)."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

import anyio

from fallback.background import BackgroundTasks
from fallback.contract import STALE_WARNING, ProgressCallback, SearchOutcome
from fallback.embeddings.base import EmbeddingProvider
from fallback.engine.presearch import (
    STILL_SYNCING,
    IndexState,
    presearch_sync,
    read_index_state,
    run_presearch_sync,
)
from fallback.engine.query_vector import (
    PreparedProvider,
    QueryVector,
    QueryVectorCache,
    backlog_reason,
    check_query_vector,
    embed_query_within,
    failure_text,
    on_provider_failure,
    read_index_vectors,
)
from fallback.engine.store_open import EngineStore
from fallback.engine.sync_record import failure_doc
from fallback.errors import (
    BackendTimeoutError,
    EmbeddingProviderError,
    IndexStoreError,
    ManagerClosedError,
    MemorySearchError,
    SearchUnavailableError,
)
from fallback.index.identity import index_identity
from fallback.index.indexer import Indexer, SyncReport
from fallback.index.racy import wall_clock_ms
from fallback.models import MemoryReadResult, MemorySearchResult, MemoryStatus
from fallback.request import SearchRequest
from fallback.search.explain import SearchTrace
from fallback.search.fts_only import candidate_count, keyword_search
from fallback.search.pipeline import SCOPE_FAILURES, Searcher, configured_mode, merge_scopes
from fallback.search.substring import SUBSTRING_WARNING
from fallback.settings import EngineSettings
from fallback.store.db import Store
from fallback.store.errors import (
    IndexStoreCorruptError,
    IndexStoreReadOnlyError,
)
from fallback.store.files import read_only_warning
from fallback.store.lock import DEFAULT_LOCK_TIMEOUT_MS
from fallback.store.readonly import ReadOnlyStore
from fallback.store.seam import SearchStore

if TYPE_CHECKING:
    from fallback.store.postgres.seam import PostgresSearchStore

__all__ = ["BuiltinEngine"]

log = logging.getLogger(__name__)

T = TypeVar("T")

# What a search reads of the scopes other agents share: their memory files (transcripts stay
# their own agent's).
SHARED_SOURCES = ("memory",)
# Shared scopes a search ranks at once, beside its own (a store's pool holds 4 connections).
SHARED_SEARCHES_AT_ONCE = 3


class BuiltinEngine:
    """The builtin backend for one agent.

    Args:
        settings: resolved engine settings (workspace, store path, memorySearch).
        provider_selection: a ``ProviderSelection``; default ``select_provider(settings.search)``
            on first use.
        now_ms: clock in epoch ms (temporal decay, ``updated_at``); default wall clock.
    """

    name = "builtin"
    # Longest wait of a search for a pre-search sync, in ms (not for an empty index's bootstrap).
    search_sync_budget_ms: int = 2000
    # Live mode: transcript event batch window (spec §5.4), safety-net rescan period, both ms.
    session_batch_ms: int = 5000
    rescan_interval_ms: int = 300_000
    # Live mode: start the watcher on polling (network file systems, tests) and its period (s).
    watch_force_polling: bool = False
    watch_poll_interval_s: float = 1.0
    # Live mode: period of the watcher loop's own health check, ms (searches and status check too).
    watch_health_check_ms: int = 1000

    def __init__(self, settings: EngineSettings, *, provider_selection: Any = None,
                 now_ms: Callable[[], int] | None = None) -> None:
        self.settings = settings
        self._selection = provider_selection
        self._now_ms = now_ms or wall_clock_ms
        self._vector: Any = None
        self._write_limiter = anyio.CapacityLimiter(1)
        self._notes: list[str] = []  # one-off events reported in status().issues
        self._stores = EngineStore(settings, self._notes)
        self._notes_told = 0  # of which the first n were in an answer (take_notices)
        self._closed = False
        self._dirty = True
        self._dirty_reason: str | None = "not synced yet"
        self._synced = False
        self._sync_done: anyio.Event | None = None
        self._sync_outcome: SyncReport | BaseException | None = None
        self._last_report: SyncReport | None = None
        self._syncs_done = 0  # completed syncs (a search tells whether one ran meanwhile)
        self._last_error: str | None = None
        self._provider_error: str | None = None  # the last search's query embedding failure
        self._query_embedded = False  # whether a search of this process embedded its query
        self._live: Any = None
        self._reranker: Any = None  # the query.rerank provider, made on first search
        self._query_vectors = QueryVectorCache()  # contrast backgrounds across searches
        # the identity of a keyword-only index: a function of the (frozen) settings alone
        self._keyword_identity = index_identity(settings, None)

    def _check_open(self) -> None:
        if self._closed:
            raise ManagerClosedError("builtin engine is closed")

    async def _recovering(self, once: Callable[[], Awaitable[T]]) -> T:
        """``once()``, run again on an empty store after an ``IndexStoreCorruptError``."""
        try:
            return await once()
        except IndexStoreCorruptError as exc:
            await self._stores.recover_corrupt(exc, before_move=self._drop_vector_index)
            self._synced = False
            self.mark_dirty("index store was rebuilt")
        return await once()

    async def prepare(self) -> None:
        """Open the store ahead of the first search (the manager does it while qmd runs).
        Raises ``IndexStoreError``, ``ManagerClosedError``."""
        self._check_open()
        await self._stores.open_search()

    def _provider_selection(self) -> Any:
        if self._selection is None:
            from fallback.embeddings import select_provider
            self._selection = select_provider(self.settings.search)
        return self._selection

    def _provider(self) -> EmbeddingProvider | None:
        return self._provider_selection().provider

    def _fail_closed(self) -> None:
        failure = self._provider_selection().failure
        if failure is not None:  # a new one each time (a raise keeps its traceback)
            raise SearchUnavailableError(failure.provider, failure.reason)

    def _vector_index(self) -> Any:
        if self._stores.is_postgres:  # the store answers the vector side itself
            return self._stores.shared
        if self._vector is None:
            from fallback.store.vectors import VectorIndex
            vs = self.settings.search.store.vector
            self._vector = VectorIndex(self.settings.db_path, enabled=vs.enabled,
                                       extension_path=vs.extension_path)
        return self._vector

    def _drop_vector_index(self) -> None:
        if self._vector is not None:
            self._vector.close()
            self._vector = None

    def mark_dirty(self, reason: str = "files changed") -> None:
        """Mark the index stale (the watcher calls this); the next search syncs first."""
        self._dirty = True
        self._dirty_reason = reason

    async def start(self, tasks: BackgroundTasks) -> None:
        """Enter live mode (``serve``) in a ``builtin`` subgroup of ``tasks``; idempotent.
        Raises ``ManagerClosedError``, ``UsageError`` (``tasks`` is not open)."""
        self._check_open()
        if self._live is not None:
            return
        from fallback.engine.live import LiveSync
        self._live = LiveSync(self, tasks.subgroup("builtin"))
        await self._live.start()

    def warm_session(self, session_key: str | None) -> None:
        """Fire-and-forget ``sync("session-start")`` once per non-empty key (live mode only)."""
        if self._live is not None and not self._closed:
            self._live.warm(session_key)

    async def sync_after_running(self, *, reason: str,
                                 paths: set[str] | None = None) -> SyncReport:
        """:meth:`sync` after a running sync finishes (changes seen since it started are picked
        up). Raises as :meth:`sync`."""
        while self._sync_done is not None:
            await self._sync_done.wait()
        return await self.sync(reason=reason, paths=paths)

    async def close(self) -> None:
        """Stop live mode, wait for a running sync, close the vector index, provider and store;
        idempotent."""
        if self._closed:
            return
        if self._live is not None:
            await self._live.close()
        if self._sync_done is not None:
            await self._sync_done.wait()
        self._closed = True
        await anyio.to_thread.run_sync(self._drop_vector_index)
        sel = self._selection
        if sel is not None and sel.provider is not None:
            await sel.provider.aclose()
        if self._reranker is not None:
            await self._reranker.aclose()
        await self._stores.close()

    async def sync(self, *, reason: str, force: bool = False, paths: set[str] | None = None,
                   progress: ProgressCallback | None = None,
                   embed_deadline: float | None = None) -> SyncReport:
        """:meth:`MemoryBackend.sync <fallback.contract.MemoryBackend.sync>`: the ``SyncReport``
        of this sync, or of the running one a second caller awaits. A store found corrupt is
        moved aside and rebuilt, then the sync runs again once.

        Args:
            paths: absolute paths the watcher saw change (``None``: a full incremental scan).
            embed_deadline: anyio clock time after which this sync calls the embedding
                provider no more (chunks left are embedded by a later sync).

        Raises ``ManagerClosedError``; ``BackendUnavailableError`` (an explicitly configured
        provider is unavailable); ``IndexStoreError`` / ``EmbeddingProviderError`` (a full
        rebuild leaves the live index untouched).
        """
        return await self._recovering(partial(self._sync_shared, reason=reason, force=force,
                                              paths=paths, progress=progress,
                                              embed_deadline=embed_deadline))

    async def _sync_shared(self, *, reason: str, force: bool, paths: set[str] | None,
                           progress: ProgressCallback | None,
                           embed_deadline: float | None = None) -> SyncReport:
        self._check_open()
        cancelled = anyio.get_cancelled_exc_class()
        while self._sync_done is not None:
            await self._sync_done.wait()
            outcome = self._sync_outcome
            if isinstance(outcome, SyncReport):
                return outcome
            if outcome is not None and not isinstance(outcome, cancelled):
                raise outcome
            # the sync we joined was cancelled (a search budget ran out): run our own
        done = anyio.Event()
        self._sync_done = done
        try:
            report = await self._run_sync(reason=reason, force=force, paths=paths,
                                          progress=progress, embed_deadline=embed_deadline)
            self._sync_outcome = report
            if self._live is not None:
                self._live.after_sync(report)
            await self._stores.keep_failure("sync", None)
            return report
        except BaseException as exc:
            self._sync_outcome = exc
            if not isinstance(exc, cancelled):
                self._last_error = f"sync ({reason}) failed: {exc}"
            # the store failed it (on postgres a statement past its timeout too); status tells
            # a store it cannot write itself
            if isinstance(exc, (IndexStoreError, BackendTimeoutError)) and not isinstance(
                    exc, IndexStoreReadOnlyError):
                with anyio.CancelScope(shield=True):  # also when a search's budget ran out
                    await self._stores.keep_failure("sync", failure_doc(  # every process's status tells it
                        reason=reason, error=exc, at_ms=self._now_ms()))
            raise
        finally:
            self._sync_done = None
            done.set()

    async def _run_sync(self, *, reason: str, force: bool, paths: set[str] | None,
                        progress: ProgressCallback | None,
                        embed_deadline: float | None = None) -> SyncReport:
        self._fail_closed()
        if self._stores.is_postgres:  # the store's sync lease is the one writer
            from fallback.index.lease_sync import sync_through_lease
            shared = await self._stores.open_postgres()
            report = await anyio.to_thread.run_sync(partial(
                sync_through_lease, self.settings, shared, force=force, provider=self._provider(),
                embed_deadline=embed_deadline))
        else:
            self._check_open()  # closed while this sync waited for another
            store = await self._stores.open()
            # one writer per store across processes; within a search's budget the lock's
            # timeout is the failure told, not the budget's cancellation
            wait_ms = None if store.lock_deadline is None else store.lock_wait_ms(DEFAULT_LOCK_TIMEOUT_MS)
            with anyio.CancelScope(shield=wait_ms is not None):
                await store.writer_lock.acquire(timeout_ms=wait_ms)
            try:
                await anyio.to_thread.run_sync(store.recover_leftovers)
                indexer = Indexer(self.settings, provider=self._provider(),
                                  write_limiter=self._write_limiter, now_ms=self._now_ms,
                                  on_progress=progress, embed_deadline=embed_deadline)
                log.debug("builtin sync start (%s, force=%s)", reason, force)
                report = await indexer.sync_recovering_readonly(store, force=force, paths=paths)
            finally:
                store.writer_lock.release()
            if report.full:
                await anyio.to_thread.run_sync(self._drop_vector_index)
            elif (report.files_indexed or report.files_deleted) and self._vector is not None:
                await anyio.to_thread.run_sync(self._vector.invalidate)
        # chunks still without a vector keep the index dirty: the next sync fills them in
        self._dirty = report.chunks_pending > 0
        self._dirty_reason = (backlog_reason(report.chunks_pending, report.embedding_error)
                              if self._dirty else None)
        for note in report.notes:  # told once, in the next answer
            self._notes.append(note)
            log.warning("%s", note)
        self._synced = True
        self._last_report = report
        self._syncs_done += 1
        self._last_error = None
        return report

    async def _search_sync(self, deadline: float, progress: ProgressCallback | None,
                           lock_deadline: float) -> None:
        # a store locked by another process fails the sync at the budget (a worker thread
        # waiting in SQLite cannot be cancelled)
        store = self._stores.store  # the one the search opened (None for postgres)
        if store is not None and lock_deadline != math.inf:
            store.lock_deadline = time.monotonic() + lock_deadline - anyio.current_time()
        try:
            await self.sync(reason="search", embed_deadline=deadline, progress=progress)
        except (EmbeddingProviderError, IndexStoreError) as exc:
            log.warning("memory sync before search failed: %s", exc)
        finally:
            if store is not None:
                store.lock_deadline = None

    def _fails_closed(self) -> bool:
        """Whether a failing provider fails the search (explicitly configured, no opt-in)."""
        return (self._provider_selection().requested not in ("auto", "none")
                and not self.settings.search.query.keyword_fallback)

    async def search(self, request: SearchRequest, *, sync_budget_ms: int | None = None,
                     progress: ProgressCallback | None = None) -> SearchOutcome:
        """:meth:`MemoryBackend.search <fallback.contract.MemoryBackend.search>` under
        ``query.*`` (:meth:`SearchRequest.limits`); ``sync_budget_ms`` defaults to
        :attr:`search_sync_budget_ms` (an empty index's first sync is always awaited). A store
        found corrupt is moved aside and rebuilt, and the search runs again once.

        Raises ``ManagerClosedError``; ``BackendUnavailableError`` (an explicitly configured
        provider is unavailable); ``IndexStoreError`` (locked, read-only or corrupt).
        """
        return self._finish(await self._recovering(partial(
            self._search_once, request, sync_budget_ms=sync_budget_ms, progress=progress)))

    def search_settled(self, request: SearchRequest) -> SearchOutcome | None:
        """:meth:`search` of ``request`` in the caller's thread (blocking) when it needs nothing
        of the event loop (store open, keyword-only, nothing to tell, live mode quiet, no sync
        due); ``None``: await :meth:`search`."""
        store = self._stores.store
        if (self._closed or store is None or not self._keyword_only(request)
                or self._notes_told < len(self._notes)
                or (self._live is not None and not self._live.quiet(request.session_key))
                or store.is_replaced()):
            return None
        try:
            outcome = self._keyword_answer(store, request, synced=self._synced, dirty=self._dirty)
        except IndexStoreError:  # the search recovers or reports it
            return None
        return self._finish(self._live_warning(outcome)) if isinstance(outcome, SearchOutcome) else None

    def _keyword_only(self, request: SearchRequest) -> bool:
        """Whether ``request`` is ranked by keywords alone: no provider (or a failed one), rerank, trace."""
        sel = self._provider_selection()
        return (sel.provider is None and not sel.error and not request.explain
                and not self.settings.search.query.rerank.enabled)

    def _keyword_answer(self, store: SearchStore, request: SearchRequest, *, synced: bool,
                        dirty: bool, warnings: Sequence[str] = ()) -> SearchOutcome | IndexState:
        """A keyword-only search in one blocking step: the index state when it wants a sync
        first, holds another workspace or other agents share scopes with this one (the task
        group ranks those), else :meth:`_keyword_outcome`."""
        state = read_index_state(store, str(self.settings.workspace_dir), self._keyword_identity)
        if state.held_workspace is not None or not isinstance(store, ReadOnlyStore) and presearch_sync(
                state, synced=synced, dirty=dirty, on_search=self.settings.search.sync.on_search
        ) or self._shared_scopes(self._ranking_args(request)[2]):
            return state
        return self._keyword_outcome(store, request, warnings)

    def _keyword_outcome(self, store: SearchStore, request: SearchRequest,
                         warnings: Sequence[str]) -> SearchOutcome:
        """The keyword-only hits of ``request`` in the agent's own scope (blocking)."""
        q = self.settings.search.query
        limit, floor, srcs = self._ranking_args(request)
        if not srcs:
            return SearchOutcome(results=[], warnings=list(warnings))
        found = keyword_search(store, request.query, sources=srcs, limit=limit,
                               candidates=candidate_count(limit, q.hybrid.candidate_multiplier),
                               floor=floor, now_ms=self._now_ms(),
                               half_life_days=q.hybrid.temporal_decay.effective_half_life_days)
        return SearchOutcome([MemorySearchResult(**h._asdict()) for h in found.hits],  # as the pipeline
                             self._fts_warnings(warnings, store.fts_error), mode="fts-only")

    def _shared_scopes(self, srcs: list[str]) -> dict[str, PostgresSearchStore]:
        """``{owner agent: its scope}`` shared with this agent when ``srcs`` searches memory
        files (blocking); ``{}`` on a SQLite store."""
        own = self._stores.shared
        return {} if own is None or SHARED_SOURCES[0] not in srcs else own.shared_scopes()

    def _ranking_args(self, request: SearchRequest) -> tuple[int, float, list[str]]:
        """``(hits wanted, score floor, enabled sources asked for)`` of ``request``."""
        q = self.settings.search.query
        return (*request.limits(q.max_results, q.min_score),
                [s for s in self.settings.search.sources
                 if request.sources is None or s in request.sources])

    @staticmethod
    def _fts_warnings(warnings: Sequence[str], fts_error: str | None) -> list[str]:
        """``warnings``, and the substring-search note when FTS5 is unavailable."""
        return [*warnings, *([] if fts_error is None else [SUBSTRING_WARNING.format(error=fts_error)])]

    def _live_warning(self, outcome: SearchOutcome) -> SearchOutcome:
        """``outcome`` with live mode's stale-index note (transcripts waiting for their batch)."""
        live = self._live
        if live is not None and (stale := live.stale_reason(memory=False, below_delta=False)):
            return replace(outcome, warnings=[
                *outcome.warnings, STALE_WARNING.format(reason=stale)])
        return outcome

    def _finish(self, outcome: SearchOutcome) -> SearchOutcome:
        """``outcome`` with untold notices and the last non-fatal problem, mode, provider, model."""
        warnings = [*outcome.warnings, *self.take_notices()]
        last = self._last_error
        if last is not None and not any(last in w for w in warnings):  # not said already
            warnings.append(last)
        provider = self._provider()
        mode = outcome.mode or configured_mode(
            has_provider=provider is not None,
            hybrid_enabled=self.settings.search.query.hybrid.enabled)
        return replace(outcome, warnings=warnings, mode=mode,
                       provider="none" if provider is None else provider.provider_id,
                       model=None if provider is None else provider.model)

    def take_notices(self) -> list[str]:
        """The one-off events (a corrupt store moved aside ...) that no answer has told yet,
        oldest first; they stay in ``status().issues``. A search adds them to its warnings."""
        told, self._notes_told = self._notes_told, len(self._notes)
        return self._notes[told:]

    async def _search_once(self, request: SearchRequest, *, sync_budget_ms: int | None,
                           progress: ProgressCallback | None) -> SearchOutcome:
        text = request.query
        self._check_open()
        self._fail_closed()
        if self._live is not None:
            dead = self._live.check_watcher()  # a dead watcher is re-armed in the background
            if dead is not None:
                self.mark_dirty(dead)
            elif changed := self._live.unsynced_changes():  # saved within the debounce
                self.mark_dirty(f"files changed: {changed}")
        store, read_only = await self._stores.open_search()  # read-only: answer without a sync
        q = self.settings.search.query
        provider = self._provider()
        warnings = [] if read_only is None else [read_only_warning(read_only, self.settings.db_path)]
        # first, so the provider is never waited for past the deadline
        qv, deadline = await embed_query_within(provider, text, timeout_ms=q.timeout_ms)
        if provider is not None and qv is not None:  # status tells it until a query embeds
            error = None if qv.error is None else failure_text(qv.error, query=True)
            if error is not None or not self._query_embedded or self._provider_error is not None:
                await self._stores.keep_failure("query", None if error is None else failure_doc(
                    reason="search", error=error, at_ms=self._now_ms()))  # any process's status tells it
            self._provider_error, self._query_embedded = error, True
            if error is not None:
                self._last_error = error
                on_provider_failure(provider.provider_id, error, fail_closed=self._fails_closed(),
                                    warnings=warnings)
        syncs, ws = self._syncs_done, str(self.settings.workspace_dir)
        identity = index_identity(self.settings, provider)
        keyword_only = self._keyword_only(request)
        if keyword_only:  # one worker-thread hop when no sync is due
            found = await anyio.to_thread.run_sync(partial(
                self._keyword_answer, store, request, synced=self._synced, dirty=self._dirty,
                warnings=warnings))
            if isinstance(found, SearchOutcome):
                self.warm_session(request.session_key)
                return self._live_warning(found)
            state = found
        else:
            state = await anyio.to_thread.run_sync(read_index_state, store, ws, identity)
        budget_ms = self.search_sync_budget_ms if sync_budget_ms is None else sync_budget_ms
        ran = None if isinstance(store, ReadOnlyStore) else await run_presearch_sync(
            state, synced=self._synced, dirty=self._dirty, on_search=self.settings.search.sync.on_search,
            budget_ms=budget_ms, sync=partial(self._search_sync, deadline, progress), live=self._live)
        if ran is not None:
            store = (await self._stores.open_search())[0]  # it may have replaced a corrupt store
            warnings += [STALE_WARNING.format(reason=STILL_SYNCING.format(budget_ms=budget_ms))] if ran == "running" else []
            if state.held_workspace is not None:
                state = await anyio.to_thread.run_sync(read_index_state, store, ws, identity)
        if state.held_workspace is not None:  # not re-indexed: not this workspace's memory
            return SearchOutcome([], [*warnings, (
                f"index store {self.settings.db_path} holds workspace {state.held_workspace}, not {ws},"
                " and cannot be re-indexed: no results from it")])
        self.warm_session(request.session_key)
        limit, floor, srcs = self._ranking_args(request)
        # scopes other agents share (postgres) are ranked beside the own one in the task group below
        shared = await anyio.to_thread.run_sync(self._shared_scopes, srcs) if self._stores.is_postgres else {}
        if keyword_only and not shared:
            return self._live_warning(await anyio.to_thread.run_sync(
                self._keyword_outcome, store, request, warnings))
        prepared = None if provider is None or qv is None else await self._prepare_vector(
            store, provider, qv, warnings, synced=self._syncs_done != syncs, text=text,
            deadline=deadline)
        if not srcs:
            return SearchOutcome(results=[], warnings=warnings)
        candidates = candidate_count(limit, q.hybrid.candidate_multiplier)
        searcher = self._searcher(request.explain)
        ranked: dict[str, list[MemorySearchResult] | MemorySearchError] = {}
        failed: MemorySearchError | None = None
        at_once = anyio.CapacityLimiter(SHARED_SEARCHES_AT_ONCE)

        async def rank_shared(owner: str, scope: PostgresSearchStore) -> None:
            ranker = self._searcher(request.explain, vector_index=partial(shared.__getitem__, owner))
            async with at_once:  # each scope ranked by the same pipeline, beside the own one
                try:
                    found = await ranker.run(scope, prepared, text, list(SHARED_SOURCES), candidates,
                                             floor, limit)
                except SCOPE_FAILURES as exc:
                    ranked[owner] = exc
                else:
                    ranked[owner] = found.results

        async with anyio.create_task_group() as tg:
            for owner, scope in shared.items():
                tg.start_soon(rank_shared, owner, scope)
            try:  # the own scope's failure is the search's (raised in here it would be grouped)
                outcome = await searcher.run(store, prepared, text, srcs, candidates, floor, limit)
            except MemorySearchError as exc:
                failed = exc
                tg.cancel_scope.cancel()
        if failed is not None:
            raise failed
        left_out: list[str] = []
        if shared:
            results, left_out = merge_scopes(outcome.results, [(o, ranked[o]) for o in shared], limit=limit)
            outcome = replace(outcome, results=results)
        fts_error = (searcher.fts_error if searcher.fts_checked
                     else await anyio.to_thread.run_sync(lambda: store.fts_error))
        return self._live_warning(replace(outcome, warnings=[
            *outcome.warnings, *self._fts_warnings(warnings, fts_error), *left_out]))

    async def _prepare_vector(self, store: SearchStore, provider: EmbeddingProvider,
                              query: QueryVector, warnings: list[str], *, synced: bool,
                              text: str, deadline: float) -> PreparedProvider:
        """The provider the ranking gets after the pre-search sync: the query vector of ``text``
        when the index can use it (else ``[]``); warnings appended. Raises
        ``SearchUnavailableError``: this search's sync could not embed (``_fails_closed``)."""
        if query.error is not None:
            self._last_error = failure_text(query.error, query=True)  # the sync cleared it
        report = self._last_report
        failed = report.embedding_exception if synced and report is not None else None
        if failed is not None and query.error is None:
            on_provider_failure(provider.provider_id, failure_text(failed, query=False),
                                fail_closed=self._fails_closed(), warnings=warnings)
        index = await anyio.to_thread.run_sync(read_index_vectors, store)
        vector, changed = check_query_vector(query.vector or [], index, model=provider.model,
                                             warnings=warnings)
        if changed is not None:  # the model behind the id changed: the next sync rebuilds
            self.mark_dirty(f"embedding dimensions changed ({changed[0]} -> {changed[1]})")
            if self._live is not None:
                self._live.spawn_sync("search")
        return PreparedProvider(provider, vector, query=text, deadline=deadline,
                                cache=self._query_vectors)

    def _searcher(self, explain: bool = False, vector_index: Callable[[], Any] | None = None) -> Searcher:
        def record(error: str) -> None:
            self._last_error = error

        if self._reranker is None and self.settings.search.query.rerank.enabled:
            from fallback.search.rerank import reranker_from_settings  # only when configured
            self._reranker = reranker_from_settings(self.settings.search.query.rerank)
        return Searcher(self.settings, vector_index=vector_index or self._vector_index, now_ms=self._now_ms,
                        on_error=record, reranker=self._reranker,
                        trace=SearchTrace() if explain else None)

    async def read_file(self, rel_path: str, *, from_line: int | None = None,
                        lines: int | None = None, from_char: int | None = None) -> MemoryReadResult:
        """Read a page of a memory file or transcript (``read_memory_page``); on the postgres
        store ``shared/<owner>/<path>`` reads a file of a scope ``owner`` shares with this agent.
        Raises ``PathRefusedError``, ``ManagerClosedError``, ``IndexStoreError``."""
        self._check_open()
        from fallback.sources.read_page import read_memory_page, read_shared_page, shared_name
        if self._stores.is_postgres and (named := shared_name(rel_path)) is not None:
            own = await self._stores.open_postgres()
            scope = (await anyio.to_thread.run_sync(own.shared_scopes)).get(named[0])
            if scope is not None:
                return await anyio.to_thread.run_sync(partial(
                    read_shared_page, scope.store.file_text, rel_path, from_line=from_line,
                    lines=lines, from_char=from_char))
        s = self.settings  # sessions source: the sessions/<transcript> a session hit cites too
        return await anyio.to_thread.run_sync(partial(
            read_memory_page, s.workspace_dir, list(s.search.extra_paths), rel_path, from_line=from_line,
            lines=lines, sessions_dir=s.sessions_dir if "sessions" in s.search.sources else None,
            max_file_bytes=s.search.max_file_bytes, from_char=from_char))

    async def status(self) -> MemoryStatus:
        """Counters and health (spec §11, ``MemoryStatus``); a postgres server that cannot be
        reached in time is a status too: unhealthy, its error as ``last_error``, no counts.
        Raises ``ManagerClosedError``, ``IndexStoreError``."""
        self._check_open()
        if self._stores.is_postgres:
            from fallback.engine.status import build_postgres_status, unreached_postgres
            from fallback.store.postgres.errors import PostgresTimeoutError, PostgresUnavailableError
            try:
                shared = await self._stores.open_postgres()
                described, unreached = await anyio.to_thread.run_sync(shared.describe), None
            except (PostgresUnavailableError, PostgresTimeoutError) as exc:  # told, not raised
                described, unreached = unreached_postgres(self.settings), str(exc)
            last_error, provider_error, failed = await self._errors(read=unreached is None)
            return build_postgres_status(
                described, backend=self.name,
                settings=self.settings, selection=self._provider_selection(), dirty=self._dirty,
                dirty_reason=self._dirty_reason, last_error=unreached or last_error,
                provider_error=provider_error, sync_failure=failed,
                issues=[*(self._last_report.issues if self._last_report else []), *self._notes])
        errors = await self._errors()
        store, read_only = await self._stores.open_reader()
        live = self._live.snapshot(self._live.check_watcher()) if self._live is not None else None
        problem = None if read_only is None else (  # the status's last error
            f"{read_only}; searches answer from the index as it was last written, and memory files "
            f"are not indexed until {self.settings.db_path.parent} can be written")
        return await anyio.to_thread.run_sync(self._status, store, live, problem, errors)

    async def _errors(self, *, read: bool = True) -> tuple[str | None, str | None, dict[str, Any] | None]:
        """The status's (last error, query-embedding failure, last sync's failure): this
        engine's, else as any process recorded them (none read unless ``read``); the recorded
        query failure only until this engine embeds a query."""
        query = None if self._query_embedded or not read else await self._stores.failure("query")
        provider_error = (self._provider_error if self._query_embedded
                          else None if query is None else query["error"])
        return ((None if self._last_error == self._provider_error else self._last_error), provider_error,
                await self._stores.failure("sync") if read else None)

    def _status(self, store: Store | ReadOnlyStore, live: Any, problem: str | None,
                errors: tuple[str | None, str | None, dict[str, Any] | None]) -> MemoryStatus:
        from fallback.engine.status import build_status
        sel = self._provider_selection()
        last_error, provider_error, failed = errors
        return build_status(
            store, backend=self.name, settings=self.settings, selection=sel,
            vector=dict(self._vector_index().status()) if sel.provider is not None else None,
            dirty=self._dirty, dirty_reason=self._dirty_reason, synced=self._synced,
            last_error=problem or last_error, live=live, notes=self._notes, provider_error=provider_error,
            sync_failure=failed)
