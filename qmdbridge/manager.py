"""MemoryManager: picks the backend, falls back to the builtin engine, applies scope and citations.

The manager is the one entry point of the library. It serves ``memory_search`` and
``memory_get`` for one agent:

- ``memory.backend = "builtin"``: the in-process SQLite engine answers.
- ``memory.backend = "qmd"``: the qmd sidecar answers while it is healthy. When qmd is missing,
  foreign, failing, hanging or printing garbage, the builtin engine answers the same call
  (within the search deadline) and the response says ``fallback: {from: "qmd", reason}``. A
  circuit breaker (``qmdbridge/policy/breaker.py``) retries qmd after a cooldown, so one failure never
  makes the fallback permanent.
- ``memory.backend = "none"``: memory tools are disabled.

Scope rules (``memory.qmd.scope``) are enforced here for every backend, so a group chat cannot
read DM-only memory through the fallback. Citations are decorated here for every backend.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Literal

import anyio

from fallback.contract import MemoryBackend
from fallback.errors import (
    BackendUnavailableError,
    ManagerClosedError,
    MemorySearchError,
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
from qmdbridge.config import ResolvedAgent
from qmdbridge.policy.breaker import CircuitBreaker

if TYPE_CHECKING:
    from fallback.engine.builtin import BuiltinEngine

__all__ = ["BlockingMemoryManager", "MemoryManager", "decorate_citations", "format_citation"]

log = logging.getLogger("qmdbridge")

BackendName = Literal["builtin", "qmd", "none"]

# Extra time (ms) the manager grants a qmd call (probe, start and search together) beyond
# limits.timeoutMs; the fallback answer must follow within 100 ms of the deadline.
QMD_DEADLINE_SLACK_MS = 0
# Upper bound of counts and line numbers a caller may pass (keeps JSON integers in range).
MAX_LIMIT = 2**31 - 1
# The warning of a qmd answer to a search that asked for the ranking trace.
NO_QMD_EXPLAIN = "explain: qmd answered and reports no ranking trace; use --backend builtin"


def format_citation(path: str, start_line: int, end_line: int) -> str:
    """``path#La`` when one line, else ``path#La-Lb`` (spec 9)."""
    if start_line == end_line:
        return f"{path}#L{start_line}"
    return f"{path}#L{start_line}-L{end_line}"


def decorate_citations(results: list[MemorySearchResult], *, include: bool,
                       max_injected_chars: int | None = None) -> list[MemorySearchResult]:
    """Add ``citation`` to every hit; when ``include``, append the ``Source:`` footer.

    Args:
        results: hits, best first.
        include: whether the footer goes into the snippet (citations on / auto in a direct
            chat or owner call).
        max_injected_chars: total snippet budget in chars (qmd backend: applied after the
            footer, spec 2.13); ``None`` = no budget.

    Returns:
        New hits; the budget keeps whole snippets until one does not fit, cuts that one to the
        remaining budget and stops.
    """
    out: list[MemorySearchResult] = []
    budget = max_injected_chars
    for r in results:
        citation = format_citation(r.path, r.start_line, r.end_line)
        snippet = f"{r.snippet.strip()}\n\nSource: {citation}" if include else r.snippet
        if budget is not None:
            if budget <= 0:
                break
            if len(snippet) > budget:
                out.append(r.model_copy(update={"citation": citation, "snippet": snippet[:budget]}))
                break
            budget -= len(snippet)
        out.append(r.model_copy(update={"citation": citation, "snippet": snippet}))
    return out


