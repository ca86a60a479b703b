"""Result and status models shared by both backends (one definition of a search hit).

Conventions, stated once:
- line numbers are 1-based and inclusive (``startLine <= endLine``);
- ``score`` is in ``[0, 1]``, higher is better;
- ``source`` is ``"memory"`` (Markdown memory files) or ``"sessions"`` (session transcripts);
- lengths (snippet caps, paging budgets) are counted in code points, and no snippet or page
  ever splits a code point;
- paths are workspace-relative with ``/`` separators (extra paths outside the workspace may
  start with ``../``; qmd collections outside the workspace read ``qmd/<collection>/<rel>``).

All models are frozen pydantic models (``SkippedFile``, re-exported here, is a plain frozen
dataclass of ``fallback/skipped.py``: discovery builds it without pydantic); JSON uses the camelCase aliases and always emits every
key (``null`` rather than missing): dump with ``model_dump(by_alias=True)``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

from fallback.answer import answer_doc, hit_doc
from fallback.skipped import SkippedFile

__all__ = [
    "BackgroundError",
    "BackgroundStatus",
    "ExplainDecay",
    "ExplainFloor",
    "ExplainFusion",
    "ExplainKeyword",
    "ExplainRerank",
    "ExplainReorder",
    "ExplainVector",
    "FallbackInfo",
    "HitExplain",
    "MemoryReadResult",
    "MemorySearchResult",
    "MemoryStatus",
    "ScopeDecision",
    "SearchResponse",
    "SkippedFile",
    "SourceCount",
    "Source",
]

Source = Literal["memory", "sessions"]


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, populate_by_name=True, alias_generator=to_camel,
                              extra="ignore")

    def to_json_dict(self) -> dict[str, Any]:
        """Return the JSON-ready dict: camelCase keys, every key present."""
        return self.model_dump(by_alias=True, mode="json")


class ExplainKeyword(_Model):
    """The keyword side of a hit: ``rank`` (1-based, in BM25 order among the keyword
    candidates), ``bm25`` (FTS5 ``bm25()``, lower is better; ``None`` for a substring-only
    match) and ``text_score`` (the coverage-boosted text score in ``[0, 1]`` that is fused)."""

    rank: int
    bm25: float | None
    text_score: float


class ExplainVector(_Model):
    """The vector side of a hit: ``rank`` (1-based, by cosine) and ``cosine`` similarity (of
    the chunk's best window: chunks are embedded as windows of a few lines, max-pooled) to the
    query vector searched; ``contrast``: the query's common terms contrasted out of that vector
    (``fallback/search/contrast.py``), ``[]`` when none."""

    rank: int
    cosine: float
    contrast: list[str] = Field(default_factory=list)


class ExplainFusion(_Model):
    """The hybrid merge (``fallback/search/fusion.py``): ``method`` (``scores`` or ``rrf``), the
    hit's evidence on each side in ``[0, 1]`` (``text_evidence``: its text score over the best
    keyword hit's; ``vector_evidence``: the standard score of its cosine over the index, over
    3.5; 0 when the side did not return it), the weights and the calibrated
    ``score = 0.5 * max(v, t) + 0.5 * (vector_weight * v + text_weight * t)``.
    """

    method: str
    vector_evidence: float
    text_evidence: float
    vector_weight: float
    text_weight: float
    score: float


class ExplainDecay(_Model):
    """Temporal decay: ``score = before * factor``, ``factor = 0.5 ** (age_days / half_life_days)``.

    ``age_days`` is ``None`` (and ``factor`` 1) for an evergreen file (``MEMORY.md``, undated
    notes); ``dated_by`` is ``name`` (a ``YYYY-MM-DD`` file name), ``mtime`` or ``None``.
    """

    age_days: float | None
    half_life_days: float
    factor: float
    dated_by: str | None
    score: float


class ExplainRerank(_Model):
    """The reranker stage: the provider's raw ``relevance`` (its own scale; ``None`` when this
    hit was past ``topN`` or left unscored) and the hit's 1-based rank before and after."""

    provider: str
    model: str
    relevance: float | None
    rank_before: int
    rank_after: int


