"""Settings of the builtin engine: ``agents.defaults.memorySearch`` as pydantic models.

Keys, defaults and clamping are the reference system's (OpenClaw's ``memorySearch``), so an
existing config loads as is: snake_case fields, camelCase aliases, unknown keys ignored; each
key's meaning is in docs/configuration.md. ``qmdbridge.config`` composes these models into the
full config.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator
from pydantic.alias_generators import to_camel
from pydantic.functional_validators import AfterValidator, BeforeValidator

from fallback.skipped import DEFAULT_MAX_FILE_BYTES

__all__ = ["CacheSettings", "ChunkingSettings", "EngineSettings", "ExtraPath", "HybridSettings",
           "LocalSettings", "MemorySearchSettings", "MmrSettings", "QuerySettings",
           "RemoteBatchSettings", "RerankSettings", "RemoteSettings", "SecretRef", "SettingsModel",
           "StoreSettings", "SyncSettings", "TemporalDecaySettings", "check_schema", "named_store_path",
           "read_api_key"]

ProviderName = Literal[
    "auto", "none", "openai", "openai-compatible", "gemini", "voyage", "mistral", "ollama", "local",
    "bedrock", "deepinfra", "github-copilot",  # OpenClaw's, with no provider here: a config loads
]


class SettingsModel(BaseModel):
    """Base of every config settings model: camelCase keys, unknown keys ignored, defaults
    validated, and a number setting refuses ``true``/``false`` (which pydantic reads as 1 and 0,
    and OpenClaw refuses); a whole number written as ``6.0`` stays accepted."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore",
                              validate_default=True)

    @field_validator("*", mode="before")
    @classmethod
    def _number_not_bool(cls, v: Any, info: ValidationInfo) -> Any:
        if isinstance(v, bool) and info.field_name is not None:
            ann = cls.model_fields[info.field_name].annotation
            kinds = get_args(ann) if get_origin(ann) in (Union, UnionType) else (ann,)
            if bool not in kinds and any(k in (int, float) for k in kinds):
                raise ValueError("a number, not true or false")
        return v


def _clamp(x: float, lo: float, hi: float) -> float:
    return max(lo, min(hi, x))


def _clamped(lo: float, hi: float = math.inf, *, nan_to: float | None = None,
             whole: bool = False) -> BeforeValidator:
    """A field's before-validator: a number clamped to ``lo..hi`` (floored to an int when
    ``whole``); a non-finite one becomes ``nan_to`` (``None``: left for the type to refuse)."""
    def check(v: Any) -> Any:
        if not isinstance(v, (int, float)):
            return v
        if not math.isfinite(v):
            return v if nan_to is None else nan_to
        return int(_clamp(math.floor(v), lo, hi)) if whole else _clamp(float(v), lo, hi)

    return BeforeValidator(check)


def _at_least(lo: int) -> AfterValidator:
    """A field's after-validator: a whole number below ``lo`` becomes ``lo``."""
    return AfterValidator(lambda v: max(lo, v))


def _within(lo: int, hi: int, unit: str) -> AfterValidator:
    """A field's after-validator refusing a number outside ``lo..hi`` (``None`` passes) with
    ``<unit> from <lo> to <hi>``."""
    def check(v: int | None) -> int | None:
        if v is not None and not lo <= v <= hi:
            raise ValueError(f"{unit} from {lo} to {hi}")
        return v

    return AfterValidator(check)


class RemoteBatchSettings(SettingsModel):
    """``remote.batch``: provider batch-job APIs (openai, gemini, voyage)."""

    enabled: bool = False
    wait: bool = True
    concurrency: Annotated[int, _at_least(1)] = 2
    poll_interval_ms: int = 2000
    timeout_minutes: float = 60