class MemoryManager:
    """Async memory service for one agent (anyio).

    Use ``async with MemoryManager(agent) as m`` or call ``close()``. All methods raise
    ``ManagerClosedError`` after ``close()``.

    Args:
        agent: the resolved agent config (``qmdbridge.config.resolve_agent``).
        backend: override of ``memory.backend`` (the CLI's ``--backend``).
        mode: ``cli`` (one-shot: no timers, no watchers) or ``full`` (long-lived ``serve``:
            qmd boot update and timers, file watchers).
        env: environment for qmd discovery and the child processes (default ``os.environ``).
        now_ms: clock in epoch ms (tests).
    """

    def __init__(self, agent: ResolvedAgent, *, backend: BackendName | None = None,
                 mode: Literal["cli", "full"] = "cli", env: Mapping[str, str] | None = None,
                 now_ms: Callable[[], int] | None = None) -> None:
        self.agent = agent
        self.backend_name: BackendName = backend or agent.memory.backend
        self.mode = mode
        self._env = dict(os.environ if env is None else env)
        self._now_ms = now_ms or (lambda: int(time.time() * 1000))
        self._builtin: BuiltinEngine | None = None
        self._qmd: MemoryBackend | None = None
        self._qmd_unavailable: str | None = None
        self._qmd_started = False
        self._closed = False
        self._lock = anyio.Lock()
        qmd_dir = agent.state_dir / "agents" / agent.agent_id / "qmd"
        self.breaker = CircuitBreaker(qmd_dir / "breaker.json" if self.backend_name == "qmd" else None,
                                      scope=f"{agent.memory.qmd.command}\0{agent.memory.qmd.search_mode}")
        self._probe_cache: Any = None
        self._last_fallback: FallbackInfo | None = None
        self._start_task: Any = None
        self._qmd_location: Any = None  # the last probe (reason, folders searched, PATH)

    async def __aenter__(self) -> MemoryManager:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- backends ---------------------------------------------------------------------------

    @property
    def probe_cache(self) -> Any:
        """The on-disk cache of qmd probe results (``qmdbridge/qmd/probe_cache.py``)."""
        if self._probe_cache is None:
            from qmdbridge.qmd.probe_cache import ProbeCache

            self._probe_cache = ProbeCache(self.agent.state_dir / "qmd" / "probe-cache.json",
                                           now_ms=self._now_ms)
        return self._probe_cache

    @property
    def _probe_key(self) -> str:
        from qmdbridge.qmd.probe_cache import ProbeCache

        return ProbeCache.key(self.agent.memory.qmd.command, self._env.get("PATH", ""))

    def _check_open(self) -> None:
        if self._closed:
            raise ManagerClosedError("memory manager is closed")

    def _check_workspace(self) -> None:
        """A missing workspace is a caller's mistake, not an empty memory: syncing it would
        empty the index."""
        ws = self.agent.workspace_dir
        if not ws.is_dir():
            what = "is not a directory" if ws.exists() else "does not exist"
            raise UsageError(f"workspace {what}: {ws} (pass --workspace or set agents.defaults.workspace)")

    async def builtin(self) -> BuiltinEngine:
        """The builtin engine (created on first use)."""
        self._check_open()
        if self._builtin is None:
            from fallback.embeddings import select_provider
            from fallback.engine.builtin import BuiltinEngine

            selection = select_provider(self.agent.memory_search, env=self._env)
            settings = self.agent.engine
            if self.backend_name == "qmd":  # the fallback indexes what qmd's collections hold
                from qmdbridge.qmd.collections import fallback_engine_settings

                settings = fallback_engine_settings(self.agent)
            self._builtin = BuiltinEngine(settings, provider_selection=selection,
                                          now_ms=self._now_ms)
        return self._builtin

    async def qmd(self) -> MemoryBackend | None:
        """The qmd backend, or ``None`` when qmd is not configured or cannot be found/started.

        The reason it is unavailable is kept for ``status()`` and the fallback answer.
        """
        self._check_open()
        if self.backend_name != "qmd":
            return None
        async with self._lock:
            if self._qmd is None and self._qmd_unavailable is not None and self.breaker.allow(self._now_ms()):
                self._qmd_unavailable = None  # cooldown over: look for qmd again
            if self._qmd is None and self._qmd_unavailable is None:
                from qmdbridge.qmd.backend import QmdBackend
                from qmdbridge.qmd.locate import probe_qmd

                cached = self.probe_cache.get(self._probe_key)
                extras: dict[str, Any] = {}
                if cached is not None:
                    location, extras = cached
                else:
                    location = await probe_qmd(self.agent.memory.qmd.command, env=self._env)
                    self._qmd_location = location
                    if not location.usable:
                        self._qmd_unavailable = location.reason or "qmd not available"
                        return None
                    self.probe_cache.put(self._probe_key, location)
                self._qmd = QmdBackend(self.agent, location=location, mode=self.mode, env=self._env,
                                       now_ms=self._now_ms)
                if isinstance(extras.get("multiC"), bool):
                    self._qmd._multi_c = extras["multiC"]  # type: ignore[attr-defined]
            if self._qmd is not None and not self._qmd_started:
                self._qmd_started = True
                await self._qmd.start()  # type: ignore[attr-defined]
        return self._qmd

    # -- the two tools ----------------------------------------------------------------------

    async def search(self, query: str, *, max_results: int | None = None,
                     min_score: float | None = None, session_key: str | None = None,
                     sources: list[Source] | None = None, explain: bool = False) -> SearchResponse:
        """Run ``memory_search``.

        Args:
            query: the user's text (any string; a blank one is a usage error).
            max_results: hits wanted (default ``query.maxResults`` / ``limits.maxResults``, 6).
            min_score: score floor in [0, 1] (default ``query.minScore``, 0.35).
            session_key: the runtime's session key (``None`` = owner call).
            sources: restrict to ``memory`` and/or ``sessions``.
            explain: attach the builtin engine's ranking trace to every hit (``explain``);
                qmd answers carry none and say so in ``warnings``.

        Returns:
            ``SearchResponse`` naming the backend that answered and, when it fell back, why;
            ``results == []`` with ``denied`` set when the scope rules refuse the session.

        Raises:
            UsageError: blank query or a bad limit.
            BackendUnavailableError: no backend could answer (builtin failed too, or disabled).
        """
        self._check_open()
        if not isinstance(query, str):
            raise UsageError(f"query must be a string, not {type(query).__name__}")
        if not query or not query.strip():
            raise UsageError("query must not be empty")
        if session_key is not None and not isinstance(session_key, str):
            raise UsageError("session key must be a string")
        self._check_workspace()
        if max_results is not None and not 1 <= max_results <= MAX_LIMIT:
            raise UsageError(f"max results must be between 1 and {MAX_LIMIT}")
        if min_score is not None and not 0.0 <= min_score <= 1.0:
            raise UsageError("min score must be between 0 and 1")
        from qmdbridge.policy.scope import citations_enabled, evaluate_scope

        cfg = self.agent.memory
        decision = evaluate_scope(cfg.qmd.scope, session_key)
        include = citations_enabled(cfg.citations, session_key)
        if self.backend_name == "none":
            raise BackendUnavailableError("none", "memory search is disabled (memory.backend = none)")
        if not decision.allowed:
            log.warning("memory search denied by scope: %s", decision.reason)
            return SearchResponse(backend=self.backend_name, citations=cfg.citations,
                                  results=[], denied=decision)
        fallback: FallbackInfo | None = None
        if self.backend_name == "qmd":
            async with anyio.create_task_group() as tg:
                # Open the builtin engine while qmd runs (the process mostly waits on the child),
                # so a fallback answer is ready right after qmd's deadline.
                tg.start_soon(self._prepare_builtin)
                qmd_results, fallback = await self._search_qmd(
                    query, max_results=max_results, min_score=min_score, session_key=session_key,
                    sources=sources)
            if qmd_results is not None:
                limits = cfg.qmd.limits
                results = decorate_citations(qmd_results, include=include,
                                             max_injected_chars=limits.max_injected_chars)
                return SearchResponse(backend="qmd", provider="qmd", model="qmd",
                                      mode=cfg.qmd.search_mode, citations=cfg.citations,
                                      results=results, warnings=[NO_QMD_EXPLAIN] if explain else [])
        engine = await self.builtin()
        try:
            # A qmd fallback answers from the index as it is: a pre-search sync gets 50 ms.
            outcome = await engine.search_detailed(
                query, max_results=max_results, min_score=min_score, session_key=session_key,
                sources=sources, explain=explain,
                **({"sync_budget_ms": 50} if fallback is not None else {}))
        except BackendUnavailableError as exc:
            if fallback is not None:
                raise BackendUnavailableError(
                    "builtin", f"{fallback.reason}; builtin fallback unavailable: {exc.reason}") from exc
            raise
        provider, model, mode = engine.search_info()
        hits = outcome.results
        warnings = [*outcome.warnings, *([engine.last_error] if engine.last_error else [])]
        if fallback is not None:
            limit = cfg.qmd.limits.max_results
            hits = hits[: min(limit, max_results or limit)]
        results = decorate_citations(hits, include=include)
        return SearchResponse(backend="builtin", fallback=fallback, provider=provider,
                              model=model, mode=mode, citations=cfg.citations,
                              results=results, warnings=warnings)

    async def _search_qmd(self, query: str, **kwargs: Any) -> tuple[list[MemorySearchResult] | None,
                                                                   FallbackInfo | None]:
        """Try qmd under the breaker and the deadline; ``(None, fallback)`` when it can't answer."""
        now = self._now_ms()
        if not self.breaker.allow(now):
            reason = self.breaker.state.last_failure or "qmd failed recently"
            info = self.breaker.describe(now)
            return None, FallbackInfo(
                from_backend="qmd",
                reason=f"{reason} (circuit open; retry in {info['retryInMs'] // 1000}s)")
        timeout_ms = self.agent.memory.qmd.limits.timeout_ms
        try:
            with anyio.fail_after((timeout_ms + QMD_DEADLINE_SLACK_MS) / 1000):
                backend = await self.qmd()
                if backend is None:
                    reason = self._qmd_unavailable or "qmd not available"
                    self.breaker.record_failure(self._short(reason), self._now_ms())
                    return None, self._remember(reason)
                results = await backend.search(query, **kwargs)
        except UsageError:
            raise
        except TimeoutError as exc:  # BackendTimeoutError is a TimeoutError too
            reason = str(exc) if str(exc) else f"qmd search timed out after {timeout_ms}ms"
            self.breaker.record_failure(self._short(reason), self._now_ms())
            log.warning("qmd search failed; answering from builtin: %s", self._short(reason))
            return None, self._remember(reason)
        except MemorySearchError as exc:
            reason = getattr(exc, "reason", None) or str(exc)
            self.breaker.record_failure(self._short(reason), self._now_ms())
            log.warning("qmd search failed; answering from builtin: %s", self._short(reason))
            return None, self._remember(reason)
        except Exception as exc:  # fallback boundary: any qmd defect must not silence memory
            reason = f"{type(exc).__name__}: {exc}"
            self.breaker.record_failure(self._short(reason), self._now_ms())
            log.exception("qmd backend raised unexpectedly; answering from builtin")
            return None, self._remember(reason)
        self.breaker.record_success(self._now_ms())
        self._last_fallback = None
        multi_c = getattr(self._qmd, "_multi_c", None)
        cached = self.probe_cache.get(self._probe_key)
        if isinstance(multi_c, bool) and cached is not None and cached[1].get("multiC") != multi_c:
            self.probe_cache.put(self._probe_key, cached[0], multiC=multi_c)
        return results, None

    async def _prepare_builtin(self) -> None:
        try:
            engine = await self.builtin()
            await engine.prepare()
        except MemorySearchError as exc:  # reported by the fallback search itself, if needed
            log.debug("builtin engine not ready: %s", exc)

    @staticmethod
    def _short(reason: str) -> str:
        """One line of a failure for people: qmd's ``error:`` line when its stderr is a stack
        trace, at most 300 chars."""
        lines = [ln.strip() for ln in reason.splitlines() if ln.strip()]
        if len(lines) > 1:
            picked = next((ln for ln in lines[1:] if ln.lower().startswith(("error:", "error ")) ), None)
            head = lines[0].split(": ", 1)[0] if ": " in lines[0] else lines[0]
            reason = f"{head}: {picked}" if picked else lines[0]
        return reason if len(reason) <= 300 else reason[:297] + "..."

    def _remember(self, reason: str) -> FallbackInfo:
        self.probe_cache.forget(self._probe_key)  # probe again next time: qmd may have changed
        self._last_fallback = FallbackInfo(from_backend="qmd", reason=self._short(reason))
        return self._last_fallback

    async def read_file(self, rel_path: str, *, from_line: int | None = None,
                        lines: int | None = None) -> MemoryReadResult:
        """Run ``memory_get``: read a memory file page (default 120 lines / 12,000 chars).

        Raises:
            PathRefusedError: the path is not a memory file (outside the workspace, ``..``,
                absolute, encoded escapes, symlinks, not Markdown).
            UsageError: ``from_line``/``lines`` below 1.
        """
        self._check_open()
        if not isinstance(rel_path, str):
            raise UsageError(f"path must be a string, not {type(rel_path).__name__}")
        if from_line is not None and not 1 <= from_line <= MAX_LIMIT:
            raise UsageError(f"from must be between 1 and {MAX_LIMIT}")
        if lines is not None and not 1 <= lines <= MAX_LIMIT:
            raise UsageError(f"lines must be between 1 and {MAX_LIMIT}")
        self._check_workspace()
        if self.backend_name == "qmd" and (rel_path.strip().startswith("qmd/") or
                                           self.breaker.allow(self._now_ms())):
            try:
                backend = await self.qmd()
            except MemorySearchError:
                backend = None
            if backend is not None:
                return await backend.read_file(rel_path, from_line=from_line, lines=lines)
        engine = await self.builtin()
        return await engine.read_file(rel_path, from_line=from_line, lines=lines)

    async def status(self) -> MemoryStatus:
        """The status of the backend that would answer now, with both backends' health.

        ``backends`` holds ``{"builtin": {...}, "qmd": {...}}``: the builtin engine's counts
        (``files``: files it has indexed, custom collections included in qmd mode) and qmd's
        view (``collections``: the ``{name, path, pattern}`` qmd searches, known even while
        qmd is down; ``files``: documents in qmd's index when it answers). ``fallback`` is set
        when qmd is configured but currently not answering.
        """
        self._check_open()
        engine = await self.builtin()
        builtin_status = await engine.status()
        backends: dict[str, Any] = {"builtin": builtin_status.to_json_dict()}
        if self.backend_name != "qmd":
            return builtin_status.model_copy(update={"backends": backends})
        from qmdbridge.paths import qmd_home
        from qmdbridge.qmd.collections import build_collections

        managed = build_collections(self.agent, sessions_dir=qmd_home(
            self.agent.state_dir, self.agent.agent_id).sessions_dir)
        qmd_view: dict[str, Any] = {
            "configured": True, "breaker": self.breaker.describe(self._now_ms()),
            "collections": [{"name": c.name, "path": str(c.path), "pattern": c.pattern}
                            for c in managed]}
        qmd_status: MemoryStatus | None = None
        try:
            backend = await self.qmd()
            if backend is not None:
                qmd_status = await backend.status()
                qmd_view.update(qmd_status.to_json_dict())
            else:
                qmd_view.update({"healthy": False, "lastError": self._qmd_unavailable})
            loc = self._qmd_location
            if loc is not None:
                qmd_view["locate"] = {"path": loc.path, "found": loc.found, "runtimeOk": loc.runtime_ok,
                                      "version": loc.version, "reason": loc.reason,
                                      "searched": loc.searched, "pathEnv": loc.path_env,
                                      "skipped": loc.skipped}
        except MemorySearchError as exc:
            qmd_view.update({"healthy": False, "lastError": str(exc)})
        backends["qmd"] = qmd_view
        healthy = qmd_status is not None and self.breaker.allow(self._now_ms())
        if healthy and qmd_status is not None:
            return qmd_status.model_copy(update={"backends": backends})
        reason = (self._qmd_unavailable or self.breaker.state.last_failure
                  or (self._last_fallback.reason if self._last_fallback else "qmd unavailable"))
        return builtin_status.model_copy(update={
            "backends": backends, "fallback": FallbackInfo(from_backend="qmd", reason=reason)})

    async def start(self) -> None:
        """Start background work for ``full`` mode: the builtin engine's watcher and first sync,
        qmd's collections, boot update and timers. One-shot (``cli``) callers need not call it.
        """
        self._check_open()
        engine = await self.builtin()
        start = getattr(engine, "start", None)
        if start is not None:
            await start()
        if self.backend_name == "qmd":
            # In the background: reconciling collections with a slow or hanging qmd can take
            # up to 3 x commandTimeoutMs; searches meanwhile answer within their own deadline.
            import asyncio

            async def start_qmd() -> None:
                try:
                    await self.qmd()
                except MemorySearchError as exc:
                    self.breaker.record_failure(str(exc), self._now_ms())
                    log.warning("qmd did not start; the builtin engine answers: %s", exc)

            self._start_task = asyncio.get_running_loop().create_task(start_qmd())

    async def sync(self, *, reason: str = "manual", force: bool = False,
                   progress: Callable[[int, int, int], None] | None = None) -> None:
        """Sync the configured backend (and the builtin index, which is the fallback).

        Args:
            reason: why (logged): ``cli``, ``watch``, ``interval`` ...
            force: full rebuild, swapped in atomically.
            progress: ``progress(files_done, files_total, chunks_embedded)`` for the builtin sync.

        Raises:
            IndexStoreError / BackendUnavailableError: the sync failed.
        """
        self._check_open()
        self._check_workspace()
        if self.backend_name == "qmd":
            backend = await self.qmd()
            if backend is not None:
                await backend.sync(reason=reason, force=force)
        engine = await self.builtin()
        previous = getattr(engine, "on_progress", None)
        if progress is not None:
            engine.on_progress = progress  # type: ignore[attr-defined]
        try:
            await engine.sync(reason=reason, force=force)
        finally:
            if progress is not None:
                engine.on_progress = previous  # type: ignore[attr-defined]

    async def close(self) -> None:
        """Close both backends; idempotent."""
        if self._closed:
            return
        self._closed = True
        task, self._start_task = self._start_task, None
        if task is not None and not task.done():
            task.cancel()
            with anyio.CancelScope(shield=True):
                try:
                    await task
                except BaseException:  # noqa: BLE001 - cancelled or failed start: already logged
                    pass
        for backend in (self._qmd, self._builtin):
            if backend is not None:
                with anyio.CancelScope(shield=True):
                    await backend.close()


