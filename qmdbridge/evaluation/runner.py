"""The eval runner: index a workspace in a throw-away store, search every question through the real
``MemoryManager`` (builtin backend), judge the hits and report recall.

Two inputs:

- :func:`run_locomo`: LoCoMo files (a folder of ``*.json`` or one file); each conversation is
  converted (``qmdbridge.evaluation.locomo``) into a workspace in a temporary folder and gets
  its own store in a temporary state dir;
- :func:`run_queries`: a JSONL file of ``{"query", "path", "line"?, "text"?, "category"?, "id"?}``
  over an existing workspace, indexed into a temporary state dir (the agent's own index is not
  touched).

Either way nothing is left behind (unless a cache folder is given: :attr:`EvalOptions.cache_dir`
keeps each workspace's store, with its embedding cache, for the next run), the config's
``memorySearch`` settings apply (with the store forced into the state dir, and the embedding
provider optionally overridden), and the search latency is measured around the manager's
``search`` call only.
"""

from __future__ import annotations

import json
import re
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel

from fallback.errors import UsageError
from fallback.settings import EngineSettings, MemorySearchSettings, ProviderName
from qmdbridge.config import OpenClawConfig, ResolvedAgent, resolve_agent
from qmdbridge.evaluation.locomo import CATEGORY_NAMES, load_locomo, locomo_files, write_workspace
from qmdbridge.evaluation.metrics import (
    EvalMetrics,
    EvalQuestion,
    Evidence,
    QuestionOutcome,
    judge,
    recall_at,
    summarize,
)

__all__ = [
    "DEFAULT_MAX_RESULTS",
    "EvalOptions",
    "EvalReport",
    "ProgressCallback",
    "WorkspaceReport",
    "WorkspaceRun",
    "eval_agent",
    "evaluate_workspace",
    "load_queries",
    "run_locomo",
    "run_queries",
]

# Hits per question: R@10 needs ten, and the benchmark's published figures use maxResults 10.
DEFAULT_MAX_RESULTS = 10
# The keys a line of a queries file may have.
QUERY_KEYS = ("query", "path", "line", "text", "category", "id")
# What a workspace name may keep in the name of its cache folder (anything else becomes ``_``).
_CACHE_NAME_RE = re.compile(r"[^A-Za-z0-9._-]")

ProgressCallback = Callable[[str, int, int], None]
"""``on_progress(workspace_name, questions_done, questions_total)``, called after each search."""


@dataclass(frozen=True)
class EvalOptions:
    """How the questions are searched.

    Attributes:
        max_results: hits asked for per question (>= 1; default 10).
        min_score: score floor in [0, 1]; ``None`` keeps the config's ``query.minScore``.
        provider: embedding provider override (``none`` = keyword-only, ``local``, ``openai``
            ...); ``None`` keeps the config's ``memorySearch.provider``.
        model_path: the local GGUF model (sets ``local.modelPath``; implies ``provider`` local
            when no provider is given).
        cache_dir: keep each workspace's state dir (its store and the store's embedding cache)
            in ``<cache_dir>/<workspace name>`` across runs instead of a temporary folder, so a
            rerun embeds only text it has not seen (``index_ms`` is then the time of that
            incremental sync); ``None``: everything is temporary.
    """

    max_results: int = DEFAULT_MAX_RESULTS
    min_score: float | None = None
    provider: str | None = None
    model_path: str | None = None
    cache_dir: Path | None = None

    def state_dir(self, name: str, scratch: Path) -> Path:
        """The state dir of workspace ``name``: ``<cache_dir>/<name>`` (characters other than
        letters, digits, ``.``, ``_`` and ``-`` replaced by ``_``) when caching, else
        ``<scratch>/state``."""
        if self.cache_dir is None:
            return scratch / "state"
        return Path(self.cache_dir).expanduser() / (_CACHE_NAME_RE.sub("_", name) or "_")


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, populate_by_name=True, alias_generator=to_camel)

    def to_json_dict(self) -> dict[str, Any]:
        """The JSON-ready dict: camelCase keys, every key present."""
        return self.model_dump(by_alias=True, mode="json")


class WorkspaceReport(_Model):
    """One indexed workspace of the run (a LoCoMo conversation, or the queries' workspace).

    Attributes:
        name: conversation name or workspace folder name.
        source: the file it came from (LoCoMo) or the workspace path.
        files / chunks: what the index holds after the sync.
        questions / evidence: questions searched and their evidence items.
        recall_at5: R@5 of this workspace alone (``None`` without evidence).
        index_ms: wall time of the sync in ms.
    """

    name: str
    source: str
    files: int
    chunks: int
    questions: int
    evidence: int
    recall_at5: float | None
    index_ms: float