class SecretRef(SettingsModel):
    """OpenClaw's secret reference, ``{source, provider, id}``, written where a key goes:
    ``source: "env"`` names the environment variable (``id``) that holds it; the ``file`` and
    ``exec`` sources need OpenClaw's secret providers, which are not read here."""

    source: Literal["env", "file", "exec"]
    provider: str = "default"
    secret_id: str = Field(alias="id", min_length=1)

    def value(self, env: Mapping[str, str]) -> str | None:
        """The secret: the variable's value (stripped) for the ``env`` source, ``None`` when it
        is unset or blank or the source is not ``env``."""
        return (env.get(self.secret_id, "").strip() or None) if self.source == "env" else None

    def unread_reason(self, env: Mapping[str, str], *, key: str = "remote.apiKey") -> str | None:
        """Why :meth:`value` gave no secret (``<key> names $X, which is not set``; ``key``: where
        the reference is written), or ``None`` when it gave one."""
        if self.source != "env":
            return f"{key} is a {self.source!r} SecretRef; qmdbridge reads only 'env' ones"
        return None if self.value(env) else f"{key} names ${self.secret_id}, which is not set"


def _secret_ref(v: Any) -> Any:
    """An API key setting's before-validator: an object is a :class:`SecretRef`."""
    if not isinstance(v, dict):
        return v
    try:
        return SecretRef.model_validate(v)
    except ValueError:
        raise ValueError('a key, or a SecretRef such as {source: "env", provider: "default", '
                         'id: "OPENAI_API_KEY"} (source env, file or exec)') from None


# An API key setting (``remote.apiKey``, ``query.rerank.apiKey``): the key, or a SecretRef to it.
ApiKey = Annotated[str | SecretRef | None, BeforeValidator(_secret_ref)]


def read_api_key(key: str | SecretRef | None, env: Mapping[str, str]) -> str | None:
    """The key an :data:`ApiKey` setting gives: as written (stripped), or the value of the
    variable its SecretRef names; ``None`` when none."""
    return key.value(env) if isinstance(key, SecretRef) else ((key or "").strip() or None)


class RemoteSettings(SettingsModel):
    """``remote``: endpoint and credentials of a remote embedding provider; ``api_key`` is the
    key, or a :class:`SecretRef` to it."""

    base_url: str | None = None
    api_key: ApiKey = None
    headers: dict[str, str] = Field(default_factory=dict)
    batch: RemoteBatchSettings = Field(default_factory=RemoteBatchSettings)
    non_batch_concurrency: int | None = None


class LocalSettings(SettingsModel):
    """``local``: the in-process GGUF model (llama-cpp-python)."""

    model_path: str | None = None
    model_cache_dir: str | None = None


class VectorStoreSettings(SettingsModel):
    """``store.vector``: sqlite-vec acceleration."""

    enabled: bool = True
    extension_path: str | None = None


class FtsStoreSettings(SettingsModel):
    """``store.fts``: FTS5 tokenizer (``unicode61`` default, or ``trigram``)."""

    tokenizer: Literal["unicode61", "trigram"] = "unicode61"


# A postgres schema name is an unquoted SQL identifier (it is interpolated, quoted, into DDL).
_SCHEMA_RE = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


def check_schema(schema: str) -> str:
    """``schema`` if it can name the postgres store's schema (``store.schema``; checked where
    the config is read and by ``resolve_target``), else ``ValueError``."""
    if not _SCHEMA_RE.match(schema):
        raise ValueError("a lower-case SQL identifier (a-z, 0-9 and _, not starting with a digit,"
                         " at most 63 characters), e.g. qmdbridge")
    return schema


class StoreSettings(SettingsModel):
    """``store``: where the index lives: ``driver`` ``sqlite`` (one file per agent at ``path``)
    or ``postgres`` (``dsn``, a URI or libpq string, else libpq's ``PG*`` environment; tables in
    ``schema``; ``share_with``: agent ids that may read this agent's rows; deadlines in ms)."""

    driver: Literal["sqlite", "postgres"] = "sqlite"
    path: str | None = None
    dsn: str | None = Field(default=None, repr=False)
    schema_: Annotated[str, AfterValidator(check_schema)] = Field(default="qmdbridge", alias="schema")
    share_with: Annotated[list[str], AfterValidator(  # trimmed, lower-cased, once each
        lambda v: list(dict.fromkeys(a.strip().lower() for a in v if a.strip())))] = Field(
            default_factory=list)
    connect_timeout_ms: int = Field(default=5000, gt=0)
    statement_timeout_ms: int = Field(default=10000, gt=0)
    vector: VectorStoreSettings = Field(default_factory=VectorStoreSettings)
    fts: FtsStoreSettings = Field(default_factory=FtsStoreSettings)


