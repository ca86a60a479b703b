"""QmdBackend: the qmd sidecar as a ``MemoryBackend`` (collections, update cycle, search, read).

``limits.timeoutMs`` bounds a search only; start-up steps have their own budgets, and a timeout
there is kept in ``status()`` (``custom.qmd.startup``).
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from collections.abc import Callable, Mapping
from functools import cached_property, partial
from importlib import import_module
from typing import TYPE_CHECKING, Any, Literal

import anyio

from fallback.background import BackgroundTasks
from fallback.contract import ProgressCallback, SearchOutcome
from fallback.errors import BackendTimeoutError, BackendUnavailableError, ManagerClosedError, UsageError
from fallback.index.racy import wall_clock_ms
from fallback.models import MemoryReadResult, MemorySearchResult, MemoryStatus, Source, SourceCount
from fallback.request import SearchRequest
from fallback.search.fusion import select_results
from fallback.settings import ExtraPath
from fallback.skipped import SkippedFile
from fallback.sources.file_text import BINARY_FILE, is_binary_path
from fallback.sources.memory_files import EXTRA_PATH_MISSING, Discovery, list_memory_files
from fallback.sources.read_page import read_memory_page
from qmdbridge.config import ResolvedAgent
from qmdbridge.paths import child_env as build_child_env
from qmdbridge.paths import qmd_home
from qmdbridge.qmd.collections import (
    ManagedCollection,
    ReconcileState,
    build_collections,
    describe_collections,
    rebuild,
    rule_extra_paths,
)
from qmdbridge.qmd.errors import QmdIndexLostError
from qmdbridge.qmd.index_health import IndexHealth
from qmdbridge.qmd.index_stats import file_stamp
from qmdbridge.qmd.lexical import relax
from qmdbridge.qmd.models import ModelState, model_cache_state, model_kinds
from qmdbridge.qmd.parse import IndexCounts, entry_hits, index_locked
from qmdbridge.qmd.query_text import (
    POOL_FACTOR,
    lex_queries,
    qmd_argv,
    search_env,
    search_limits,
    search_words,
    without_stray_quote,
)
from qmdbridge.qmd.reads import Listings, read_qmd_path
from qmdbridge.qmd.runner import CommandRunner, RunResult, is_busy, run_command
from qmdbridge.qmd.search_calls import (
    SEARCH_TIMEOUT_SETTING,
    VEC0_HINT,
    CallPlan,
    probe_search,
    search_with_repairs,
)
from qmdbridge.qmd.startup import prepare_home, reconcile_if_changed
from qmdbridge.qmd.update import UpdateCycle, embed_jitter_ms, file_lock, indexing_in_progress

if TYPE_CHECKING:
    from qmdbridge.qmd.freshness import QmdFreshness
    from qmdbridge.qmd.locate import QmdLocation
    from qmdbridge.qmd.warm import WarmChild

__all__ = ["QmdBackend"]
log = logging.getLogger("qmdbridge.qmd.backend")

# How long a search waits for a running update before it searches anyway (spec 2.7.4), ms.
PENDING_UPDATE_WAIT_MS = 500

# The search deadline ends this much (ms, at most a tenth) early: its timeout comes before the backstop.
SEARCH_DEADLINE_MARGIN_MS = 100


class QmdBackend:
    """The qmd sidecar for one agent, implementing ``fallback.contract.MemoryBackend``: qmd at
    ``location`` (``qmdbridge.qmd.locate.QmdLocation``), ``mode`` ``full`` adding the boot update,
    timers, watcher and warm child; other arguments as :class:`~qmdbridge.manager.MemoryManager`'s."""

    name = "qmd"

    def __init__(self, agent: ResolvedAgent, *, location: QmdLocation, mode: Literal["full", "cli"] = "cli",
                 env: Mapping[str, str] | None = None,
                 now_ms: Callable[[], int] | None = None, runner: CommandRunner | None = None) -> None:
        self.agent = agent
        self.location = location
        self.mode = mode
        self.cfg = agent.memory.qmd
        self._parent_env = dict(os.environ if env is None else env)
        self.now_ms = now_ms or wall_clock_ms
        self._runner: CommandRunner = runner or run_command
        self.home = qmd_home(agent.state_dir, agent.agent_id)
        self.collections: list[ManagedCollection] = build_collections(
            agent, sessions_dir=self.home.sessions_dir)
        self.roots = {c.name: c for c in self.collections}
        self.reconcile_state = ReconcileState()
        self.mode_override: str | None = None  # "search" once qmd's vector table cannot open
        self.lex_calls = True  # False once qmd rejected a question's lex call (search_calls)
        self.last_search_error: str | None = None  # the last search that failed, one line
        self._docid_cache: dict[str, tuple[str, str] | None] = {}
        self._listings: Listings = {}  # folder listings for hit checks (qmd.reads)
        self._export_state: Any = None  # what the session export wrote (qmd.sessions.ExportState)
        self.index_counts = IndexCounts(self.home.index_db)  # documents per collection
        # a lost or corrupt index, noticed and re-indexed
        self.health = IndexHealth(self.home, self.index_counts,
                                  reindex=lambda: self.cycle.run("re-index", debounce=False),
                                  update_timeout_ms=self.cfg.update.update_timeout_ms)
        # index.yml's stamp when this backend last reconciled (_refresh_collections)
        self._yml_seen: tuple[int, int, int] | None = None
        self._bg: BackgroundTasks | None = None
        self._closed = False
        self.freshness: QmdFreshness | None = None  # full mode with sync.watch
        self.warm: WarmChild | None = None  # the warm `qmd mcp` child (full mode, memory.qmd.mcp)
        self._prepared = False
        self._started = False
        self._in_startup = False
        self.startup_problems: list[str] = []  # start-up timeouts and failures (status)
        self.last_error: str | None = None
        self.search_fallback_reason: str | None = None
        # The last 5 notes of searches (hits dropped as ambiguous ...), for status.
        self.hit_problems: list[str] = []
        up = self.cfg.update
        longest = max(up.update_timeout_ms, up.embed_timeout_ms)
        self.cycle = UpdateCycle(
            update=self._run_update_cmd, embed=self._run_embed_cmd, repair=self._repair,
            export_sessions=self._export_sessions if self.cfg.sessions.enabled else None,
            after_update=self._docid_cache.clear, write_lock=self.home.write_lock,
            embed_lock=self.home.embed_lock, search_mode=self.cfg.search_mode,
            debounce_ms=up.debounce_ms, embed_interval_ms=up.embed_interval_ms,
            lock_budget_ms=max(300_000, 6 * longest),
            embed_lock_budget_ms=max(900_000, 6 * up.embed_timeout_ms), now_ms=self.now_ms)

    @cached_property
    def child_env(self) -> dict[str, str]:
        """The child environment (per-agent XDG dirs, ``NO_COLOR=1``)."""
        return dict(build_child_env(self.home, parent_env=self._parent_env,
                                    path_env=self.location.child_path or self._parent_env.get("PATH", "")))

    @cached_property
    def model_state(self) -> ModelState:
        """Model availability, shared by the embed step and ``query``/``vsearch`` searches."""
        return ModelState(self.home.models_dir, self.child_env)

    def argv(self, args: list[str], positionals: list[str] | tuple[str, ...] = ()) -> list[str]:
        """``[qmd, *args, "--index", "index", "--", *positionals]`` (``query_text.qmd_argv``)."""
        return qmd_argv(str(self.location.path), args, positionals)

    async def _run(self, args: list[str], positionals: list[str] | tuple[str, ...] = (), *,
                   timeout_ms: int, discard_stdout: bool = False,
                   setting: str | None = None, env: Mapping[str, str] | None = None) -> RunResult:
        return await self._runner(self.argv(args, positionals), env=env or self.child_env,
                                  cwd=self.agent.workspace_dir, timeout_ms=max(1, timeout_ms),
                                  discard_stdout=discard_stdout, setting=setting)

    async def _run_search(self, args: list[str], positionals: list[str], timeout_ms: int) -> RunResult:
        # qmd's busy wait bounded (query_text.search_env): a writer makes it a busy answer
        return await self._run(args, positionals, timeout_ms=timeout_ms,
                               setting=SEARCH_TIMEOUT_SETTING, env=search_env(self.child_env))

    async def _collection_cmd(self, args: list[str], positionals: list[str]) -> RunResult:
        try:
            return await self._run(args, positionals, timeout_ms=self.cfg.update.command_timeout_ms,
                                  setting="memory.qmd.update.commandTimeoutMs")
        except BackendTimeoutError as exc:
            if self._in_startup:
                self._startup_problem(exc.reason)
            raise

    def _startup_problem(self, message: str) -> None:
        self.startup_problems.append(message)
        log.warning("qmd start-up: %s", message)

    def _check_open(self) -> None:
        if self._closed:
            raise ManagerClosedError("qmd backend is closed")

    async def prepare(self) -> None:
        """Create the qmd home, workspace and sessions folders; spawns nothing. Idempotent.

        Raises:
            ManagerClosedError: closed. BackendUnavailableError: a folder cannot be created.
        """
        self._check_open()
        if not self._prepared:
            await anyio.to_thread.run_sync(partial(prepare_home, self.home, parent_env=self._parent_env,
                                                   workspace=self.agent.workspace_dir,
                                                   collections=self.collections))
            self._prepared = True

    async def start(self, tasks: BackgroundTasks | None = None, *, boot_update: bool = True) -> None:
        """Start-up: qmd home, collections, index health, the boot update (awaited with
        ``update.waitForBootSync``; ``boot_update=False`` skips it), then in ``full`` mode timers,
        watcher and warm child in ``tasks``, the manager's task group.

        Raises:
            ManagerClosedError: closed. UsageError: ``full`` mode without ``tasks``.
            BackendUnavailableError: the qmd home cannot be created, or a start-up command timed out
                (the collection reconcile stops there; the sidecar opens the start-up breaker).
        """
        self._check_open()
        if self._started:
            return
        if self.mode == "full" and tasks is None:
            raise UsageError("a long-lived qmd backend needs the manager's background tasks")
        self._started = True
        self._bg = tasks.subgroup("qmd") if tasks is not None else None
        self._in_startup = True
        try:
            await self.prepare()
            await self.reconcile()
            if self.reconcile_state.timed_out is not None:  # qmd hangs: the start-up failed
                raise BackendUnavailableError("qmd", f"start-up: {self.reconcile_state.timed_out}")
            up = self.cfg.update
            problem = await self.health.at_start(
                boot_update=up.on_boot and boot_update and up.wait_for_boot_sync,
                managed=self._managed(), yml_edited=self._yml_edited())
            if problem is not None:
                self._startup_problem(problem)
            if up.on_boot and boot_update:
                if up.wait_for_boot_sync:
                    try:
                        await self.cycle.run("boot", force=True)
                    except BackendUnavailableError as exc:  # a timeout: "... timed out after <N>ms"
                        self.last_error = str(exc)
                        self._startup_problem(f"boot update failed: {exc.reason}")
                elif self.mode == "full" and self._bg is not None:
                    self._bg.start_soon("boot update", lambda: self.cycle.run("boot", force=True))
        finally:
            self._in_startup = False
        if self.mode == "full" and self._bg is not None:
            self._start_timers_and_watcher(self._bg)
            if self.cfg.warm_child:  # answers `query` searches; started now or by the first one
                # off the loop: the mcp SDK's import holds it for seconds on a loaded machine
                warm = await anyio.to_thread.run_sync(import_module, "qmdbridge.qmd.warm")
                self.warm = warm.WarmChild(
                    argv=self.argv(["mcp"]),  # the stdio transport: no port, nothing to connect to
                    env=self.child_env, cwd=self.agent.workspace_dir, now_ms=self.now_ms,
                    startup_budget_ms=self.cfg.update.command_timeout_ms, index_db=self.home.index_db)
                self.warm.attach(self._bg)
                if self.cfg.search_mode in ("query", "search"):  # search: questions (lexical.py)
                    self.warm.launch()

    def _start_timers_and_watcher(self, tasks: BackgroundTasks) -> None:
        """Long-lived mode: the interval update, the embed timer (spec 2.7.3: vectors used and
        the update interval off or longer) and the file watcher (``sync.watch``), in ``tasks``."""
        from qmdbridge.qmd.freshness import QmdFreshness

        up, sync = self.cfg.update, self.agent.memory_search.sync
        interval, embed_every = up.interval_ms, up.embed_interval_ms
        custom = [(str(c.path), c.pattern) for c in self.collections if c.kind == "custom"]
        if interval > 0:
            tasks.every("interval update", interval, lambda: self.cycle.run("interval"))
        if embed_every > 0 and self.cfg.search_mode != "search" and (interval <= 0 or interval > embed_every):
            first = embed_jitter_ms(self.agent.agent_id, custom, embed_every)
            tasks.every("embed-interval update", embed_every,
                        lambda: self.cycle.run("embed-interval"), first_ms=first)
        if sync.watch:
            self.freshness = QmdFreshness(
                self.agent.workspace_dir, extra_dirs=[ExtraPath(path=p, pattern=g) for p, g in custom],
                cycle=self.cycle, watch_debounce_ms=sync.watch_debounce_ms,
                update_debounce_ms=up.debounce_ms, now_ms=self.now_ms, tasks=tasks)
            tasks.start_soon("file watcher", self.freshness.watcher.run)

    async def reconcile(self, *, force: bool = False) -> None:
        """Make qmd's collections match the config (``startup.reconcile_if_changed``); never raises for qmd errors."""
        await reconcile_if_changed(
            self.collections, run=self._collection_cmd, agent_id=self.agent.agent_id,
            workspace=self.agent.workspace_dir, state=self.reconcile_state,
            marker=self.home.reconciled,
            qmd_version=self.location.version, index_yml=self.home.index_yml,
            force=force)
        self._yml_seen = file_stamp(self.home.index_yml)

    def _managed(self) -> list[ManagedCollection]:
        return [c for c in self.collections if c.name not in self.reconcile_state.refused]

    def _yml_edited(self) -> bool:
        return file_stamp(self.home.index_yml) != self._yml_seen

    async def _read_counts(self) -> tuple[dict[str, int], str | None, str | None]:
        """``(documents per collection, the error reading them, qmd's index problem)`` after
        :meth:`_refresh_collections`."""
        counts, count_error = await self.index_counts.read()
        if await self._refresh_collections():
            counts = (await self.index_counts.read())[0]
        return counts, count_error, await self.health.notice(
            counts, count_error, managed=self._managed(), yml_edited=self._yml_edited(),
            background=self._bg)

    async def _refresh_collections(self) -> bool:
        """Reconcile when ``index.yml`` changed, a missing custom path appeared or the root file
        was renamed (the last two rebuild the collections); returns whether it reconciled."""
        appeared = [p for p in self.reconcile_state.missing.values() if os.path.lexists(p)]
        moved = [c for c in self.collections if c.root_moved()]
        if appeared or moved:  # a file entry is a folder collection while missing: build them again
            log.warning("%s; binding the collections again", "; ".join(
                [f"qmd collection path {p} exists now" for p in appeared]
                + [f"the root memory file of {c.path} is no longer {c.pattern}" for c in moved]))
            self.collections = build_collections(self.agent, sessions_dir=self.home.sessions_dir)
            self.roots = {c.name: c for c in self.collections}
        elif not self._yml_edited():
            return False
        else:
            log.warning("qmd's collection list (%s) changed since the last reconcile; "
                        "reconciling the collections", self.home.index_yml)
        await self.reconcile()  # records the stamp it leaves: one attempt per edit
        return True

    async def close(self) -> None:
        """Cancel background tasks (their children are killed), wait for a running update; idempotent."""
        if self._closed:
            return
        self._closed = True
        self.cycle.closed = True
        if self.warm is not None:
            await self.warm.close()  # kills the child's process group
        if self._bg is not None:
            await self._bg.aclose()
        await self.cycle.wait_running(max_ms=self.cfg.update.update_timeout_ms)

    async def _run_update_cmd(self) -> None:
        # bound again first: qmd would index what an edit says (a NUL hangs it), not the root file
        await self._refresh_collections()
        (await self._run(["update"], timeout_ms=self.cfg.update.update_timeout_ms,
                         setting="memory.qmd.update.updateTimeoutMs", discard_stdout=True)).check()

    async def _run_embed_cmd(self) -> None:
        problem = await self.model_state.problem(("embed",))
        if problem is not None:  # fail fast instead of waiting out embedTimeoutMs
            raise BackendUnavailableError("qmd", f"qmd embed skipped: {problem}")
        (await self._run(["embed"], timeout_ms=self.cfg.update.embed_timeout_ms,
                         setting="memory.qmd.update.embedTimeoutMs", discard_stdout=True)).check()

    async def _repair(self) -> None:
        try:
            await rebuild(self.collections, run=self._collection_cmd, index_yml=self.home.index_yml,
                          state=self.reconcile_state)
        except OSError as exc:
            raise BackendUnavailableError("qmd", f"cannot rewrite {self.home.index_yml}: {exc}") from exc

    async def _export_sessions(self) -> None:
        from qmdbridge.qmd.sessions import ExportState, export_sessions

        target = next(c.path for c in self.collections if c.kind == "sessions")
        retention = self.cfg.sessions.retention_days
        state = self._export_state = self._export_state or ExportState()  # unchanged: not parsed
        await anyio.to_thread.run_sync(lambda: export_sessions(
            self.agent.engine.sessions_dir, target, retention_days=retention, now_ms=self.now_ms(),
            state=state))

    async def sync(self, *, reason: str, force: bool = False,
                   progress: ProgressCallback | None = None) -> None:
        """Update qmd's index now (``UpdateCycle.run``, never debounced); ``progress`` is not reported.

        Raises:
            ManagerClosedError: closed. BackendUnavailableError: ``qmd update`` failed.
        """
        self._check_open()
        await self.cycle.run(reason or "manual", force=force, debounce=False)

    async def embed(self) -> None:
        """Run ``qmd embed`` now under the embed and store locks.

        Raises:
            BackendUnavailableError: the embed failed or a lock could not be taken in time.
        """
        self._check_open()
        async with file_lock(self.home.embed_lock, budget_ms=self.cfg.update.embed_timeout_ms), \
                file_lock(self.home.write_lock, budget_ms=self.cfg.update.embed_timeout_ms):
            await self._run_embed_cmd()
        self.cycle.embed.last_embed_at = self.now_ms()

    async def list_collections(self) -> list[dict[str, Any]]:
        """qmd's collections: ``[{name, path, pattern, managed, kind}]``.

        Raises:
            BackendUnavailableError: ``collection list`` failed.
        """
        res = (await self._collection_cmd(["collection", "list"], [])).check()
        return await describe_collections(res.stdout, run=self._collection_cmd, roots=self.roots)

    async def search(self, request: SearchRequest, *, sync_budget_ms: int | None = None,
                     progress: ProgressCallback | None = None) -> SearchOutcome:
        """Search the managed collections with qmd (spec 2.8) within ``limits.timeoutMs``.

        Args:
            request: the checked request; ``max_results`` capped at ``limits.maxResults``, ``sources``
                keep only collections of these sources (``explain`` has no qmd trace).
            sync_budget_ms: longest wait for a pending watcher update, ms (default: half the deadline).
            progress: accepted for the contract (qmd reports none).

        Returns:
            ``SearchOutcome``: hits best first, memory and sessions mixed as on the builtin engine
            (``fusion.select_results``; the manager cuts them to ``maxInjectedChars``); warnings
            are this search's notes; ``mode`` the one searches use.

        Raises:
            ManagerClosedError: closed.
            BackendUnavailableError: every collection asked for was refused at reconcile, or a repair failed.
            BackendTimeoutError: past ``limits.timeoutMs`` (the qmd process tree is killed).
            QmdBusyError, QmdCommandError, QmdQueryTooLongError, QmdOutputError: a qmd call failed.
            QmdIndexLostError: qmd's index lost its documents or is corrupt (being re-indexed).
        """
        self._check_open()
        q = without_stray_quote(request.query)  # a quote left open is a typo, not qmd syntax
        sources = request.sources
        limits = self.cfg.limits
        margin_ms = min(SEARCH_DEADLINE_MARGIN_MS, limits.timeout_ms // 10)
        deadline = anyio.current_time() + (limits.timeout_ms - margin_ms) / 1000
        if self.freshness is not None:
            self.freshness.check_watcher()  # a dead watcher marks the index dirty, is re-armed
            if self.agent.memory_search.sync.on_search:
                budget = int((deadline - anyio.current_time()) * 1000) // 2  # half the time left
                await self.freshness.before_search(
                    budget_ms=budget if sync_budget_ms is None else min(budget, sync_budget_ms))
        if self.cycle.is_running:
            await self.cycle.wait_running(max_ms=PENDING_UPDATE_WAIT_MS)
        limit, min_score = search_limits(limits.max_results, request.max_results, request.min_score)
        counts, _, lost = await self._read_counts()
        if lost is not None:
            raise QmdIndexLostError(lost)  # the builtin engine answers, no breaker
        wanted = [c for c in self.collections if sources is None or c.source in sources]
        if (unusable := self.reconcile_state.no_usable_collection(wanted)) is not None:
            self.last_search_error = unusable
            raise BackendUnavailableError("qmd", unusable)
        colls = [c for c in wanted if c.name not in self.reconcile_state.refused
                 and (not counts or counts.get(c.name, 0) > 0)]  # qmd holds nothing of the others
        if not colls:
            log.warning("qmd query skipped: no managed collection with documents in qmd's index")
            return self._outcome([], [])
        search_mode = self.mode_override or self.cfg.search_mode
        if search_mode in ("query", "vsearch"):  # models known missing or refused: fail fast
            problem = await self.model_state.problem(model_kinds(search_mode, self.cfg.rerank))
            if problem is not None:
                self.last_search_error = f"qmd {search_mode} skipped: {problem}"
                raise BackendUnavailableError("qmd", self.last_search_error)
        # what search mode sends, and the words searched one by one (content or CJK words)
        lexical, words = search_words(q, search_mode)
        # a question in search mode: its AND and each word alone in one call per collection
        lex = lex_queries(lexical, words) if self.lex_calls else ()
        plan = CallPlan(search_mode, limit, search_mode == "query" and self.cfg.rerank is False,
                        deadline, limits.timeout_ms, self.home.models_dir,
                        self.child_env, index_db=self.home.index_db, lex=lex)
        warm = self.warm.search if self.warm is not None else None
        try:
            # no warm child for lex calls while qmd's index is empty: its tool answers [] for a
            # lost collection, where a spawned call's "Collection not found" runs the repair
            entries = await search_with_repairs(lexical if search_mode == "search" else q,
                                                colls, plan, run=self._run_search,
                                                warm=warm if counts or not lex else None,
                                                reconcile=partial(self.reconcile, force=True),
                                                written=q, lexical=lexical)
            if plan.mode == "search" and words and not plan.lex:  # qmd rejected the lex call
                entries = await relax(words, entries, colls, plan, run=self._run_search,
                                      warm=warm, keep=POOL_FACTOR * limit,
                                      sent=lexical, counts=self.index_counts)
        except BackendUnavailableError as exc:
            self.last_search_error = exc.reason
            raise
        finally:
            if lex and not plan.lex:  # this qmd rejected the lex call: plain calls from now on
                self.lex_calls = False
            if plan.repair == "vec0":  # kept for the backend's lifetime, said in answers, status
                self.mode_override = "search"
            elif plan.repair is not None:
                self.search_fallback_reason = plan.repair
        notes = plan.notes
        # search mode ranks the passages of the notes found; vsearch/query: qmd's chunk stands
        question = q if plan.mode == "search" and words else None
        chunking = self.agent.memory_search.chunking
        results = await anyio.to_thread.run_sync(lambda: entry_hits(
            entries, question=question, limit=limit, min_score=min_score, notes=notes,
            roots=self.roots, workspace=self.agent.workspace_dir, index_db=self.home.index_db,
            cache=self._docid_cache, listings=self._listings,
            snippet_chars=self.cfg.limits.max_snippet_chars, tokens=chunking.tokens,
            overlap=chunking.overlap, sections=chunking.sections))
        self.hit_problems = [*(p for p in self.hit_problems if p not in notes), *notes][-5:]
        if sources is not None:
            results = [r for r in results if r.source in sources]
        results = select_results(results, max_results=limit)  # memory and sessions mix as on builtin
        stale = self.freshness.stale_warning() if self.freshness is not None else None
        return self._outcome(results, [*notes, *([stale] if stale else [])])

    def _outcome(self, results: list[MemorySearchResult], notes: list[str]) -> SearchOutcome:
        """The answer: ``results``, ``notes`` as warnings, the mode searches use now, provider/model ``qmd``."""
        return SearchOutcome(results=results, warnings=list(notes), provider="qmd", model="qmd",
                             mode=self.mode_override or self.cfg.search_mode)

    async def read_file(self, rel_path: str, *, from_line: int | None = None,
                        lines: int | None = None, from_char: int | None = None) -> MemoryReadResult:
        """``memory_get`` over qmd: workspace memory paths, or ``qmd/<collection>/<rel>``, both through
        the builtin engine's safe reader (custom collections count as extra paths).

        Raises:
            PathRefusedError: an invalid ``qmd/`` path, an unknown collection, or a refusal of the
                memory-file rule.
            BackendUnavailableError: the file exists but cannot be read.
        """
        self._check_open()
        rel = rel_path.strip()  # blank: refused by the memory-file rule (empty path)
        ws = self.agent.workspace_dir
        if rel.startswith("qmd/"):
            roots = dict(self.roots)
            return await anyio.to_thread.run_sync(
                lambda: read_qmd_path(roots, rel, from_line, lines, workspace=ws, from_char=from_char))
        extra = rule_extra_paths(self.agent)
        return await anyio.to_thread.run_sync(lambda: read_memory_page(
            ws, extra, rel, from_line=from_line, lines=lines, from_char=from_char))

    async def search_probe(self) -> str | None:
        """One tiny real search through the spawn path (``limits.timeoutMs``): ``None`` when qmd
        answered, else why not, one line. Needs no start-up."""
        return await probe_search(self._run_search, timeout_ms=self.cfg.limits.timeout_ms)

    def _skipped_notes(self) -> tuple[Discovery, list[SkippedFile]]:
        """The memory-file discovery, and the notes the builtin binary rule skips, read whole (blocking)."""
        cap = self.agent.engine.search.max_file_bytes
        found = list_memory_files(self.agent.workspace_dir, rule_extra_paths(self.agent), max_file_bytes=cap)
        return found, [SkippedFile(path=f.rel_path, reason=BINARY_FILE) for f in found.files
                       if is_binary_path(f.abs_path, max_bytes=cap)]

    async def status(self) -> MemoryStatus:
        """Counts from qmd's index and qmd's health, tried by a real search probe; ``custom.qmd`` holds
        qmd's own state (warm child, models, freshness, start-up problems, last errors)."""
        dead_watcher = self.freshness.check_watcher() if self.freshness is not None else None
        mode = self.mode_override or self.cfg.search_mode
        kinds = model_kinds(mode, self.cfg.rerank)
        model_problem = await self.model_state.problem(kinds) if kinds else None
        # counts of qmd as configured; backend.health.problem: an issue, a problem
        counts, count_error, _ = await self._read_counts()
        locked = await anyio.to_thread.run_sync(index_locked, self.home.index_db)
        indexing = indexing_in_progress(running=self.cycle.is_running, index_locked=locked,
                                        locks=(self.home.write_lock, self.home.embed_lock))
        probe = await self.search_probe()
        by_source: Counter[Source] = Counter()
        for coll, n in counts.items():
            by_source[self.roots[coll].source if coll in self.roots else "memory"] += n
        total = sum(counts.values())
        embed_state = self.cycle.embed
        sources: list[Source] = sorted({c.source for c in self.collections}) or ["memory"]
        unusable = self.reconcile_state.no_usable_collection(self.collections)
        probe_error = f"qmd search probe failed: {probe}" if probe else None
        embed_error = f"qmd embed failed: {embed_state.last_error}" if embed_state.last_error else None
        # the memory-file discovery and read as the builtin scan does them, so without a sync too:
        # the notes it skips (a symlink, too large, binary) and extra paths not there
        found, binary = await anyio.to_thread.run_sync(self._skipped_notes)
        missing = [i for i in found.issues if i.startswith(EXTRA_PATH_MISSING)]
        issues = [i for i in (
            self.health.problem, unusable, *self.reconcile_state.warnings, *missing,
            *(f"qmd start-up: {p}" for p in self.startup_problems), *self.hit_problems,
            VEC0_HINT if self.mode_override else None, probe_error,
            count_error if not (indexing and count_error and is_busy(count_error)) else None,
            f"qmd {mode} searches cannot run: {model_problem}" if model_problem else None,
            embed_error) if i]
        last_error = probe_error or unusable or self.cycle.last_error or self.last_error or embed_error
        return MemoryStatus(
            backend="qmd", agent_id=self.agent.agent_id, workspace_dir=str(self.agent.workspace_dir),
            db_path=str(self.home.index_db), files=total, chunks=total, provider="qmd",
            requested_provider="qmd", model="qmd", search_mode=mode,
            sources=sources,
            source_counts=[SourceCount(source=s, files=n, chunks=n) for s, n in sorted(by_source.items())],
            vector={"enabled": self.cfg.search_mode != "search"}, issues=issues,
            skipped=[*found.skipped, *binary],
            last_sync_at_ms=self.cycle.last_update_at, healthy=last_error is None,
            last_error=last_error,
            dirty=bool(indexing or (self.freshness and (self.freshness.dirty or dead_watcher))),
            dirty_reason=(dead_watcher or indexing or (self.freshness.dirty_reason if self.freshness else None)),
            custom={"qmd": {
                "binary": str(self.location.path), "version": self.location.version,
                "collections": len(self.collections),
                "collectionNames": [c.name for c in self.collections],
                "lastUpdateAt": self.cycle.last_update_at, "embedFailures": embed_state.failures,
                "embedBackoffUntil": embed_state.backoff_until, "lastEmbedError": embed_state.last_error, "searchMode": self.cfg.search_mode,
                "searchFallbackReason": self.search_fallback_reason, "lastError": last_error,
                "refusedCollections": dict(self.reconcile_state.refused),
                "searchModeOverride": self.mode_override,
                "searchProbe": {"ok": probe is None, "error": probe},
                "lastSearchError": self.last_search_error,
                "freshness": self.freshness.snapshot() if self.freshness else None,
                "warm": self.warm.describe() if self.warm is not None else {
                    "enabled": False, "state": "off", "reason": "one-shot commands spawn qmd"
                    if self.mode == "cli" else "memory.qmd.mcp.enabled is false"},
                "indexProblem": self.health.problem, "modelProblem": model_problem,
                "models": model_cache_state(self.home.models_dir, kinds,
                                            checked=self.model_state.gguf_checked),
                "indexing": indexing,
                "startup": {"problems": list(self.startup_problems)}}})