class ExplainReorder(_Model):
    """MMR diversity re-ranking: ``lambda`` and the hit's 1-based rank before and after."""

    lambda_: float = Field(alias="lambda")
    rank_before: int
    rank_after: int


class ExplainFloor(_Model):
    """The score floor: ``min_score``, ``relaxed_floor`` (always ``None``: the reference's lower
    floor for keyword hits is gone, the calibrated hybrid score keeps a strong one-sided hit;
    the key stays for the output shape), whether the hit was ``kept`` and why (the floor runs
    before temporal decay and reranking, on the score quoted in the reason)."""

    min_score: float
    relaxed_floor: float | None
    kept: bool
    reason: str


class HitExplain(_Model):
    """How the builtin engine ranked one hit (``search --explain``).

    Attributes:
        mode: ``hybrid`` | ``fts-only`` | ``vector-only``.
        keyword / vector: the two retrieval sides (``None`` when the hit was not found there).
        fusion: the hybrid merge (``None`` outside hybrid mode).
        decay: temporal decay (``None`` when it is off).
        rerank: the reranker stage (``None`` when off or when it failed).
        mmr: MMR re-ranking (``None`` when off).
        floor: the score-floor decision.
        rank: the hit's final 1-based rank.
    """

    mode: str
    keyword: ExplainKeyword | None = None
    vector: ExplainVector | None = None
    fusion: ExplainFusion | None = None
    decay: ExplainDecay | None = None
    rerank: ExplainRerank | None = None
    mmr: ExplainReorder | None = None
    floor: ExplainFloor
    rank: int


class MemorySearchResult(_Model):
    """One search hit.

    Attributes:
        path: workspace-relative path of the file (see module docstring).
        start_line / end_line: 1-based inclusive line range of the chunk in that file
            (for session transcripts: JSONL line numbers); for a qmd hit, a chunk of a note
            qmd found, ranked for the question (``search`` mode), or qmd's snippet lines.
        score: relevance in ``[0, 1]``, higher is better.
        snippet: the text shown for the hit, at most ``maxSnippetChars`` (700) code points: the
            builtin engine's window of the chunk's whole lines that best matches the query
            (``fallback/search/snippets.py``); for qmd hits of ``search`` mode the same window
            of the ranked chunk (``qmdbridge/qmd/passages.py``), else qmd's own snippet.
        snippet_start_line / snippet_end_line: 1-based inclusive line range of the snippet in
            the file (inside ``start_line..end_line``); JSON ``snippetStartLine`` /
            ``snippetEndLine``, always present: when a backend gives none they equal the hit's
            range. Citations point at these lines.
        source: ``memory`` or ``sessions``.
        citation: ``path#La-Lb`` (or ``path#La`` when one line) of the snippet's lines; set by
            the manager.
        vector_score / text_score: hybrid components when the builtin engine merged them.
        explain: how the builtin engine ranked the hit, only when asked (``search --explain``);
            else ``None``.
    """

    path: str
    start_line: int = Field(ge=1)
    end_line: int = Field(ge=1)
    score: float
    snippet: str
    snippet_start_line: int = Field(default=0, ge=0)
    snippet_end_line: int = Field(default=0, ge=0)
    source: Source = "memory"
    citation: str | None = None
    vector_score: float | None = None
    text_score: float | None = None
    explain: HitExplain | None = None

    def to_json_dict(self) -> dict[str, Any]:
        """The hit as :func:`fallback.answer.hit_doc` builds it for every route."""
        return hit_doc(path=self.path, start_line=self.start_line, end_line=self.end_line,
                       score=self.score, snippet=self.snippet,
                       snippet_start_line=self.snippet_start_line,
                       snippet_end_line=self.snippet_end_line, source=self.source,
                       citation=self.citation, vector_score=self.vector_score,
                       text_score=self.text_score,
                       explain=None if self.explain is None else self.explain.to_json_dict())

    @model_validator(mode="after")
    def _snippet_lines_default_to_hit(self) -> MemorySearchResult:
        # Frozen model: fill the snippet range once, at construction, when a backend gave none.
        if not self.snippet_start_line or not self.snippet_end_line:
            object.__setattr__(self, "snippet_start_line", self.start_line)
            object.__setattr__(self, "snippet_end_line", self.end_line)
        return self


