"""Result and status models shared by both backends (one definition of a search hit).

Conventions, stated once:
- line numbers are 1-based and inclusive (``startLine <= endLine``);
- ``score`` is in ``[0, 1]``, higher is better;
- ``source`` is ``"memory"`` (Markdown memory files) or ``"sessions"`` (session transcripts);
- lengths (snippet caps, paging budgets) are counted in code points, and no snippet or page
  ever splits a code point;
- paths are workspace-relative with ``/`` separators (``../x`` outside the workspace,
  ``qmd/<collection>/<rel>`` for qmd collections outside it).

All models are frozen pydantic models; JSON uses the camelCase aliases and always emits every
key (``null`` rather than missing).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

from fallback.answer import answer_doc, hit_doc
from fallback.skipped import SkippedFile

__all__ = ["BackgroundError", "BackgroundStatus", "ExplainDecay", "ExplainFloor", "ExplainFusion",
           "ExplainKeyword", "ExplainRerank", "ExplainReorder", "ExplainVector", "FallbackInfo",
           "HitExplain", "MemoryReadResult", "MemorySearchResult", "MemoryStatus", "ScopeDecision",
           "SearchResponse", "SkippedFile", "SourceCount", "Source"]

Source = Literal["memory", "sessions"]


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, populate_by_name=True, alias_generator=to_camel,
                              extra="ignore")

    def to_json_dict(self) -> dict[str, Any]:
        """Return the JSON-ready dict: camelCase keys, every key present."""
        return self.model_dump(by_alias=True, mode="json")


class ExplainKeyword(_Model):
    """The keyword side of a hit: 1-based BM25 ``rank``, FTS5 ``bm25`` (lower is better;
    ``None`` for a substring match) and the fused ``text_score`` in ``[0, 1]``."""

    rank: int
    bm25: float | None
    text_score: float


class ExplainVector(_Model):
    """The vector side of a hit: 1-based ``rank`` by ``cosine`` similarity (of the chunk's best
    window) and the query terms ``contrast`` took out of the query vector."""

    rank: int
    cosine: float
    contrast: list[str] = Field(default_factory=list)


class ExplainFusion(_Model):
    """The hybrid merge (``fallback/search/fusion.py``): ``method`` (``scores`` or ``rrf``), the
    evidence on each side in ``[0, 1]`` (0 when the side did not return the hit), the weights
    and the fused ``score``."""

    method: str
    vector_evidence: float
    text_evidence: float
    vector_weight: float
    text_weight: float
    score: float


class ExplainDecay(_Model):
    """Temporal decay: ``factor = 0.5 ** (age_days / half_life_days)`` (1, ``age_days``
    ``None``, for an evergreen file); ``dated_by`` is ``name``, ``mtime`` or ``None``."""

    age_days: float | None
    half_life_days: float
    factor: float
    dated_by: str | None
    score: float


class ExplainRerank(_Model):
    """The reranker stage: the provider's raw ``relevance`` (``None`` when unscored) and the
    hit's 1-based rank before and after."""

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
    """The score floor: ``min_score``, whether the hit was ``kept`` and why; ``relaxed_floor``
    is always ``None`` (kept for the output shape)."""

    min_score: float
    relaxed_floor: float | None
    kept: bool
    reason: str


class HitExplain(_Model):
    """How the builtin engine ranked one hit (``search --explain``): the ``mode``, each stage
    (``None`` when it did not apply), the ``floor`` decision and the final 1-based ``rank``."""

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
    """One search hit: the file's ``path``, the chunk's lines ``start_line``..``end_line`` (JSONL
    lines for a session transcript), ``score``, the ``snippet`` (at most ``maxSnippetChars``
    code points) and its lines inside the hit's range (the hit's range when a backend gives
    none; citations point at them), ``source``, ``citation`` (``path#La-Lb``, ``path#La`` for one
    line; set by the manager), the hybrid components when merged and the ranking trace
    (``explain``) only when asked."""

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
        return hit_doc(**self.model_dump(exclude={"explain"}),
                       explain=None if self.explain is None else self.explain.to_json_dict())

    @model_validator(mode="after")
    def _snippet_lines_default_to_hit(self) -> MemorySearchResult:
        # Frozen model: fill the snippet range once, at construction, when a backend gave none.
        if not self.snippet_start_line or not self.snippet_end_line:
            object.__setattr__(self, "snippet_start_line", self.start_line)
            object.__setattr__(self, "snippet_end_line", self.end_line)
        return self