class ChunkingSettings(SettingsModel):
    """``chunking``: chunk budget in tokens (4 chars per token) and overlap in tokens;
    ``sections`` (ours, default on) also starts a chunk at every Markdown heading."""

    tokens: int = 400
    overlap: int = 80
    sections: bool = True

    @model_validator(mode="after")
    def _clamp(self) -> ChunkingSettings:
        tokens = max(1, self.tokens)
        object.__setattr__(self, "tokens", tokens)
        object.__setattr__(self, "overlap", int(_clamp(self.overlap, 0, tokens - 1)))
        return self


class SessionDeltaSettings(SettingsModel):
    """``sync.sessions``: transcript growth that triggers a re-sync."""

    delta_bytes: Annotated[int, _at_least(0)] = 100_000
    delta_messages: Annotated[int, _at_least(0)] = 50


class SyncSettings(SettingsModel):
    """``sync``: when the index is refreshed."""

    on_session_start: bool = True
    on_search: bool = True
    watch: bool = True
    watch_debounce_ms: int = 1500
    interval_minutes: float = 0
    sessions: SessionDeltaSettings = Field(default_factory=SessionDeltaSettings)
    embedding_batch_timeout_seconds: float | None = None


class MmrSettings(SettingsModel):
    """``query.hybrid.mmr``: maximal marginal relevance re-ranking."""

    enabled: bool = False
    lambda_: Annotated[float, _clamped(0, 1, nan_to=0.7)] = Field(default=0.7, alias="lambda")


class TemporalDecaySettings(SettingsModel):
    """``query.hybrid.temporalDecay``: exponential decay of dated notes by half-life (days)."""

    enabled: bool = False
    half_life_days: Annotated[int, _clamped(1, nan_to=30, whole=True)] = 30

    @property
    def effective_half_life_days(self) -> int | None:
        """``half_life_days`` when decay is on, else ``None`` (no decay)."""
        return self.half_life_days if self.enabled else None


class HybridSettings(SettingsModel):
    """``query.hybrid``: the hybrid merge (``fallback/search/fusion.py``); the weights are
    normalised to sum 1."""

    enabled: bool = True
    vector_weight: float = 0.7
    text_weight: float = 0.3
    fusion: Literal["scores", "rrf"] = "scores"
    candidate_multiplier: Annotated[int, _clamped(1, 20, whole=True)] = 4
    mmr: MmrSettings = Field(default_factory=MmrSettings)
    temporal_decay: TemporalDecaySettings = Field(default_factory=TemporalDecaySettings)

    @model_validator(mode="after")
    def _normalise(self) -> HybridSettings:
        vw = _clamp(self.vector_weight, 0.0, 1.0) if math.isfinite(self.vector_weight) else 0.7
        tw = _clamp(self.text_weight, 0.0, 1.0) if math.isfinite(self.text_weight) else 0.3
        total = vw + tw
        if total <= 0:
            vw, tw, total = 0.7, 0.3, 1.0
        object.__setattr__(self, "vector_weight", vw / total)
        object.__setattr__(self, "text_weight", tw / total)
        return self


# Reranker defaults: candidates reranked, and the stage's deadline in ms per provider.
RERANK_DEFAULT_TOP_N = 20
RERANK_MAX_TOP_N = 200
RERANK_DEFAULT_TIMEOUT_MS = {"http": 5_000, "local": 30_000}
RERANK_MAX_TIMEOUT_MS = 600_000