class MemoryReadResult(_Model):
    """The answer of ``memory_get``.

    Attributes:
        path: the workspace-relative path that was read.
        text: the selected lines as the file has them, line breaks included, less the last
            line's final ``\\n`` (plus a continuation notice when truncated); empty for a
            missing memory file.
        from_line: first line returned (1-based); JSON key ``from``.
        lines: number of file lines included.
        truncated: True when lines remain after the page or the page was cut to the char budget.
        next_from: the ``from`` to pass to continue, or ``None``.
        missing: True when the file does not exist (the text is then empty).
    """

    path: str
    text: str
    from_line: int = Field(default=1, alias="from")
    lines: int = 0
    truncated: bool = False
    next_from: int | None = None
    missing: bool = False


class FallbackInfo(_Model):
    """Why an answer came from another backend than the configured one."""

    from_backend: str = Field(alias="from")
    reason: str


class SourceCount(_Model):
    """Indexed files and chunks for one source."""

    source: Source
    files: int
    chunks: int


class ScopeDecision(_Model):
    """The outcome of the scope rules for one session key.

    Attributes:
        allowed: whether the search may run.
        reason: one line naming the rule (or default) that decided, with the derived values.
        chat_type: ``direct`` | ``group`` | ``channel`` | ``None`` (no key).
        channel: derived channel, or ``None``.
        session_key: the raw key (``None`` = owner call).
    """

    allowed: bool
    reason: str
    chat_type: str | None = None
    channel: str | None = None
    session_key: str | None = None


class SearchResponse(_Model):
    """What ``MemoryManager.search`` returns: the hits plus where they came from.

    Attributes:
        backend: the backend that produced the hits (``builtin`` | ``qmd`` | ``none``).
        fallback: set when the configured backend could not answer.
        provider / model: embedding provider and model (``none`` / ``None`` keyword-only;
            ``qmd`` for the qmd backend).
        mode: the ranking that produced the hits: ``hybrid`` | ``vector-only`` | ``fts-only``
            (builtin; ``fts-only`` also when the query could not be embedded) or ``search`` |
            ``vsearch`` | ``query`` (qmd).
        citations: the citations mode in effect (``auto`` | ``on`` | ``off``).
        results: the hits, best first.
        denied: set (with ``results == []``) when scope rules refused the search.
        warnings: non-fatal notes (e.g. the index was still syncing).
        corpus: the corpus searched (``memory`` | ``sessions`` | ``all`` | ``wiki``).
    """

    backend: str
    fallback: FallbackInfo | None = None
    provider: str | None = None
    model: str | None = None
    mode: str | None = None
    citations: str = "auto"
    results: list[MemorySearchResult] = Field(default_factory=list)
    denied: ScopeDecision | None = None
    warnings: list[str] = Field(default_factory=list)
    corpus: str = "all"

    def to_json_dict(self) -> dict[str, Any]:
        """The answer as :func:`fallback.answer.answer_doc` builds it for every route."""
        return answer_doc(
            backend=self.backend, results=[r.to_json_dict() for r in self.results],
            fallback=None if self.fallback is None else self.fallback.to_json_dict(),
            provider=self.provider, model=self.model, mode=self.mode, citations=self.citations,
            denied=None if self.denied is None else self.denied.to_json_dict(),
            warnings=self.warnings, corpus=self.corpus)


class BackgroundError(_Model):
    """One failure of a background task (watcher sync, update timer, boot sync ...).

    Attributes:
        task: which task failed (``builtin: watch sync``, ``qmd: interval update`` ...).
        message: the error and its cause, one line.
        at_ms: when it failed, epoch ms.
        failures: consecutive failures of that task, this one included.
        retry_in_ms: delay before the next attempt in ms, or ``None`` when it is not retried.
    """

    task: str
    message: str
    at_ms: int
    failures: int = 1
    retry_in_ms: int | None = None