class MemoryReadResult(_Model):
    """The answer of ``memory_get``: the ``path`` read, its ``text`` (the selected lines as the
    file has them, plus a continuation notice when ``truncated``: lines remain or the page was
    cut to the char budget; empty when the file is ``missing``), the first line returned
    (``from_line``, JSON key ``from``), the number of ``lines`` included and the ``from`` to pass
    to continue (``next_from``, else ``None``)."""

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
    """The outcome of the scope rules for one session key (``None``: an owner call): whether
    the search is ``allowed``, the ``reason`` naming the rule, and the derived ``chat_type``
    (``direct`` | ``group`` | ``channel``) and ``channel``."""

    allowed: bool
    reason: str
    chat_type: str | None = None
    channel: str | None = None
    session_key: str | None = None


class SearchResponse(_Model):
    """What ``MemoryManager.search`` returns: the hits (``results``, best first) and where they
    came from: the ``backend`` (``builtin`` | ``qmd`` | ``none``), the ``fallback`` when the
    configured one could not answer, the embedding ``provider`` and ``model`` (``none`` /
    ``None``: keyword-only), the ``mode`` (``hybrid`` | ``vector-only`` | ``fts-only``, or qmd's
    ``search`` | ``vsearch`` | ``query``), the ``citations`` mode in effect, ``denied`` (with no
    results) when scope refused, non-fatal ``warnings`` and the ``corpus``."""

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
    """One failure of a background ``task`` (``builtin: watch sync`` ...): the one-line
    ``message``, when (``at_ms``, epoch ms), consecutive ``failures`` and ``retry_in_ms``
    (``None``: not retried)."""

    task: str
    message: str
    at_ms: int
    failures: int = 1
    retry_in_ms: int | None = None


class BackgroundStatus(_Model):
    """The manager's background task group: how many are ``running``, their ``tasks`` names
    (sorted), those ``failing`` since their last attempt, and the most recent ``last_error``."""

    running: int = 0
    tasks: list[str] = Field(default_factory=list)
    failing: list[str] = Field(default_factory=list)
    last_error: BackgroundError | None = None


class MemoryStatus(_Model):
    """Health and counters of one backend (or of the manager, which merges both).

    Beyond the plain fields: ``dirty`` means files changed since the last sync (or the watcher
    is degraded); ``search_mode`` is ``hybrid`` | ``vector-only`` | ``fts-only`` |
    ``unavailable`` (a configured provider cannot work) or the qmd mode; ``roots`` is
    ``[{kind, path, pattern, exists}]`` (``kind`` ``root`` | ``memory`` | ``extra``); ``fts`` is
    ``{enabled, available, tokenizer, error, cjk, keyword}`` (``keyword``: ``bm25``, or
    ``substring`` without FTS5); ``vector`` is ``{enabled, available, mode, reason, dims,
    extensionPath}`` (mode ``sqlite-vec`` | ``brute-force`` | ``disabled``), with a provider
    also the ``pending`` chunks and the ``providerError`` that left them waiting; ``cache`` is
    ``{enabled, entries, maxEntries}``; ``skipped`` lists files skipped or indexed with a
    caveat; ``healthy`` is False, with the one-line ``last_error``, while the backend fails;
    ``custom`` holds backend extras (qmd: binary, version, collections, breaker ...);
    ``backends``, ``background`` and ``config_warnings`` are the manager's only.
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
