"""The eval runner: index a workspace in a throw-away store, search every question through the real
``MemoryManager`` (builtin engine, or the qmd sidecar), judge the hits and report recall.

Latency is measured around the manager's ``search`` call only.
"""

from __future__ import annotations

import re
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

import anyio

from fallback.errors import UsageError
from fallback.models import SearchResponse
from fallback.request import SearchRequest, check_limits
from fallback.settings import EngineSettings, MemorySearchSettings, ProviderName
from qmdbridge.config import OpenClawConfig, QmdConfig, ResolvedAgent, resolve_agent
from qmdbridge.evaluation.locomo import CATEGORY_NAMES, load_locomo, locomo_files, write_workspace
from qmdbridge.evaluation.metrics import (
    EvalMetrics,
    EvalModel,
    EvalQuestion,
    Miss,
    QuestionOutcome,
    find_miss,
    judge,
    recall_at,
    summarize,
)
from qmdbridge.evaluation.queries import load_queries
from qmdbridge.manager import MemoryManager, require_workspace
from qmdbridge.paths import qmd_home
from qmdbridge.qmd.query_text import search_limits

__all__ = [
    "DEFAULT_MAX_RESULTS",
    "EvalBackend",
    "EvalOptions",
    "EvalReport",
    "ProgressCallback",
    "WorkspaceReport",
    "WorkspaceRun",
    "backend_tally",
    "check_options",
    "eval_agent",
    "evaluate_workspace",
    "run_locomo",
    "run_queries",
]

# Hits per question: R@10 needs ten, and the benchmark's published figures use maxResults 10.
DEFAULT_MAX_RESULTS = 10
# What a workspace name may keep in the name of its cache folder (anything else becomes ``_``).
_CACHE_NAME_RE = re.compile(r"[^A-Za-z0-9._-]")

ProgressCallback = Callable[[str, int, int], None]
"""``on_progress(workspace_name, questions_done, questions_total)``, called after each search."""

EvalBackend = Literal["builtin", "qmd"]


@dataclass(frozen=True)
class EvalOptions:
    """How the questions are searched.

    Attributes:
        max_results: hits asked for per question (>= 1; qmd caps it at its ``limits.maxResults``).
        min_score: score floor in [0, 1]; ``None`` keeps the backend's default.
        provider: embedding provider override (builtin engine only); ``None`` keeps the config's.
        model_path: the local GGUF model (implies provider ``local``; builtin engine only).
        cache_dir: keep each workspace's state dir in ``<cache_dir>/<workspace name>`` across
            runs, so a rerun embeds only new text; ``None``: everything is temporary.
        backend: ``builtin`` or ``qmd`` (falling back to the builtin engine as for an agent).
        qmd_search_mode: overrides ``memory.qmd.searchMode``, one of its values (``qmd`` backend only).
        long_lived: search through a started ``full``-mode manager, as ``serve`` and ``mcp``
            do (qmd: its warm child waited for first); ``False``: as one-shot CLI commands.
    """

    max_results: int = DEFAULT_MAX_RESULTS
    min_score: float | None = None
    provider: str | None = None
    model_path: str | None = None
    cache_dir: Path | None = None
    backend: EvalBackend = "builtin"
    qmd_search_mode: str | None = None
    long_lived: bool = False

    def state_dir(self, name: str, scratch: Path) -> Path:
        """``<cache_dir>/<name>`` (unsafe characters as ``_``) when caching, else ``<scratch>/state``."""
        if self.cache_dir is None:
            return scratch / "state"
        return Path(self.cache_dir).expanduser() / (_CACHE_NAME_RE.sub("_", name) or "_")


class WorkspaceReport(EvalModel):
    """One indexed workspace of the run: its name and the file or folder it came from, what the
    index holds after the sync (qmd: as its ``status`` counts), questions and evidence items,
    R@5 of this workspace alone, the sync's wall time in ms and :func:`backend_tally`'s fields."""

    name: str
    source: str
    files: int
    chunks: int
    questions: int
    evidence: int
    recall_at5: float | None
    index_ms: float
    answered_by: dict[str, int]
    fallbacks: int
    first_fallback_reason: str | None


