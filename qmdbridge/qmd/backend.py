"""QmdBackend: the qmd sidecar as a ``MemoryBackend`` (collections, update cycle, search, read).

Every qmd call is ``[qmd, <flags...>, "--index", "index", "--", <positionals...>]``: flags
first, the index pinned (a ``.qmd/`` above the workspace cannot hijack config or DB), then
``--``, then user text, so a query can never be read as a flag (checked against qmd 2.8.3
under Bun). Beyond ``--``, qmd still interprets the query text itself; :func:`encode_query`
keeps it literal (see there). The circuit breaker lives in the manager, not here.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import time
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, Literal

import anyio

from fallback.errors import (
    BackendTimeoutError,
    BackendUnavailableError,
    ManagerClosedError,
    PathRefusedError,
    UsageError,
)
from fallback.fs.atomic import write_atomic
from fallback.models import MemoryReadResult, MemorySearchResult, MemoryStatus, Source, SourceCount
from fallback.sources.read_page import read_memory_page
from qmdbridge.config import ResolvedAgent
from qmdbridge.qmd.collections import (
    CollectionRun,
    ManagedCollection,
    ReconcileState,
    build_collections,
    describe_collections,
    rebuild,
    reconcile,
    reconcile_fingerprint,
    rule_extra_paths,
)
from qmdbridge.qmd.errors import QmdOutputError
from qmdbridge.qmd.parse import (
    DocLookup,
    QmdEntry,
    clamp_injected,
    diversify_sources,
    encode_query,
    index_counts,
    map_entries,
    merge_key,
    parse_qmd_json,
)
from qmdbridge.qmd.reads import read_qmd_path
from qmdbridge.qmd.runner import (
    RunResult,
    is_crash_after_output,
    is_flag_rejection,
    is_missing_collection,
    run_command,
)
from qmdbridge.qmd.update import UpdateCycle, file_lock

__all__ = ["QmdBackend", "encode_query"]
log = logging.getLogger("qmdbridge.qmd.backend")

# How long a search waits for a running update before it searches anyway (spec 2.7.4), ms.
PENDING_UPDATE_WAIT_MS = 500
# Ceiling of the `qmd --help` multi-collection probe, ms.
HELP_PROBE_MAX_MS = 5000
_MULTI_C_RE = re.compile(r"\b(?:one or more collections|collection\(s\)|multiple -c flags)\b", re.I)
_VECTORS_RE = re.compile(r"^\s*Vectors(?:\s*[:=]\s*|\s+)(\d+)\b", re.I | re.M)


class _FlagRejected(Exception):
    """Internal: qmd rejected a flag of the configured mode (retry with ``query``)."""


class _MissingCollection(Exception):
    """Internal: qmd said a managed collection does not exist (reconcile and retry once)."""


class QmdBackend:
    """The qmd sidecar for one agent, implementing ``fallback.contract.MemoryBackend``.

    Args:
        agent: the resolved agent config.
        location: where qmd is (``qmdbridge.qmd.locate.QmdLocation``; ``path`` and ``child_path``).
        mode: ``cli`` (one-shot: reconcile, boot update only with ``waitForBootSync``) or
            ``full`` (long-lived: boot update, interval and embed timers).
        env: parent environment for the child processes (default ``os.environ``).
        now_ms: clock in epoch ms (default wall clock).

    Use ``start()`` before searching, ``close()`` at the end (idempotent). ``start()`` and the
    timers run on asyncio (background work are asyncio tasks owned by this object).
    """

    name = "qmd"

    def __init__(self, agent: ResolvedAgent, *, location: Any, mode: Literal["full", "cli"] = "cli",
                 env: Mapping[str, str] | None = None,
                 now_ms: Callable[[], int] | None = None) -> None:
        from qmdbridge.paths import qmd_home

        self.agent = agent
        self.location = location
        self.mode = mode
        self.cfg = agent.memory.qmd
        self._parent_env = dict(os.environ if env is None else env)
        self._now = now_ms or (lambda: int(time.time() * 1000))
        self.home = qmd_home(agent.state_dir, agent.agent_id)
        self.collections: list[ManagedCollection] = build_collections(
            agent, sessions_dir=self.home.sessions_dir)
        self.roots = {c.name: c for c in self.collections}
        self.reconcile_state = ReconcileState()
        self._child_env: dict[str, str] | None = None
        self._multi_c: bool | None = None
        self._docid_cache: dict[str, tuple[str, str] | None] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closed = False
        self.now_ms = self._now
        self.freshness: Any = None  # QmdFreshness in full mode with sync.watch
        self._started = False
        self.last_error: str | None = None
        self.search_fallback_reason: str | None = None
        up = self.cfg.update
        longest = max(up.update_timeout_ms, up.embed_timeout_ms)
        self.cycle = UpdateCycle(
            update=self._run_update_cmd, embed=self._run_embed_cmd, repair=self._repair,
            export_sessions=self._export_sessions if self.cfg.sessions.enabled else None,
            after_update=self._docid_cache.clear, write_lock=self.home.write_lock,
            embed_lock=self.home.embed_lock, search_mode=self.cfg.search_mode,
            debounce_ms=up.debounce_ms, embed_interval_ms=up.embed_interval_ms,
            lock_budget_ms=max(300_000, 6 * longest),
            embed_lock_budget_ms=max(900_000, 6 * up.embed_timeout_ms), now_ms=self._now)

    # -- process plumbing ---------------------------------------------------------------------

    @property
    def child_env(self) -> dict[str, str]:
        """The child environment (per-agent XDG dirs, ``NO_COLOR=1``)."""
        if self._child_env is None:
            from qmdbridge.paths import child_env

            self._child_env = dict(child_env(self.home, parent_env=self._parent_env,
                                             path_env=getattr(self.location, "child_path", None)
                                             or self._parent_env.get("PATH", "")))
        return self._child_env

    def argv(self, args: list[str], positionals: list[str] | tuple[str, ...] = ()) -> list[str]:
        """``[qmd, *args, "--index", "index", "--", *positionals]`` (no ``--`` without positionals)."""
        out = [str(self.location.path), *args, "--index", "index"]
        return out + ["--", *positionals] if positionals else out

    async def _run(self, args: list[str], positionals: list[str] | tuple[str, ...] = (), *,
                   timeout_ms: int, discard_stdout: bool = False) -> RunResult:
        return await run_command(self.argv(args, positionals), env=self.child_env,
                                 cwd=self.agent.workspace_dir, timeout_ms=max(1, timeout_ms),
                                 discard_stdout=discard_stdout)

    async def _collection_cmd(self, args: list[str], positionals: list[str]) -> CollectionRun:
        res = await self._run(args, positionals, timeout_ms=self.cfg.update.command_timeout_ms)
        return CollectionRun(res.ok, res.stdout, res.stderr)

    @property
    def closed(self) -> bool:
        """Whether ``close()`` was called."""
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise ManagerClosedError("qmd backend is closed")
    def spawn(self, factory: Callable[[], Coroutine[Any, Any, None]], what: str) -> None:
        async def guarded() -> None:
            try:
                await factory()
            except BackendUnavailableError as exc:
                self.last_error = str(exc)
                log.warning("qmd %s failed: %s", what, exc)

        task = asyncio.get_running_loop().create_task(guarded())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- lifecycle ----------------------------------------------------------------------------

    async def start(self, *, boot_update: bool = True) -> None:
        """Create the qmd home, reconcile collections, then the boot update and timers.

        Boot update (``update.onBoot`` and ``boot_update``): awaited when
        ``update.waitForBootSync`` (failures logged, not raised), else in the background
        (``full`` mode only). ``full`` mode also starts the interval and embed timers.

        Raises:
            ManagerClosedError: the backend was closed.
        """
        from qmdbridge.paths import ensure_home

        self._check_open()
        if self._started:
            return
        self._started = True
        for warning in ensure_home(self.home, parent_env=self._parent_env) or []:
            log.warning("%s", warning)
        await anyio.to_thread.run_sync(self._make_dirs)
        await self.reconcile()
        up = self.cfg.update
        if up.on_boot and boot_update:
            if up.wait_for_boot_sync:
                try:
                    await self.cycle.run("boot", force=True)
                except BackendUnavailableError as exc:
                    self.last_error = str(exc)
                    log.warning("qmd boot update failed: %s", exc)
            elif self.mode == "full":
                self.spawn(lambda: self.cycle.run("boot", force=True), "boot update")
        if self.mode == "full":
            from qmdbridge.qmd.freshness import start_background

            self.freshness = start_background(self)

    def _make_dirs(self) -> None:
        self.agent.workspace_dir.mkdir(parents=True, exist_ok=True)
        for c in self.collections:
            if c.kind == "sessions":
                c.path.mkdir(parents=True, exist_ok=True)

    async def reconcile(self, *, force: bool = False) -> None:
        """Make qmd's collections match the config (spec 2.6); never raises for qmd errors.

        A successful reconcile records a fingerprint (collections, qmd version, ``index.yml``
        size and mtime) in ``<qmd_dir>/reconciled.json``; while nothing changed, later calls
        skip the ``collection list/show`` round trips (they cost one qmd start each), unless
        ``force`` (the "Collection not found" repair forces it).
        """
        marker = self.home.qmd_dir / "reconciled.json"
        if not force:
            try:
                if marker.read_text() == reconcile_fingerprint(self.collections, getattr(self.location, "version", None), self.home.index_yml):
                    return
            except OSError:
                pass
        await reconcile(self.collections, run=self._collection_cmd, agent_id=self.agent.agent_id,
                        workspace=self.agent.workspace_dir, state=self.reconcile_state)
        try:
            write_atomic(marker, reconcile_fingerprint(
                self.collections, getattr(self.location, "version", None), self.home.index_yml).encode())
        except OSError as exc:
            log.debug("cannot record the reconcile fingerprint: %s", exc)

    async def close(self) -> None:
        """Cancel timers, wait for a running update, stop; idempotent."""
        if self._closed:
            return
        self._closed = True
        self.cycle.closed = True
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.cycle.wait_running(max_ms=self.cfg.update.update_timeout_ms)

    # -- update / embed -----------------------------------------------------------------------

    async def _run_update_cmd(self) -> None:
        res = await self._run(["update"], timeout_ms=self.cfg.update.update_timeout_ms,
                              discard_stdout=True)
        res.check()

    async def _run_embed_cmd(self) -> None:
        from qmdbridge.qmd.models import model_problem

        problem = await model_problem(self.home.xdg_cache / "qmd" / "models", self.child_env,
                                      kinds=("embed",))
        if problem is not None:  # fail fast instead of waiting out embedTimeoutMs
            raise BackendUnavailableError("qmd", f"qmd embed skipped: {problem}")
        res = await self._run(["embed"], timeout_ms=self.cfg.update.embed_timeout_ms,
                              discard_stdout=True)
        res.check()

    async def _repair(self) -> None:
        try:
            await rebuild(self.collections, run=self._collection_cmd, index_yml=self.home.index_yml,
                          state=self.reconcile_state)
        except OSError as exc:
            raise BackendUnavailableError("qmd", f"cannot rewrite {self.home.index_yml}: {exc}") from exc

    async def _export_sessions(self) -> None:
        try:
            from qmdbridge.qmd.sessions import export_sessions
        except ImportError:
            log.warning("qmd session export unavailable (qmdbridge.qmd.sessions missing)")
            return
        target = next(c.path for c in self.collections if c.kind == "sessions")
        retention = self.cfg.sessions.retention_days
        await anyio.to_thread.run_sync(lambda: export_sessions(
            self.agent.engine.sessions_dir, target, retention_days=retention, now_ms=self._now()))

    async def sync(self, *, reason: str, force: bool = False) -> None:
        """``runUpdate(reason, force)``: see :meth:`UpdateCycle.run`.

        Raises:
            ManagerClosedError: closed. BackendUnavailableError: ``qmd update`` failed.
        """
        self._check_open()
        await self.cycle.run(reason or "manual", force=force)

    async def update(self) -> None:
        """Forced update now (CLI ``qmdbridge qmd update``); embeds too outside ``search`` mode.

        Raises:
            BackendUnavailableError: ``qmd update`` failed.
        """
        await self.sync(reason="manual", force=True)

    async def embed(self) -> None:
        """Run ``qmd embed`` now under the embed and store locks (CLI).

        Raises:
            BackendUnavailableError: the embed failed or a lock could not be taken in time.
        """
        self._check_open()
        async with file_lock(self.home.embed_lock, budget_ms=self.cfg.update.embed_timeout_ms), \
                file_lock(self.home.write_lock, budget_ms=self.cfg.update.embed_timeout_ms):
            await self._run_embed_cmd()
        self.cycle.embed.last_embed_at = self._now()

    async def list_collections(self) -> list[dict[str, Any]]:
        """qmd's collections: ``[{name, path, pattern, managed, kind}]`` (paths via ``show``).

        Raises:
            BackendUnavailableError: ``collection list`` failed.
        """
        res = await self._run(["collection", "list"], timeout_ms=self.cfg.update.command_timeout_ms)
        res.check()
        return await describe_collections(res.stdout, run=self._collection_cmd, roots=self.roots)

    # -- search -------------------------------------------------------------------------------

    async def search(self, query: str, *, max_results: int | None = None,
                     min_score: float | None = None, session_key: str | None = None,
                     sources: list[Source] | None = None,
                     mode: str | None = None) -> list[MemorySearchResult]:
        """Search the managed collections with qmd (spec 2.8); scope rules are the manager's.

        The whole search (every qmd call) finishes within ``limits.timeoutMs``; each call gets
        the remaining budget. An "unknown flag" on stderr reruns the search with ``query``; a
        missing collection triggers one reconcile and one retry; a crash after valid JSON
        (exit 134 in llama.cpp/ggml) uses the JSON.

        Args:
            max_results: capped at ``limits.maxResults``.
            min_score: hits below are dropped (default 0).
            sources: keep only collections of these sources.
            mode: overrides ``searchMode`` (``search`` | ``vsearch`` | ``query``).

        Returns:
            Hits, best first, diversified across sources and clamped to ``maxInjectedChars``.

        Raises:
            UsageError: blank query. ManagerClosedError: closed.
            BackendTimeoutError: past ``limits.timeoutMs`` (the qmd process tree is killed).
            QmdCommandError: qmd failed (e.g. ``CI`` set: "LLM operations are disabled in CI").
            QmdOutputError: stdout was not a result array.
        """
        self._check_open()
        q = query.strip()
        if not q:
            raise UsageError("query required")
        limits = self.cfg.limits
        deadline = anyio.current_time() + limits.timeout_ms / 1000
        if self.freshness is not None and self.agent.memory_search.sync.on_search:
            await self.freshness.before_search(budget_ms=self._remaining_ms(deadline) // 2)
        if self.cycle.is_running:
            await self.cycle.wait_running(max_ms=PENDING_UPDATE_WAIT_MS)
        limit = min(limits.max_results, max_results or limits.max_results)
        colls = [c for c in self.collections if sources is None or c.source in sources]
        if not colls:
            log.warning("qmd query skipped: no managed collections configured")
            return []
        search_mode = mode or self.cfg.search_mode
        if search_mode == "vsearch" and self.child_env.get("CI"):
            # qmd 2.8.3 vsearch under CI prints [] (exit 0) instead of failing: say why instead.
            raise BackendUnavailableError("qmd", "qmd vsearch cannot embed the query: LLM operations "
                                          "are disabled in CI (CI is set in qmd's environment)")
        no_rerank = search_mode == "query" and self.cfg.rerank is False
        try:
            try:
                entries = await self._search_all(q, search_mode, colls, limit, deadline, no_rerank)
            except _MissingCollection:
                log.warning("qmd search failed because a managed collection is missing; "
                            "repairing collections and retrying once")
                await self.reconcile(force=True)
                entries = await self._search_all(q, search_mode, colls, limit, deadline, no_rerank)
        except _FlagRejected as exc:
            if search_mode == "query":
                raise BackendUnavailableError("qmd", str(exc)) from None
            log.warning("qmd %s does not support configured flags; retrying search with qmd query",
                        search_mode)
            self.search_fallback_reason = "unsupported-search-flags"
            try:
                entries = await self._search_all(q, "query", colls, limit, deadline, False)
            except (_FlagRejected, _MissingCollection) as again:
                raise BackendUnavailableError("qmd", f"qmd query fallback failed: {again}") from None
        except _MissingCollection as exc:  # still missing after the repair
            raise BackendUnavailableError("qmd", str(exc)) from None
        results = await anyio.to_thread.run_sync(
            lambda: self._map(entries, min_score=min_score or 0.0))
        if sources is not None:
            results = [r for r in results if r.source in sources]
        results = diversify_sources(results, limit=limit)
        return clamp_injected(results, max_chars=limits.max_injected_chars)

    def _map(self, entries: list[tuple[QmdEntry, str | None]], *,
             min_score: float) -> list[MemorySearchResult]:
        lookup = DocLookup(self.home.index_db)
        try:
            out: list[MemorySearchResult] = []
            for entry, hint in entries:
                out += map_entries([entry], roots=self.roots, workspace=self.agent.workspace_dir,
                                   lookup=lookup, default_collection=hint,
                                   max_snippet_chars=self.cfg.limits.max_snippet_chars,
                                   min_score=min_score, cache=self._docid_cache)
            return out
        finally:
            lookup.close()

    async def _supports_multi_c(self, deadline: float) -> bool:
        if self._multi_c is None:
            budget = min(self._remaining_ms(deadline), HELP_PROBE_MAX_MS)
            try:
                res = await run_command([str(self.location.path), "--help"], env=self.child_env,
                                        cwd=self.agent.workspace_dir, timeout_ms=max(1, budget))
                self._multi_c = bool(_MULTI_C_RE.search(res.stdout + res.stderr))
            except BackendUnavailableError:
                self._multi_c = False
        return self._multi_c

    @staticmethod
    def _remaining_ms(deadline: float) -> int:  # ms left before the search deadline
        return int((deadline - anyio.current_time()) * 1000)

    async def _search_all(self, q: str, mode: str, colls: list[ManagedCollection], limit: int,
                          deadline: float, no_rerank: bool) -> list[tuple[QmdEntry, str | None]]:
        if len(colls) > 1 and await self._supports_multi_c(deadline):
            groups: dict[str, list[ManagedCollection]] = {}
            for c in colls:
                groups.setdefault(c.source, []).append(c)
            batches = list(groups.values())
        else:
            batches = [[c] for c in colls]
        merged: dict[str, tuple[QmdEntry, str | None]] = {}
        for batch in batches:
            hint = batch[0].name if len(batch) == 1 else None
            for entry in await self._call(q, mode, batch, limit, deadline, no_rerank):
                key = merge_key(entry, hint)
                best = merged.get(key)
                if best is None or (entry.score or 0.0) > (best[0].score or 0.0):
                    merged[key] = (entry, hint)
        return sorted(merged.values(), key=lambda pair: -(pair[0].score or 0.0))

    async def _call(self, q: str, mode: str, batch: list[ManagedCollection], limit: int,
                    deadline: float, no_rerank: bool) -> list[QmdEntry]:
        timeout_ms = self.cfg.limits.timeout_ms
        remaining = self._remaining_ms(deadline)
        args = [mode, "--json", "-n", str(limit), *(["--no-rerank"] if no_rerank else [])]
        for c in batch:
            args += ["-c", c.name]
        summary = " ".join(["qmd", *args, "--", q])
        if remaining <= 0:
            raise BackendTimeoutError("qmd", summary, timeout_ms)
        try:
            res = await self._run(args, [encode_query(q, mode)], timeout_ms=remaining)
        except BackendTimeoutError:
            raise BackendTimeoutError("qmd", summary, timeout_ms) from None
        if res.stdout_truncated:
            raise QmdOutputError(f"{res.summary} produced too much output (limit 200000 chars)")
        if res.ok:
            return parse_qmd_json(res.stdout, res.stderr)
        if is_flag_rejection(res.stderr):
            raise _FlagRejected(f"{res.summary} rejected a flag: {res.stderr.strip()[:300]}")
        if is_missing_collection(res.stderr):
            raise _MissingCollection(res.stderr.strip()[:300])
        if is_crash_after_output(res):
            try:
                entries = parse_qmd_json(res.stdout, "")
            except QmdOutputError:
                res.check()
                raise
            log.warning("qmd %s exited non-zero after producing valid JSON; using captured search "
                        "results (code %s)", mode, res.returncode)
            return entries
        res.check()
        return []

    # -- read ---------------------------------------------------------------------------------

    async def read_file(self, rel_path: str, *, from_line: int | None = None,
                        lines: int | None = None) -> MemoryReadResult:
        """``memory_get`` over qmd: workspace memory paths, or ``qmd/<collection>/<rel>``.

        Both go through the builtin engine's safe reader (``fallback.sources.read_page``):
        workspace paths by the memory-file rule with every custom collection among the extra
        paths (so a file a collection indexes is readable, and nothing else), and
        ``qmd/<collection>/<rel>`` inside that collection with its pattern. Paging: 120 lines /
        12,000 chars by default; files over 1 MiB are streamed.

        Raises:
            PathRefusedError: blank path, ``invalid qmd path``, ``unknown qmd collection: <c>``,
                or a refusal of the memory-file rule (parent segments, symlinks, non-``.md``
                files, files outside the collection's pattern).
            BackendUnavailableError: the file exists but cannot be read.
        """
        self._check_open()
        rel = rel_path.strip()
        if not rel:
            raise PathRefusedError(rel_path, "path required")
        ws = self.agent.workspace_dir
        if rel.startswith("qmd/"):
            roots = dict(self.roots)
            return await anyio.to_thread.run_sync(
                lambda: read_qmd_path(roots, rel, from_line, lines, workspace=ws))
        extra = rule_extra_paths(self.agent)
        return await anyio.to_thread.run_sync(lambda: read_memory_page(
            ws, extra, rel, from_line=from_line, lines=lines))

    # -- status and probes --------------------------------------------------------------------

    async def status(self) -> MemoryStatus:
        """Counters from qmd's index (active documents per collection) and qmd health."""
        counts, err = await anyio.to_thread.run_sync(lambda: index_counts(self.home.index_db))
        by_source: dict[Source, int] = {}
        for coll, n in counts.items():
            src = self.roots[coll].source if coll in self.roots else "memory"
            by_source[src] = by_source.get(src, 0) + n
        total = sum(counts.values())
        embed = self.cycle.embed
        sources: list[Source] = sorted({c.source for c in self.collections}) or ["memory"]
        issues = list(self.reconcile_state.warnings) + ([err] if err else [])
        last_error = self.cycle.last_error or self.last_error
        return MemoryStatus(
            backend="qmd", agent_id=self.agent.agent_id, workspace_dir=str(self.agent.workspace_dir),
            db_path=str(self.home.index_db), files=total, chunks=total, provider="qmd",
            requested_provider="qmd", model="qmd", search_mode=self.cfg.search_mode, sources=sources,
            source_counts=[SourceCount(source=s, files=n, chunks=n) for s, n in sorted(by_source.items())],
            vector={"enabled": self.cfg.search_mode != "search"}, issues=issues,
            last_sync_at_ms=self.cycle.last_update_at, healthy=last_error is None,
            last_error=last_error, dirty=bool(self.freshness and self.freshness.dirty),
            dirty_reason=self.freshness.dirty_reason if self.freshness else None,
            custom={"qmd": {
                "binary": str(self.location.path), "version": getattr(self.location, "version", None),
                "collections": len(self.collections),
                "collectionNames": [c.name for c in self.collections],
                "lastUpdateAt": self.cycle.last_update_at, "embedFailures": embed.failures,
                "embedBackoffUntil": embed.backoff_until, "searchMode": self.cfg.search_mode,
                "searchFallbackReason": self.search_fallback_reason, "lastError": last_error,
                "freshness": self.freshness.snapshot() if self.freshness else None}})

    async def probe_vector(self) -> bool:
        """Whether qmd has vectors (``qmd status`` ``Vectors: N`` > 0); ``False`` in ``search``
        mode without spawning anything."""
        ok, _ = await self._vector_probe()
        return ok

    async def _vector_probe(self) -> tuple[bool, str | None]:
        if self.cfg.search_mode == "search":
            return False, "qmd search mode does not use vectors"
        try:
            res = await self._run(["status"], timeout_ms=self.cfg.limits.timeout_ms)
            res.check()
        except BackendUnavailableError as exc:
            return False, f"QMD status probe failed: {exc}"
        m = _VECTORS_RE.search(res.stdout)
        if m is None:
            return False, "Could not determine QMD vector status from `qmd status`"
        if int(m.group(1)) == 0:
            return False, "QMD index has 0 vectors; semantic search is unavailable until embeddings finish"
        return True, None

    async def probe_embeddings(self) -> tuple[bool, str | None]:
        """``(ok, error)``: ``(True, None)`` in ``search`` mode (not checked), else the vector probe."""
        if self.cfg.search_mode == "search":
            return True, None
        ok, detail = await self._vector_probe()
        return ok, None if ok else (detail or "QMD semantic vectors are unavailable")