class BackgroundStatus(_Model):
    """The manager's background task group.

    Attributes:
        running: tasks started and not finished (watchers and timers run until close).
        tasks: their names, sorted (``builtin: file watcher``, ``qmd: interval update`` ...).
        failing: tasks whose last attempt failed and that have not succeeded since.
        last_error: the most recent failure of any background task, or ``None``.
    """

    running: int = 0
    tasks: list[str] = Field(default_factory=list)
    failing: list[str] = Field(default_factory=list)
    last_error: BackgroundError | None = None


class MemoryStatus(_Model):
    """Health and counters of one backend (or of the manager, which merges both).

    Attributes:
        backend: ``builtin`` | ``qmd`` | ``none``.
        agent_id, workspace_dir, db_path: where it works.
        files / chunks: indexed counts over the enabled sources.
        dirty: True when files changed since the last sync (or the watcher is degraded).
        dirty_reason: why it is dirty, when known.
        provider / requested_provider / model: embedding provider in use and as configured.
        search_mode: the mode the settings ask for, ``hybrid`` | ``vector-only``
            (``query.hybrid.enabled`` false) | ``fts-only`` (no provider) | ``unavailable``
            (builtin: an explicitly configured provider cannot work, so search fails) or the
            qmd mode.
        provider_unavailable_reason: why no embedding provider is in use, if none is.
        sources / extra_paths / source_counts: what is indexed.
        roots: where memory is read from: ``[{kind, path, pattern, exists}]``, ``kind`` one of
            ``root`` (the root file), ``memory`` (``memory/``), ``extra`` (builtin engine).
        fts: ``{enabled, available, tokenizer, error, cjk, keyword}``; ``keyword`` is
            ``bm25`` (FTS5) or ``substring`` (a SQLite without FTS5: a substring scan).
        vector: ``{enabled, available, mode, reason, dims, extensionPath}``; mode is
            ``sqlite-vec`` | ``brute-force`` | ``disabled``; with a provider also ``pending``
            (chunks written without a vector, waiting for a later sync) and ``providerError``
            (the provider error that left them waiting, or ``None``).
        cache: ``{enabled, entries, maxEntries}``.
        skipped: files skipped or indexed with a caveat (binary, too large, invalid UTF-8 ...).
        issues: human-readable problems (missing memory dir, legacy memory.md split ...).
        last_sync_at_ms: epoch ms of the last completed sync, or ``None``.
        fallback: set when this status is of a fallback backend.
        healthy: False when the backend is known to be failing.
        last_error: the last failure, one line.
        custom: backend-specific extras (qmd: binary, version, collections, breaker ...).
        backends: the manager's view of each backend's status (only on the manager's status).
        background: the manager's background tasks and their last failure (only on the
            manager's status; ``None`` from a backend).
        config_warnings: what the config loader noticed (keys set in two layouts, clamped
            numbers), each naming its key path (only on the manager's status).
    """

    backend: str
    agent_id: str = "main"
    workspace_dir: str = ""
    db_path: str | None = None
    files: int = 0
    chunks: int = 0
    dirty: bool = False
    dirty_reason: str | None = None
    provider: str = "none"
    requested_provider: str | None = None
    model: str | None = None
    search_mode: str | None = None
    provider_unavailable_reason: str | None = None
    sources: list[Source] = Field(default_factory=lambda: list(("memory",)))  # type: ignore[arg-type]
    extra_paths: list[str] = Field(default_factory=list)
    roots: list[dict[str, Any]] = Field(default_factory=list)
    source_counts: list[SourceCount] = Field(default_factory=list)
    fts: dict[str, Any] = Field(default_factory=dict)
    vector: dict[str, Any] = Field(default_factory=dict)
    cache: dict[str, Any] = Field(default_factory=dict)
    skipped: list[SkippedFile] = Field(default_factory=list)
    issues: list[str] = Field(default_factory=list)
    last_sync_at_ms: int | None = None
    fallback: FallbackInfo | None = None
    healthy: bool = True
    last_error: str | None = None
    custom: dict[str, Any] = Field(default_factory=dict)
    backends: dict[str, Any] = Field(default_factory=dict)
    background: BackgroundStatus | None = None
    config_warnings: list[str] = Field(default_factory=list)