class EvalReport(EvalModel):
    """The outcome of one eval run (``qmdbridge eval --json`` prints it).

    Attributes:
        provider / model / mode: as the first answer of ``backend`` (the one measured) names them.
        max_results / min_score: the search limits in effect; index_ms: sync time of all workspaces.
        misses: every question R@5 missed, in order; warnings: the answers' distinct warnings.
        answered_by / fallbacks / first_fallback_reason: see :func:`backend_tally`; warm_calls:
            the warm ``qmd mcp`` child's collection searches (long-lived qmd runs).
        all_fell_back: ``backend`` is ``qmd`` and qmd answered no search (the CLI exits 1).
    """

    dataset: Literal["locomo", "queries"]
    inputs: list[str]
    backend: str = "builtin"
    provider: str | None
    model: str | None
    mode: str | None
    max_results: int
    min_score: float
    index_ms: float
    metrics: EvalMetrics
    workspaces: list[WorkspaceReport]
    misses: list[Miss]
    warnings: list[str]
    answered_by: dict[str, int]
    fallbacks: int
    first_fallback_reason: str | None
    long_lived: bool = False
    warm_calls: dict[str, int] | None = None
    all_fell_back: bool


def backend_tally(answers: Sequence[tuple[str, str | None]]) -> dict[str, Any]:
    """Which backend answered a run's searches, from each answer's ``(backend, fallback reason or
    None)``: ``{"answered_by": {"qmd": n, "builtin": n}, "fallbacks": n, "first_fallback_reason"}``
    (every backend but qmd counts as builtin)."""
    qmd = sum(backend == "qmd" for backend, _ in answers)
    reasons = [reason for _, reason in answers if reason is not None]
    return {"answered_by": {"qmd": qmd, "builtin": len(answers) - qmd}, "fallbacks": len(reasons),
            "first_fallback_reason": next(iter(reasons), None)}


@dataclass
class WorkspaceRun:
    """One workspace's run: outcomes and misses in order, the summary row, the answer naming
    what answered (the measured backend's first, else the first), warnings, each answer's
    ``(backend, fallback reason)`` and the warm ``qmd mcp`` child's ``{"answered", "spawned"}``
    collection searches (``None``: no warm child)."""

    outcomes: list[QuestionOutcome]
    misses: list[Miss]
    workspace: WorkspaceReport
    first: SearchResponse | None
    warnings: list[str]
    answers: list[tuple[str, str | None]]
    warm_calls: dict[str, int] | None


def eval_agent(cfg: OpenClawConfig, *, agent_id: str | None, workspace: Path, state_dir: Path,
               options: EvalOptions) -> ResolvedAgent:
    """The configured agent moved onto ``workspace`` and ``state_dir``, the provider or the qmd
    search mode overridden.

    Raises:
        ConfigError: the merged settings are invalid.
        UsageError: ``model_path`` with a provider other than ``local``, or see :func:`check_options`.
    """
    check_options(options)
    agent = resolve_agent(cfg, agent_id, workspace=workspace, env={"OPENCLAW_STATE_DIR": str(state_dir)})
    raw = agent.memory_search.model_dump(by_alias=True)
    raw["store"]["path"] = None
    if options.model_path is not None:
        if options.provider not in (None, "local"):
            raise UsageError(f"--model is the local GGUF model; it does not apply to provider {options.provider}")
        raw["provider"] = "local"
        raw["local"]["modelPath"] = options.model_path
    if options.provider is not None:
        raw["provider"] = options.provider
    search = MemorySearchSettings.model_validate(raw)
    engine = EngineSettings.for_workspace(agent.workspace_dir, agent_id=agent.agent_id,
                                          state_dir=agent.state_dir, search=search)
    memory = agent.memory
    if options.qmd_search_mode is not None:
        memory = memory.model_copy(update={"qmd": memory.qmd.model_copy(
            update={"search_mode": options.qmd_search_mode})})
    return agent.model_copy(update={"memory_search": search, "engine": engine, "memory": memory})