class EvalReport(_Model):
    """The outcome of one eval run (``qmdbridge eval --json`` prints it).

    Attributes:
        dataset: ``locomo`` or ``queries``.
        inputs: the files read (LoCoMo files, or the queries file).
        backend: always ``builtin``.
        provider / model / mode: what answered, as the search responses name it (``mode`` is
            ``fts-only`` or ``hybrid``).
        max_results / min_score: the search limits in effect.
        index_ms: total sync time in ms over all workspaces.
        metrics: the recall metrics (``qmdbridge.evaluation.metrics.EvalMetrics``).
        workspaces: one entry per indexed workspace.
        warnings: distinct warnings of the search responses.
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
    warnings: list[str]


@dataclass
class WorkspaceRun:
    """What one workspace's run produced (collected into the report).

    Attributes:
        outcomes: one judged outcome per question, in order.
        workspace: the workspace's summary row.
        provider / model / mode: as the first search response named them.
        warnings: distinct warnings of the search responses.
    """

    outcomes: list[QuestionOutcome]
    workspace: WorkspaceReport
    provider: str | None
    model: str | None
    mode: str | None
    warnings: list[str]


def eval_agent(cfg: OpenClawConfig, *, agent_id: str | None, workspace: Path, state_dir: Path,
               options: EvalOptions) -> ResolvedAgent:
    """The agent config an eval searches with: the configured agent moved onto ``workspace``,
    its store forced to ``<state_dir>/memory/<agent>.sqlite``, the provider overridden.

    Raises:
        ConfigError: the merged settings are invalid.
        UsageError: an unknown provider, or ``model_path`` given with a provider other than
            ``local``.
    """
    if options.provider is not None and options.provider not in get_args(ProviderName):
        raise UsageError(f"unknown embedding provider {options.provider!r} "
                         f"(one of: {', '.join(get_args(ProviderName))})")
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
    return agent.model_copy(update={"memory_search": search, "engine": engine})


async def evaluate_workspace(agent: ResolvedAgent, questions: Sequence[EvalQuestion], *,
                             options: EvalOptions, name: str, source: str,
                             on_progress: ProgressCallback | None = None) -> WorkspaceRun:
    """Sync the agent's index, then search and judge every question (builtin backend).

    Args:
        agent: the agent config (see :func:`eval_agent`); its workspace is synced first.
        questions: what to search, in order.
        options: limits (the provider is already in ``agent``).
        name / source: the workspace's name and origin, for the report.
        on_progress: called after each search.

    Returns:
        The :class:`WorkspaceRun`: outcomes and the workspace's summary.

    Raises:
        UsageError: bad limits; BackendUnavailableError / IndexStoreError: the engine failed.
    """
    from qmdbridge.manager import MemoryManager

    outcomes: list[QuestionOutcome] = []
    provider = model = mode = None
    warnings: list[str] = []
    async with MemoryManager(agent, backend="builtin") as manager:
        start = time.perf_counter()
        await manager.sync(reason="eval")
        index_ms = (time.perf_counter() - start) * 1000
        status = await manager.status()
        for done, question in enumerate(questions, start=1):
            start = time.perf_counter()
            response = await manager.search(question.query, max_results=options.max_results,
                                            min_score=options.min_score)
            latency_ms = (time.perf_counter() - start) * 1000
            outcomes.append(judge(question, response.results, latency_ms=latency_ms))
            provider, model, mode = provider or response.provider, model or response.model, mode or response.mode
            warnings.extend(w for w in response.warnings if w not in warnings)
            if on_progress is not None:
                on_progress(name, done, len(questions))
    items = [ev for q in outcomes for ev in q.evidence]
    report = WorkspaceReport(name=name, source=source, files=status.files, chunks=status.chunks,
                             questions=len(outcomes), evidence=len(items),
                             recall_at5=recall_at(items, 5, lambda e: e.line_rank), index_ms=index_ms)
    return WorkspaceRun(outcomes, report, provider, model, mode, warnings)


def _report(dataset: Literal["locomo", "queries"], inputs: list[str], runs: list[WorkspaceRun], *,
            agent: ResolvedAgent, options: EvalOptions, categories: Sequence[str]) -> EvalReport:
    first = runs[0] if runs else None
    warnings: list[str] = []
    for run in runs:
        warnings.extend(w for w in run.warnings if w not in warnings)
    min_score = options.min_score if options.min_score is not None else agent.memory_search.query.min_score
    return EvalReport(
        dataset=dataset, inputs=inputs,
        provider=first.provider if first else None, model=first.model if first else None,
        mode=first.mode if first else None, max_results=options.max_results, min_score=min_score,
        index_ms=sum(r.workspace.index_ms for r in runs),
        metrics=summarize([o for r in runs for o in r.outcomes], categories=categories),
        workspaces=[r.workspace for r in runs], warnings=warnings)


def _check_limits(options: EvalOptions) -> None:
    if options.max_results < 1:
        raise UsageError("max results must be at least 1")
    if options.min_score is not None and not 0.0 <= options.min_score <= 1.0:
        raise UsageError("min score must be between 0 and 1")


async def run_locomo(path: str | Path, *, cfg: OpenClawConfig, agent_id: str | None = None,
                     options: EvalOptions = EvalOptions(),
                     on_progress: ProgressCallback | None = None) -> EvalReport:
    """Evaluate LoCoMo conversations: each one converted into a workspace in a temporary
    folder, indexed into its own temporary store, every kept question searched.

    Args:
        path: a LoCoMo ``*.json`` file or a folder of them.
        cfg: the loaded config (its ``memorySearch`` settings apply).
        agent_id: whose settings (default: the config's default agent).
        options: limits and provider override.
        on_progress: called after each search.

    Returns:
        The :class:`EvalReport` (``per_category`` always lists LoCoMo's four categories).

    Raises:
        UsageError: no LoCoMo file, a malformed one, no question at all, or bad limits.
        BackendUnavailableError / IndexStoreError: the engine failed.
    """
    _check_limits(options)
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


def _query_line(obj: Any, *, where: str, workspace: Path) -> EvalQuestion:
    if not isinstance(obj, dict):
        raise UsageError(f"{where}: each line must be a JSON object")
    unknown = sorted(set(obj) - set(QUERY_KEYS))
    if unknown:
        raise UsageError(f"{where}: unknown key {unknown[0]!r} (allowed: {', '.join(QUERY_KEYS)})")
    query, rel, line, text = obj.get("query"), obj.get("path"), obj.get("line"), obj.get("text")
    if not isinstance(query, str) or not query.strip():
        raise UsageError(f"{where}: 'query' must be a non-empty string")
    if not isinstance(rel, str) or not rel.strip():
        raise UsageError(f"{where}: 'path' must be a workspace-relative path")
    posix = PurePosixPath(rel.strip().replace("\\", "/"))
    if posix.is_absolute():
        raise UsageError(f"{where}: 'path' must be relative to the workspace, not {rel!r}")
    rel = posix.as_posix()
    if not (workspace / rel).is_file():
        raise UsageError(f"{where}: 'path' {rel!r} is not a file in the workspace {workspace}")
    if line is not None and (isinstance(line, bool) or not isinstance(line, int) or line < 1):
        raise UsageError(f"{where}: 'line' must be a 1-based line number")
    if text is not None and (not isinstance(text, str) or not text.strip()):
        raise UsageError(f"{where}: 'text' must be a non-empty string")
    category, ref = obj.get("category"), obj.get("id")
    if category is not None and (isinstance(category, bool) or not isinstance(category, (str, int))):
        raise UsageError(f"{where}: 'category' must be a string or a number")
    return EvalQuestion(query=query, evidence=(Evidence(path=rel, line=line, text=text),),
                        category=None if category is None else str(category),
                        ref=str(ref) if ref is not None else where)


def load_queries(path: str | Path, workspace: str | Path) -> list[EvalQuestion]:
    """Read a JSONL queries file: one question per line, each with one evidence item.

    A line is ``{"query": str, "path": str, "line"?: int >= 1, "text"?: str, "category"?: str |
    int, "id"?: any}``; ``path`` is workspace-relative and must name a file of ``workspace``.
    Blank lines are skipped.

    Raises:
        UsageError: the file cannot be read, a line is not JSON or breaks the rules above (the
            message names ``file:line``), or there is no question.
    """
    p, ws = Path(path).expanduser(), Path(workspace).expanduser().resolve()
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot read queries file {p}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise UsageError(f"{p}: not valid UTF-8 at byte {exc.start}") from None
    questions = []
    for n, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
        except ValueError as exc:
            raise UsageError(f"{p}:{n}: not valid JSON: {exc}") from None
        questions.append(_query_line(obj, where=f"{p}:{n}", workspace=ws))
    if not questions:
        raise UsageError(f"no queries in {p}")
    return questions


async def run_queries(queries_file: str | Path, workspace: str | Path, *, cfg: OpenClawConfig,
                      agent_id: str | None = None, options: EvalOptions = EvalOptions(),
                      on_progress: ProgressCallback | None = None) -> EvalReport:
    """Evaluate a JSONL query set over ``workspace``, indexed into a temporary store.

    Args:
        queries_file: the JSONL file (see :func:`load_queries`).
        workspace: the memory workspace the paths are relative to (read only).
        cfg / agent_id / options / on_progress: as for :func:`run_locomo`.

    Returns:
        The :class:`EvalReport`; ``snippet_recall_at5`` is ``None`` when no line has a ``text``,
        ``per_category`` lists the ``category`` values met.

    Raises:
        UsageError: the workspace does not exist, a bad queries file, or bad limits.
        BackendUnavailableError / IndexStoreError: the engine failed.
    """
    _check_limits(options)
    ws = Path(workspace).expanduser().resolve()
    if not ws.is_dir():
        raise UsageError(f"workspace {'is not a directory' if ws.exists() else 'does not exist'}: {ws}")
    questions = load_queries(queries_file, ws)
    with tempfile.TemporaryDirectory(prefix="qmdbridge-eval-") as tmp:
        agent = eval_agent(cfg, agent_id=agent_id, workspace=ws,
                           state_dir=options.state_dir(ws.name, Path(tmp)), options=options)
        run = await evaluate_workspace(agent, questions, options=options, name=ws.name,
                                       source=str(ws), on_progress=on_progress)
    return _report("queries", [str(Path(queries_file).expanduser())], [run], agent=agent,
                   options=options, categories=())
