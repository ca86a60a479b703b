"""MemoryManager: picks the backend, falls back to the builtin engine, applies scope and citations.

The one entry point of the library for one agent's ``memory_search`` and ``memory_get``
(docs/library.md); the qmd fallback and its breaker: docs/qmd.md, "Faults and fallback".
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Literal

import anyio

from fallback.background import BackgroundTasks
from fallback.contract import MemoryBackend, ProgressCallback, SearchOutcome
from fallback.errors import (
    BackendUnavailableError,
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
    Source,
)
from fallback.request import ReadRequest, SearchRequest, require_workspace, workspace_relative
from fallback.sources.read_page import shared_name, transcript_name
from qmdbridge.config import ResolvedAgent
from qmdbridge.paths import qmd_home
from qmdbridge.policy.breaker import CircuitBreaker, breaker_scope
from qmdbridge.policy.citations import citation_lines, citations_enabled, cite
from qmdbridge.qmd.collections import ManagedCollection, build_collections, fallback_engine_settings
from qmdbridge.qmd.errors import QmdBusyError, QmdIndexLostError, QmdQueryTooLongError, one_line
from qmdbridge.qmd.parse import clamp_injected
from qmdbridge.qmd.query_text import search_limits
from qmdbridge.sidecar import QmdSidecar

if TYPE_CHECKING:  # the engine module is imported when the engine is first made
    from fallback.engine.builtin import BuiltinEngine
    from fallback.index.report import SyncReport

__all__ = ["BlockingMemoryManager", "MemoryManager", "decorate_citations", "require_workspace"]

log = logging.getLogger("qmdbridge")

BackendName = Literal["builtin", "qmd", "none"]

# A qmd fallback answers from the builtin index as it is: its pre-search sync gets this long, ms.
FALLBACK_SYNC_BUDGET_MS = 50
# The builtin engine is opened beside a qmd search this long (ms) before the search's deadline
# (limits.timeoutMs), so a fallback at the deadline finds it open; a search that ends sooner
# (nearly all do) never pays for opening it, and a fallback before then opens it itself.
BUILTIN_PREPARE_LEAD_MS = 1000
# How long past ``limits.timeoutMs`` the backstop of a qmd search waits, in ms: a timed-out
# call's kill and reap (at most 3 s, ``qmd.runner``) and its busy check come first.
BACKSTOP_GRACE_MS = 4000
# The warning of a qmd answer to a search that asked for the ranking trace.
NO_QMD_EXPLAIN = "explain: qmd answered and reports no ranking trace; use --backend builtin"


def decorate_citations(results: list[MemorySearchResult], *, include: bool,
                       max_injected_chars: int | None = None) -> list[MemorySearchResult]:
    """New ``results`` (hits, best first), each with its ``citation`` (the snippet's lines) and,
    with ``include``, the ``Source:`` footer; then cut to ``max_injected_chars`` (qmd's total
    snippet budget in chars, spec 2.13; ``None``: none) by :func:`~qmdbridge.qmd.parse.clamp_injected`."""
    out: list[MemorySearchResult] = []
    for r in results:
        citation, snippet = cite(r.path, r.snippet_start_line, r.snippet_end_line, r.snippet,
                                 include=include)
        out.append(r.model_copy(update={"citation": citation, "snippet": snippet}))
    return out if max_injected_chars is None else clamp_injected(out, max_chars=max_injected_chars)


class MemoryManager:
    """Async memory service for one agent (anyio).

    ``async with MemoryManager(agent) as m`` opens the task group the backends' background work
    runs in; leaving it (or ``close()``) cancels it and closes both backends. A ``cli`` manager
    also works without ``async with``. Every method raises ``ManagerClosedError`` after ``close()``.

    Args:
        agent: the resolved agent config.
        backend: overrides ``memory.backend``.
        mode: ``cli`` (one-shot: no timers or watchers; searches wait for qmd's start-up) or
            ``full`` (long-lived: start-up, timers and watchers run in the background).
        env: for qmd discovery and the child processes (default ``os.environ``).
        now_ms: the clock, epoch ms.
        qmd_runner: runs each qmd process (default ``run_command``; the one-shot CLI passes the
            calls it started ahead).
    """

    def __init__(self, agent: ResolvedAgent, *, backend: BackendName | None = None,
                 mode: Literal["cli", "full"] = "cli", env: Mapping[str, str] | None = None,
                 now_ms: Callable[[], int] | None = None, qmd_runner: Any = None) -> None:
        self.agent = agent
        self.backend_name: BackendName = backend or agent.memory.backend
        self.mode = mode
        self._env = dict(os.environ if env is None else env)
        self._now_ms = now_ms or (lambda: int(time.time() * 1000))
        self.tasks = BackgroundTasks(now_ms=self._now_ms)
        self._builtin: BuiltinEngine | None = None
        self._builtin_started = False
        self._closed = False
        self.breaker = CircuitBreaker(
            qmd_home(agent.state_dir, agent.agent_id).breaker if self.backend_name == "qmd" else None,
            scope=breaker_scope(agent.memory.qmd.command, agent.memory.qmd.search_mode, self._env))
        self.sidecar = (QmdSidecar(agent, mode=mode, env=self._env, now_ms=self._now_ms,
                                   background=self._background, runner=qmd_runner)
                        if self.backend_name == "qmd" else None)
        self._last_fallback: FallbackInfo | None = None
        # ms into a qmd search before the builtin engine is opened beside it; None: the search
        # deadline minus BUILTIN_PREPARE_LEAD_MS
        self.builtin_prepare_delay_ms: int | None = None

    async def __aenter__(self) -> MemoryManager:
        self._check_open()
        await self.tasks.__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> None:
        try:
            await self.close()
        finally:
            await self.tasks.__aexit__(*exc)

    def _check_open(self) -> None:
        if self._closed:
            raise ManagerClosedError("memory manager is closed")

    def _background(self) -> BackgroundTasks:
        """The task group for a backend's ``start`` (open, for a ``full`` manager)."""
        if self.mode == "full" and not self.tasks.is_open:
            raise UsageError("a long-lived (mode='full') MemoryManager runs background work: "
                             "use `async with MemoryManager(...)`")
        return self.tasks

    async def builtin(self) -> BuiltinEngine:
        """The builtin engine (created on first use)."""
        self._check_open()
        if self._builtin is None:
            from fallback.embeddings import select_provider
            from fallback.engine.builtin import BuiltinEngine

            selection = select_provider(self.agent.memory_search, env=self._env)
            settings = self.agent.engine
            if self.backend_name == "qmd":  # the fallback indexes what qmd's collections hold
                settings = fallback_engine_settings(self.agent)
            self._builtin = BuiltinEngine(settings, provider_selection=selection,
                                          now_ms=self._now_ms)
        return self._builtin

    async def qmd(self) -> MemoryBackend | None:
        """The started qmd backend (waiting for its start-up), or ``None`` when qmd is not
        configured or cannot be found or started (the reason is kept for ``status()``)."""
        backend, _ = await self._qmd_started(wait=True)
        return backend

    async def _qmd_started(self, *, wait: bool) -> tuple[MemoryBackend | None, str | None]:
        self._check_open()
        if self.sidecar is None:
            return None, "qmd is not the configured backend"
        return await self.sidecar.get(wait=wait)

    async def search(self, query: str, *, max_results: int | None = None,
                     min_score: float | None = None, session_key: str | None = None,
                     sources: list[Source] | None = None, explain: bool = False,
                     inherited_session_keys: Sequence[str] = (),
                     corpus: str | None = None,
                     progress: ProgressCallback | None = None) -> SearchResponse:
        """Run ``memory_search``.

        Args:
            query: the user's text (blank: a usage error).
            max_results / min_score: hits wanted, and the score floor in [0, 1]; ``None``: ``query.*``'s
                on the builtin engine, ``limits.maxResults`` and no floor on qmd.
            session_key / inherited_session_keys: the runtime's session key (``None``: owner call) and
                the keys it acts for, read by the scope rules.
            sources / corpus: ``memory`` and/or ``sessions``; ``memory`` | ``sessions`` | ``all``
                (``None``) | ``wiki``, which narrows ``sources``.
            explain: attach the builtin engine's ranking trace to every hit.
            progress: :data:`~fallback.contract.ProgressCallback` of a sync the builtin engine runs first.

        Returns:
            The ``SearchResponse``; no results, with ``denied`` or a warning, when scope refuses or
            the corpus is empty.

        Raises:
            UsageError: blank query, bad limit, unknown corpus.
            BackendUnavailableError: no backend could answer.
        """
        admitted = self._admit(query, max_results=max_results, min_score=min_score,
                               session_key=session_key, sources=sources, explain=explain,
                               inherited_session_keys=inherited_session_keys, corpus=corpus)
        if isinstance(admitted, SearchResponse):
            return admitted
        request, include, chosen_corpus = admitted
        cfg = self.agent.memory
        fallback: FallbackInfo | None = None
        if self.backend_name == "qmd":
            async with anyio.create_task_group() as tg:
                qmd_done = anyio.Event()  # the builtin engine opens beside a slow qmd search
                tg.start_soon(self._prepare_builtin, qmd_done)
                answered, fallback = await self._search_qmd(request)
                qmd_done.set()
            if answered is not None:
                results = decorate_citations(answered.results, include=include,
                                             max_injected_chars=cfg.qmd.limits.max_injected_chars)
                warnings = [*answered.warnings, *([NO_QMD_EXPLAIN] if explain else [])]
                return SearchResponse(backend="qmd", provider=answered.provider,
                                      model=answered.model, mode=answered.mode,
                                      citations=cfg.citations, results=results, warnings=warnings,
                                      corpus=chosen_corpus)
        engine = await self.builtin()
        try:
            outcome = await engine.search(
                request, sync_budget_ms=FALLBACK_SYNC_BUDGET_MS if fallback else None,
                progress=progress)
        except BackendUnavailableError as exc:
            if fallback is not None:
                raise BackendUnavailableError(
                    "qmd", f"{fallback.reason}; builtin fallback unavailable: {exc.reason}") from exc
            raise
        hits = outcome.results
        if fallback is not None:
            limit, _ = search_limits(cfg.qmd.limits.max_results, max_results, None)
            hits = hits[:limit]  # a fallback answers as many hits as qmd would have
        return self._builtin_answer(outcome, hits, fallback=fallback, include=include,
                                    corpus=chosen_corpus)

    def search_settled(self, query: str, **kwargs: Any) -> SearchResponse | None:
        """:meth:`search` (same arguments, checks, ranking and answer) in the caller's thread,
        blocking, when the builtin engine answers without the event loop
        (``BuiltinEngine.search_settled``) or no backend needs to run; ``None``: await
        :meth:`search`. Raises as :meth:`search` for the request itself."""
        admitted = self._admit(query, **{k: v for k, v in kwargs.items() if k != "progress"})
        if isinstance(admitted, SearchResponse):
            return admitted
        request, include, corpus = admitted
        if self.backend_name != "builtin" or self._builtin is None:
            return None
        outcome = self._builtin.search_settled(request)
        return None if outcome is None else self._builtin_answer(
            outcome, outcome.results, fallback=None, include=include, corpus=corpus)

    def _admit(self, query: str, *, max_results: int | None = None,
               min_score: float | None = None, session_key: str | None = None,
               sources: list[Source] | None = None, explain: bool = False,
               inherited_session_keys: Sequence[str] = (),
               corpus: str | None = None) -> SearchResponse | tuple[SearchRequest, bool, str]:
        """:meth:`search`'s checks: its answer when scope denies or the corpus is empty, else
        ``(request narrowed to the corpus, whether snippets get citations, the corpus)``."""
        self._check_open()
        request = SearchRequest.of(query, max_results=max_results, min_score=min_score,
                                   session_key=session_key, sources=sources, explain=explain)
        require_workspace(self.agent.workspace_dir)
        from qmdbridge.policy.corpus import search_corpus, sessions_off_reason
        from qmdbridge.policy.scope import evaluate_scope

        cfg = self.agent.memory
        chosen = search_corpus(corpus, sessions_off=sessions_off_reason(
            backend=self.backend_name, qmd_sessions=cfg.qmd.sessions.enabled,
            builtin_sources=self.agent.memory_search.sources))
        if isinstance(inherited_session_keys, str) or not all(
                isinstance(k, str) for k in inherited_session_keys):
            raise UsageError("inherited session keys must be a list of strings")
        decision = evaluate_scope(cfg.qmd.scope, session_key, inherited_keys=inherited_session_keys)
        self._check_enabled()
        if not decision.allowed:
            log.warning("memory search denied by scope: %s", decision.reason)
            return SearchResponse(backend=self.backend_name, citations=cfg.citations,
                                  results=[], denied=decision, corpus=chosen.corpus)
        if chosen.sources == ():
            return SearchResponse(backend=self.backend_name, citations=cfg.citations, results=[],
                                  corpus=chosen.corpus, warnings=[chosen.note] if chosen.note else [])
        if chosen.sources is not None:  # the corpus narrows the sources asked for
            request = replace(request, sources=tuple(
                s for s in chosen.sources if sources is None or s in sources))
        return request, citations_enabled(cfg.citations, session_key), chosen.corpus

    def _builtin_answer(self, outcome: SearchOutcome, hits: list[MemorySearchResult], *,
                        fallback: FallbackInfo | None, include: bool, corpus: str) -> SearchResponse:
        """The builtin engine's ``outcome`` (its ``hits`` cut for a qmd fallback) as the answer,
        citations decorated."""
        return SearchResponse(backend="builtin", fallback=fallback, provider=outcome.provider,
                              model=outcome.model, mode=outcome.mode,
                              citations=self.agent.memory.citations,
                              results=decorate_citations(hits, include=include),
                              warnings=outcome.warnings, corpus=corpus)

    async def _search_qmd(self, request: SearchRequest) -> tuple[
            SearchOutcome | None, FallbackInfo | None]:
        """Try qmd under the search breaker and ``limits.timeoutMs``; ``(None, fallback)`` when
        it can't answer. Start-up happens before the deadline starts and never opens the
        search breaker."""
        now = self._now_ms()
        if not self.breaker.allow(now):
            reason = self.breaker.state.last_failure or "qmd failed recently"
            retry_s = self.breaker.describe(now)["retryInMs"] // 1000
            return None, FallbackInfo(from_backend="qmd",
                                      reason=f"{reason} (circuit open; retry in {retry_s}s)")
        backend, why = await self._qmd_started(wait=self.mode == "cli")
        if backend is None:
            # the sidecar already dropped the probe if the start-up failed
            return None, self._remember(why or "qmd not available", forget_probe=False)
        timeout_ms = self.agent.memory.qmd.limits.timeout_ms
        try:
            # The backend's calls own the deadline and name the command that passed it; this
            # guard only stops a step outside a call, late enough not to race a call's own kill,
            # reap and report (the same reason whether a call ran here or was started ahead).
            with anyio.fail_after((timeout_ms + BACKSTOP_GRACE_MS) / 1000):
                outcome = await backend.search(request)
        except TimeoutError as exc:  # BackendTimeoutError is a TimeoutError too; its reason, as below
            reason = getattr(exc, "reason", None) or (
                f"qmd search timed out after {timeout_ms}ms (memory.qmd.limits.timeoutMs)")
            return None, self._search_failed(reason)
        except (QmdQueryTooLongError, QmdIndexLostError, QmdBusyError) as exc:
            # not a qmd failure: the caller's pasted text, an index being re-indexed after it was
            # lost, or qmd's own update holding its index
            log.log(logging.WARNING if isinstance(exc, QmdIndexLostError) else logging.INFO,
                    "%s; answering from builtin without opening the breaker", exc.reason)
            return None, self._remember(exc.reason, forget_probe=False)
        except MemorySearchError as exc:
            return None, self._search_failed(getattr(exc, "reason", None) or str(exc))
        except Exception as exc:  # fallback boundary: any qmd defect must not silence memory
            log.exception("qmd backend raised unexpectedly; answering from builtin")
            return None, self._search_failed(f"{type(exc).__name__}: {exc}")
        self.breaker.record_success(self._now_ms())
        self._last_fallback = None
        return outcome, None

    def _search_failed(self, reason: str) -> FallbackInfo:
        self.breaker.record_failure(one_line(reason), self._now_ms())
        log.warning("qmd search failed; answering from builtin: %s", one_line(reason))
        return self._remember(reason)

    async def _prepare_builtin(self, qmd_done: anyio.Event) -> None:
        delay_ms = self.builtin_prepare_delay_ms
        if delay_ms is None:
            delay_ms = max(0, self.agent.memory.qmd.limits.timeout_ms - BUILTIN_PREPARE_LEAD_MS)
        with anyio.move_on_after(delay_ms / 1000):
            await qmd_done.wait()
        if qmd_done.is_set():
            return
        try:
            engine = await self.builtin()
            await engine.prepare()
        except MemorySearchError as exc:  # reported by the fallback search itself, if needed
            log.debug("builtin engine not ready: %s", exc)

    def _remember(self, reason: str, *, forget_probe: bool = True) -> FallbackInfo:
        if forget_probe and self.sidecar is not None:
            self.sidecar.forget_probe()  # probe again next time: qmd may have changed
        self._last_fallback = FallbackInfo(from_backend="qmd", reason=one_line(reason))
        return self._last_fallback

    async def read_file(self, rel_path: str, *, from_line: int | None = None,
                        lines: int | None = None, corpus: str | None = None,
                        from_char: int | None = None) -> MemoryReadResult:
        """Run ``memory_get``: read a memory file page (default 120 lines / 12,000 chars); a
        line cut at the budget is read on from code point ``from_char`` of line ``from_line``.

        In qmd mode ``qmd/<collection>/...`` paths are read by qmd's backend, ``sessions/<file>``
        and (on the postgres store) ``shared/<owner>/...`` by the builtin engine, other paths
        by either. ``corpus``: ``all`` (``None``) reads memory files and session transcripts,
        ``memory`` memory files only; ``wiki`` refuses every path.

        Raises:
            PathRefusedError: not a memory file, a transcript under ``corpus`` ``memory``, or
                ``corpus`` is ``wiki``.
            UsageError: ``from_line``/``lines``/``from_char`` below 1, or an unknown corpus.
            BackendUnavailableError: ``memory.backend`` is ``none`` (the memory tools are disabled).
        """
        try:
            return await self._read_file(ReadRequest.of(rel_path, from_line=from_line, lines=lines,
                                                        from_char=from_char), corpus=corpus)
        except PathRefusedError as exc:
            cited = citation_lines(rel_path) if exc.hint is None else None
            if cited is None:
                raise
            path, start, end = cited
            raise PathRefusedError(exc.path, exc.reason, hint=(
                f"that is a citation: read it with path {path!r}, from {start}, lines "
                f"{end - start + 1}")) from exc

    def _check_enabled(self) -> None:
        """Refuse a call when ``memory.backend`` is ``none`` (after the request's own checks)."""
        if self.backend_name == "none":
            raise BackendUnavailableError("none", "memory tools are disabled (memory.backend = none)")

    async def _read_file(self, request: ReadRequest, *, corpus: str | None) -> MemoryReadResult:
        self._check_open()
        rel_path = request.path
        self._check_enabled()
        from qmdbridge.policy.corpus import get_corpus, outside_corpus

        if (chosen := get_corpus(corpus)).note is not None:
            raise PathRefusedError(rel_path, chosen.note)
        require_workspace(self.agent.workspace_dir)
        wanted = workspace_relative(request.path, self.agent.workspace_dir)
        if wanted != request.path:  # an absolute path: read as the workspace-relative one
            try:
                return await self._read_file(replace(request, path=wanted), corpus=corpus)
            except PathRefusedError as exc:
                if not wanted.startswith("../"):
                    raise
                raise PathRefusedError(
                    request.path, f"outside the workspace {self.agent.workspace_dir} and its extra "
                    "paths (memory is MEMORY.md, memory/**/*.md and memorySearch.extraPaths)") from exc
        if (outside := outside_corpus(chosen, self._read_source(request.path))) is not None:
            raise PathRefusedError(rel_path, outside)
        qmd_path = rel_path.strip().startswith("qmd/")
        # a session hit of the builtin engine (sessions/<transcript>, a fallback answer) is
        # read where it was found: qmd's session hits are its own qmd/sessions-<agent>/ paths;
        # so is a hit of a scope another agent shares (shared/<owner>/..., the postgres store's)
        builtin_only = transcript_name(rel_path) is not None or (
            self.agent.memory_search.store.driver == "postgres" and shared_name(rel_path) is not None)
        if self.backend_name == "qmd" and not builtin_only and (
                qmd_path or self.breaker.allow(self._now_ms())):
            # qmd/<collection> paths need qmd; others may come from the builtin engine while a
            # long-lived manager's qmd is still starting
            backend, _ = await self._qmd_started(wait=qmd_path or self.mode == "cli")
            if backend is not None:
                return await backend.read_file(request.path, from_line=request.from_line,
                                               lines=request.lines, from_char=request.from_char)
        engine = await self.builtin()
        return await engine.read_file(request.path, from_line=request.from_line,
                                      lines=request.lines, from_char=request.from_char)

    def _read_source(self, rel_path: str) -> Literal["memory", "sessions"]:
        """The source a ``memory_get`` path reads: ``sessions`` for a transcript a session hit
        cites (``sessions/<file>.jsonl``, or a file of qmd's ``sessions-<agent>`` collection)."""
        if transcript_name(rel_path) is not None:
            return "sessions"
        parts = rel_path.strip().split("/", 2)
        if self.backend_name != "qmd" or len(parts) < 3 or parts[0] != "qmd":
            return "memory"
        return next((c.source for c in self._qmd_collections() if c.name == parts[1]), "memory")

    def _qmd_collections(self) -> list[ManagedCollection]:
        """qmd's collections of this agent, as the config makes them."""
        return build_collections(self.agent, sessions_dir=qmd_home(
            self.agent.state_dir, self.agent.agent_id).sessions_dir)

    async def status(self) -> MemoryStatus:
        """The status of the backend that would answer now, with both backends' health in
        ``backends`` (``builtin``, ``qmd``: collections, files, breakers), the task group in
        ``background`` and ``fallback`` while qmd is configured but not answering."""
        self._check_open()
        engine = await self.builtin()
        builtin_status = await engine.status()
        backends: dict[str, Any] = {"builtin": builtin_status.to_json_dict()}
        common = {"backends": backends, "background": self.tasks.status(),
                  "config_warnings": list(self.agent.config_warnings)}
        if self.backend_name == "none":  # the index is kept; the memory tools answer nothing
            return builtin_status.model_copy(update={**common, "backend": "none"})
        if self.backend_name != "qmd":
            return builtin_status.model_copy(update=common)
        now = self._now_ms()
        qmd_view: dict[str, Any] = {
            "configured": True, "breaker": self.breaker.describe(now),
            "collections": [{"name": c.name, "path": str(c.path), "pattern": c.pattern}
                            for c in self._qmd_collections()]}
        qmd_status: MemoryStatus | None = None
        try:
            backend, why = await self._qmd_started(wait=self.mode == "cli")
            if backend is not None:
                qmd_status = await backend.status()
        except MemorySearchError as exc:
            why = str(exc)
        qmd_view.update(qmd_status.to_json_dict() if qmd_status is not None
                        else {"healthy": False, "lastError": why})
        if self.sidecar is not None:
            qmd_view.update(self.sidecar.describe())
        backends["qmd"] = qmd_view
        if qmd_status is not None and self.breaker.allow(now):
            return qmd_status.model_copy(update=common)
        reason = (why if qmd_status is None else None) or self.breaker.state.last_failure or (
            self._last_fallback.reason if self._last_fallback else "qmd unavailable")
        return builtin_status.model_copy(update={
            **common, "fallback": FallbackInfo(from_backend="qmd", reason=reason)})

    async def start(self) -> None:
        """Start ``full`` mode's background work: the builtin engine's live mode and qmd's
        start-up (awaited only with ``update.waitForBootSync``).

        Raises ``UsageError`` (not entered with ``async with``) or ``ManagerClosedError``.
        """
        self._check_open()
        if not self.tasks.is_open:
            raise UsageError("MemoryManager.start() runs background work: use "
                             "`async with MemoryManager(...)`")
        engine = await self.builtin()
        if not self._builtin_started:
            self._builtin_started = True
            await engine.start(self.tasks)
        if self.backend_name == "qmd":
            await self._qmd_started(wait=self.agent.memory.qmd.update.wait_for_boot_sync)

    async def sync(self, *, reason: str = "manual", force: bool = False,
                   progress: ProgressCallback | None = None) -> SyncReport:
        """Sync the configured backend and the builtin index (the fallback), arguments as
        :meth:`fallback.contract.MemoryBackend.sync` (``progress``: of the builtin sync); returns
        the builtin index's :class:`~fallback.index.report.SyncReport`.

        Raises ``IndexStoreError`` / ``BackendUnavailableError``: the sync failed.
        """
        self._check_open()
        require_workspace(self.agent.workspace_dir)
        if self.backend_name == "qmd":
            backend = await self.qmd()
            if backend is not None:
                await backend.sync(reason=reason, force=force)
        engine = await self.builtin()
        return await engine.sync(reason=reason, force=force, progress=progress)

    async def close(self) -> None:
        """Cancel the background task group (every task of both backends, their qmd children
        killed and reaped), then close both backends; idempotent, callable from any task."""
        if self._closed:
            return
        self._closed = True
        with anyio.CancelScope(shield=True):
            await self.tasks.aclose()
            if self.sidecar is not None:
                await self.sidecar.close()
            if self._builtin is not None:
                await self._builtin.close()


class BlockingMemoryManager:
    """Blocking facade over :class:`MemoryManager` for scripts and simple hosts: owns an
    anyio blocking portal for its lifetime, enters the manager there and forwards each method
    (same names and arguments) with ``portal.call``. Use as a context manager or ``close()``."""

    def __init__(self, agent: ResolvedAgent, **kwargs: Any) -> None:
        from anyio.from_thread import start_blocking_portal

        self._portal_cm = start_blocking_portal()
        self._portal = self._portal_cm.__enter__()
        self._manager = MemoryManager(agent, **kwargs)
        try:
            self._entered = self._portal.wrap_async_context_manager(self._manager)
            self._entered.__enter__()
        except BaseException:
            self._portal_cm.__exit__(None, None, None)
            raise
        self._closed = False

    def __enter__(self) -> BlockingMemoryManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, fn: Any) -> Any:
        if self._closed:
            raise ManagerClosedError("memory manager is closed")
        return self._portal.call(fn)

    def search(self, query: str, **kwargs: Any) -> SearchResponse:
        """See :meth:`MemoryManager.search`; answered in this thread when
        :meth:`MemoryManager.search_settled` can, else in the portal."""
        answer = None if self._closed else self._manager.search_settled(query, **kwargs)
        return answer if answer is not None else self._call(
            lambda: self._manager.search(query, **kwargs))

    def read_file(self, rel_path: str, **kwargs: Any) -> MemoryReadResult:
        """See :meth:`MemoryManager.read_file`."""
        return self._call(lambda: self._manager.read_file(rel_path, **kwargs))

    def status(self) -> MemoryStatus:
        """See :meth:`MemoryManager.status`."""
        return self._call(self._manager.status)

    def sync(self, *, reason: str = "manual", force: bool = False) -> SyncReport:
        """See :meth:`MemoryManager.sync`."""
        return self._call(lambda: self._manager.sync(reason=reason, force=force))

    def start(self) -> None:
        """See :meth:`MemoryManager.start`."""
        self._call(self._manager.start)

    def close(self) -> None:
        """Close the manager (its background tasks included) and stop the portal; idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            self._entered.__exit__(None, None, None)
        finally:
            self._portal_cm.__exit__(None, None, None)