class RerankSettings(SettingsModel):
    """``query.rerank``: the optional reranker (cross-encoder) stage, off unless ``provider``
    is set; ``model`` is required with one, ``base_url`` with ``http``."""

    provider: Literal["http", "local"] | None = None
    model: str = ""
    top_n: Annotated[int, _within(1, RERANK_MAX_TOP_N, "an integer")] = RERANK_DEFAULT_TOP_N
    base_url: str | None = None
    api_key: ApiKey = None
    timeout_ms: Annotated[int | None, _within(1, RERANK_MAX_TIMEOUT_MS, "milliseconds")] = None

    @property
    def enabled(self) -> bool:
        """True when a provider is set."""
        return self.provider is not None

    @property
    def effective_timeout_ms(self) -> int:
        """``timeout_ms``, else the provider's default, in ms."""
        if self.timeout_ms is not None:
            return self.timeout_ms
        return RERANK_DEFAULT_TIMEOUT_MS.get(self.provider or "http", 5_000)

    @model_validator(mode="before")
    @classmethod
    def _explicit_base_url(cls, data: Any) -> Any:
        # A missing baseUrl is validated as an explicit null, so its error names the JSON key.
        if isinstance(data, dict) and data.get("provider") == "http" and not (
                {"baseUrl", "base_url"} & data.keys()):
            return {**data, "baseUrl": None}
        return data

    @field_validator("model")
    @classmethod
    def _model(cls, v: str, info: ValidationInfo) -> str:
        provider = info.data.get("provider")
        model = v.strip()
        if provider is not None and not model:
            what = "the GGUF reranker file path" if provider == "local" else "the reranker model name"
            raise ValueError(f"{what} (required when provider is {provider!r})")
        return model

    @field_validator("base_url")
    @classmethod
    def _base_url(cls, v: str | None, info: ValidationInfo) -> str | None:
        url = (v or "").strip() or None
        if info.data.get("provider") != "http":
            return url
        if url is None or not url.lower().startswith(("http://", "https://")):
            raise ValueError('an http:// or https:// URL (required when provider is "http")')
        return url.rstrip("/")


# Deadline of a search's embedding work (query embedding, a pre-search sync's embeddings), ms.
QUERY_DEFAULT_TIMEOUT_MS = 10_000
QUERY_MIN_TIMEOUT_MS = 100
QUERY_MAX_TIMEOUT_MS = 600_000


class QuerySettings(SettingsModel):
    """``query``: result count, score floor, hybrid merge, the optional reranker, the deadline
    of a search's embedding work (``timeout_ms``) and whether a provider failing during a search
    falls back to keyword search (``keyword_fallback``)."""

    max_results: Annotated[int, _at_least(1)] = 6
    min_score: Annotated[float, _clamped(0, 1, nan_to=0.35)] = 0.35
    hybrid: HybridSettings = Field(default_factory=HybridSettings)
    rerank: RerankSettings = Field(default_factory=RerankSettings)
    timeout_ms: Annotated[int, _within(QUERY_MIN_TIMEOUT_MS, QUERY_MAX_TIMEOUT_MS, "milliseconds")] = (
        QUERY_DEFAULT_TIMEOUT_MS)
    keyword_fallback: bool = True


class CacheSettings(SettingsModel):
    """``cache``: the embedding cache (bounded, oldest entries pruned first)."""

    enabled: bool = True
    max_entries: Annotated[int, _clamped(1, whole=True)] = 50_000


class ExperimentalSettings(SettingsModel):
    """``experimental``: opt-in features."""

    session_memory: bool = False


class QmdExtraCollection(SettingsModel):
    """``memorySearch.qmd.extraCollections[]``."""

    path: str
    name: str | None = None
    pattern: str | None = None


class ExtraPath(SettingsModel):
    """One ``extraPaths[]`` entry in object form: a folder (or file) and the glob its files
    must match (``pattern``; ``**/*.md`` when unset, as the plain string form)."""

    model_config = ConfigDict(frozen=True)

    path: str
    pattern: str | None = None


class MemorySearchQmdSettings(SettingsModel):
    """``memorySearch.qmd``: per-agent qmd additions."""

    extra_collections: list[QmdExtraCollection] = Field(default_factory=list)