class BlockingMemoryManager:
    """Blocking facade over :class:`MemoryManager` for scripts and simple hosts.

    Owns an anyio blocking portal (an event loop in a thread) for its whole lifetime; every
    method forwards to the async manager with ``portal.call`` and has the same name and
    arguments. Use as a context manager or call ``close()``.
    """

    def __init__(self, agent: ResolvedAgent, **kwargs: Any) -> None:
        from anyio.from_thread import start_blocking_portal

        self._portal_cm = start_blocking_portal()
        self._portal = self._portal_cm.__enter__()
        self._manager = MemoryManager(agent, **kwargs)
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
        """See :meth:`MemoryManager.search`."""
        return self._call(lambda: self._manager.search(query, **kwargs))

    def read_file(self, rel_path: str, **kwargs: Any) -> MemoryReadResult:
        """See :meth:`MemoryManager.read_file`."""
        return self._call(lambda: self._manager.read_file(rel_path, **kwargs))

    def status(self) -> MemoryStatus:
        """See :meth:`MemoryManager.status`."""
        return self._call(self._manager.status)

    def sync(self, *, reason: str = "manual", force: bool = False) -> None:
        """See :meth:`MemoryManager.sync`."""
        self._call(lambda: self._manager.sync(reason=reason, force=force))

    def close(self) -> None:
        """Close the manager and stop the portal; idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            self._portal.call(self._manager.close)
        finally:
            self._portal_cm.__exit__(None, None, None)