async def evaluate_workspace(agent: ResolvedAgent, questions: Sequence[EvalQuestion], *,
                             options: EvalOptions, name: str, source: str,
                             on_progress: ProgressCallback | None = None) -> WorkspaceRun:
    """Sync ``agent``'s index (:func:`eval_agent`; qmd: start-up and ``qmd update`` too), then
    search and judge every question in order; ``name`` / ``source`` name the workspace in the
    report, ``on_progress`` is called after each search.

    Raises:
        UsageError: bad limits. BackendUnavailableError / IndexStoreError: the engine or
            ``qmd update`` failed.
    """
    outcomes: list[QuestionOutcome] = []
    misses: list[Miss] = []
    first: SearchResponse | None = None
    warnings: list[str] = []
    answers: list[tuple[str, str | None]] = []
    if options.backend == "qmd":  # an earlier run's failure must not make this one fall back
        home = qmd_home(agent.state_dir, agent.agent_id)
        for breaker in (home.breaker, home.startup_breaker):
            breaker.unlink(missing_ok=True)
    async with MemoryManager(agent, backend=options.backend,
                             mode="full" if options.long_lived else "cli") as manager:
        start = time.perf_counter()
        if options.long_lived:
            await manager.start()
        await manager.sync(reason="eval")
        index_ms = (time.perf_counter() - start) * 1000
        warm = getattr(await manager.qmd(), "warm", None) if options.long_lived else None
        if warm is not None:  # the warm qmd child, waited for up to update.commandTimeoutMs
            with anyio.move_on_after(agent.memory.qmd.update.command_timeout_ms / 1000):
                await warm.wait_for(lambda child: child.ready)
        status = await manager.status()
        for done, question in enumerate(questions, start=1):
            start = time.perf_counter()
            response = await manager.search(question.query, max_results=options.max_results,
                                            min_score=options.min_score)
            latency_ms = (time.perf_counter() - start) * 1000
            outcomes.append(judge(question, response.results, latency_ms=latency_ms))
            if (miss := find_miss(question, response.results, workspace=name)) is not None:
                misses.append(miss)
            answers.append((response.backend, response.fallback.reason if response.fallback else None))
            if first is None or (first.backend != options.backend and response.backend == options.backend):
                first = response
            warnings.extend(w for w in response.warnings if w not in warnings)
            if on_progress is not None:
                on_progress(name, done, len(questions))
        warm_calls = None if warm is None else {"answered": warm.answered, "spawned": warm.spawn_fallbacks}
    items = [ev for q in outcomes for ev in q.evidence]
    report = WorkspaceReport(name=name, source=source, files=status.files, chunks=status.chunks,
                             questions=len(outcomes), evidence=len(items),
                             recall_at5=recall_at(items, 5, lambda e: e.line_rank), index_ms=index_ms,
                             **backend_tally(answers))
    return WorkspaceRun(outcomes, misses, report, first, warnings, answers, warm_calls)


def _report(dataset: Literal["locomo", "queries"], inputs: list[str], runs: list[WorkspaceRun], *,
            agent: ResolvedAgent, options: EvalOptions, categories: Sequence[str]) -> EvalReport:
    # the run of the measured backend that answered first names what answered
    first = next((r.first for r in runs if r.workspace.answered_by[options.backend]), runs[0].first if runs else None)
    warnings = list(dict.fromkeys(w for r in runs for w in r.warnings))
    tally = backend_tally([a for r in runs for a in r.answers])
    answered, warm = tally["answered_by"], [r.warm_calls for r in runs if r.warm_calls is not None]
    max_results, min_score = options.max_results, options.min_score
    if options.backend == "qmd":  # what the qmd backend applies
        max_results, min_score = search_limits(agent.memory.qmd.limits.max_results, max_results, min_score)
    else:  # as the builtin's requests take them
        q = agent.memory_search.query
        max_results, min_score = SearchRequest("", max_results, min_score).limits(q.max_results, q.min_score)
    return EvalReport(
        dataset=dataset, inputs=inputs, backend=options.backend,
        provider=first.provider if first else None, model=first.model if first else None,
        mode=first.mode if first else None, max_results=max_results, min_score=min_score,
        index_ms=sum(r.workspace.index_ms for r in runs),
        metrics=summarize([o for r in runs for o in r.outcomes], categories=categories),
        workspaces=[r.workspace for r in runs], misses=[m for r in runs for m in r.misses],
        warnings=warnings, **tally, long_lived=options.long_lived,
        warm_calls={k: sum(w[k] for w in warm) for k in ("answered", "spawned")} if warm else None,
        all_fell_back=options.backend == "qmd" and answered["qmd"] == 0 and answered["builtin"] > 0)