class MemorySearchSettings(SettingsModel):
    """``agents.defaults.memorySearch`` (and per-agent overrides), resolved and clamped; the
    defaults are the reference's (spec section 1) but ``max_file_bytes``, ours."""

    enabled: bool = True
    provider: ProviderName = "auto"
    model: str = ""
    fallback: str = "none"
    remote: RemoteSettings = Field(default_factory=RemoteSettings)
    local: LocalSettings = Field(default_factory=LocalSettings)
    sources: list[Literal["memory", "sessions"]] = Field(default_factory=lambda: list(("memory",)))  # type: ignore[arg-type]
    experimental: ExperimentalSettings = Field(default_factory=ExperimentalSettings)
    extra_paths: list[str | ExtraPath] = Field(default_factory=list)
    store: StoreSettings = Field(default_factory=StoreSettings)
    chunking: ChunkingSettings = Field(default_factory=ChunkingSettings)
    sync: SyncSettings = Field(default_factory=SyncSettings)
    query: QuerySettings = Field(default_factory=QuerySettings)
    cache: CacheSettings = Field(default_factory=CacheSettings)
    dimensions: int | None = None
    output_dimensionality: int | None = None
    input_type: str | None = None
    query_input_type: str | None = None
    document_input_type: str | None = None
    max_file_bytes: int = Field(default=DEFAULT_MAX_FILE_BYTES, gt=0)
    qmd: MemorySearchQmdSettings = Field(default_factory=MemorySearchQmdSettings)
    # OpenClaw's ``models.providers`` entries of the remote providers, by our provider name (set by
    # the config loader): an entry's key is read after the environment's, its base URL and
    # headers under ``remote``'s, as OpenClaw does.
    model_providers: dict[str, RemoteSettings] = Field(default_factory=dict)

    @field_validator("extra_paths", mode="after")
    @classmethod
    def _extra_paths(cls, v: list[str | ExtraPath]) -> list[str | ExtraPath]:
        out: list[str | ExtraPath] = []
        for item in v:
            s: str | ExtraPath = item.strip() if isinstance(item, str) else item
            if s and (isinstance(s, str) or s.path.strip()) and s not in out:
                out.append(s)
        return out

    @model_validator(mode="after")
    def _sources(self) -> MemorySearchSettings:
        wanted = [s for s in dict.fromkeys(self.sources)
                  if s == "memory" or (s == "sessions" and self.experimental.session_memory)]
        object.__setattr__(self, "sources", sorted(wanted) or ["memory"])
        return self


def named_store_path(search: MemorySearchSettings, agent_id: str, state_dir: Path) -> Path:
    """The store file as the settings name it, symlinks not resolved: ``store.path`` with
    ``{agentId}`` replaced and ``~`` expanded, else ``<state_dir>/memory/<agent_id>.sqlite``.
    :attr:`EngineSettings.db_path` is this path resolved."""
    if search.store.path:
        return Path(search.store.path.replace("{agentId}", agent_id)).expanduser()
    return state_dir / "memory" / f"{agent_id}.sqlite"


class EngineSettings(BaseModel):
    """Everything the builtin engine needs to run for one agent: the lower-case ``agent_id``,
    absolute ``workspace_dir``, ``state_dir``, ``db_path`` (:func:`named_store_path`,
    resolved) and ``sessions_dir``, and the resolved ``search`` settings."""

    model_config = ConfigDict(frozen=True)

    agent_id: str
    workspace_dir: Path
    state_dir: Path
    db_path: Path
    sessions_dir: Path
    search: MemorySearchSettings = Field(default_factory=MemorySearchSettings)

    @classmethod
    def for_workspace(cls, workspace_dir: str | Path, *, agent_id: str = "main",
                      state_dir: str | Path | None = None,
                      search: MemorySearchSettings | None = None) -> EngineSettings:
        """Settings for a workspace with defaults (tests and scripts); ``state_dir`` defaults
        to ``<workspace>/.openclaw-state``, so nothing outside the workspace is touched."""
        ws = Path(workspace_dir).expanduser().resolve()
        sd = Path(state_dir).expanduser().resolve() if state_dir else ws / ".openclaw-state"
        aid = agent_id.strip().lower() or "main"
        s = search or MemorySearchSettings()
        return cls(agent_id=aid, workspace_dir=ws, state_dir=sd,
                   db_path=named_store_path(s, aid, sd).resolve(),
                   sessions_dir=sd / "agents" / aid / "sessions", search=s)