def check_options(options: EvalOptions) -> None:
    """Check the limits and that every option applies to the backend measured.

    Raises:
        UsageError: limits out of range (``fallback.request.check_limits``), an unknown backend,
            provider or search mode, ``provider``/``model_path`` with qmd, ``qmd_search_mode`` with
            builtin.
    """
    check_limits(max_results=options.max_results, min_score=options.min_score)
    for what, value, allowed in (("backend", options.backend, get_args(EvalBackend)),
                                 ("embedding provider", options.provider, get_args(ProviderName)),
                                 ("qmd search mode", options.qmd_search_mode,
                                  get_args(QmdConfig.model_fields["search_mode"].annotation))):
        if value is not None and value not in allowed:
            raise UsageError(f"unknown {what} {value!r} (one of: {', '.join(allowed)})")
    if options.backend == "qmd":
        given = [flag for flag, value in (("--provider", options.provider), ("--model", options.model_path))
                 if value is not None]
        if given:
            raise UsageError(f"{' and '.join(given)} {'apply' if len(given) > 1 else 'applies'} to the "
                             "builtin engine (its embedding provider); qmd embeds with its own models "
                             "(choose its search mode with --qmd-search-mode)")
    elif options.qmd_search_mode is not None:
        raise UsageError("--qmd-search-mode applies to --backend qmd")


async def run_locomo(path: str | Path, *, cfg: OpenClawConfig, agent_id: str | None = None,
                     options: EvalOptions = EvalOptions(),
                     on_progress: ProgressCallback | None = None) -> EvalReport:
    """Evaluate LoCoMo conversations (``path``: a ``*.json`` file or a folder of them), each as
    its own temporary workspace and index, with the settings of ``cfg``'s agent ``agent_id``
    (default: the config's default agent); ``on_progress`` is called after each search.
    Returns the report, ``per_category`` listing LoCoMo's four categories.

    Raises:
        UsageError: no LoCoMo file, a malformed one, no question, bad limits or options.
        BackendUnavailableError / IndexStoreError: the engine failed.
    """
    files = locomo_files(path)
    conversations = [c for f in files for c in load_locomo(f)]
    if not any(c.questions for c in conversations):
        raise UsageError(f"no question with evidence in {path}")
    runs: list[WorkspaceRun] = []
    agent: ResolvedAgent | None = None
    for conversation in conversations:
        with tempfile.TemporaryDirectory(prefix="qmdbridge-eval-") as tmp:
            ws = write_workspace(conversation, Path(tmp) / "workspace")
            agent = eval_agent(cfg, agent_id=agent_id, workspace=ws,
                               state_dir=options.state_dir(conversation.name, Path(tmp)),
                               options=options)
            runs.append(await evaluate_workspace(agent, conversation.questions, options=options,
                                                 name=conversation.name, source=conversation.source,
                                                 on_progress=on_progress))
    assert agent is not None  # at least one conversation has questions
    return _report("locomo", [str(f) for f in files], runs, agent=agent, options=options,
                   categories=list(CATEGORY_NAMES.values()))


async def run_queries(queries_file: str | Path, workspace: str | Path, *, cfg: OpenClawConfig,
                      agent_id: str | None = None, options: EvalOptions = EvalOptions(),
                      on_progress: ProgressCallback | None = None) -> EvalReport:
    """Evaluate a JSONL query set (:func:`load_queries`) over ``workspace`` (read only),
    indexed into a temporary store; other arguments as for :func:`run_locomo`. Returns the
    report, ``per_category`` holding the ``category`` values met.

    Raises:
        UsageError: no such workspace, a bad queries file, bad limits or options.
        BackendUnavailableError / IndexStoreError: the engine failed.
    """
    ws = Path(workspace).expanduser().resolve()
    require_workspace(ws)
    questions = load_queries(queries_file, ws)
    with tempfile.TemporaryDirectory(prefix="qmdbridge-eval-") as tmp:
        agent = eval_agent(cfg, agent_id=agent_id, workspace=ws,
                           state_dir=options.state_dir(ws.name, Path(tmp)), options=options)
        run = await evaluate_workspace(agent, questions, options=options, name=ws.name,
                                       source=str(ws), on_progress=on_progress)
    return _report("queries", [str(Path(queries_file).expanduser())], [run], agent=agent,
                   options=options, categories=())
