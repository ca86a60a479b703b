"""Config loading: the ``memory.*`` and ``agents.*`` keys of an OpenClaw JSON5 config.

:func:`load_config` parses a file into :class:`OpenClawConfig` (either layout);
:func:`resolve_agent` gives one agent's :class:`ResolvedAgent`. Keys and defaults:
docs/configuration.md; an unknown key in ``memory`` or the search settings is a config
warning, elsewhere it is ignored; a bad file or value raises
:class:`ConfigError` naming the file, the dotted key and what was expected.
"""

from __future__ import annotations

import difflib
import logging
import math
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, field_validator
from pydantic.functional_validators import AfterValidator, model_validator

from fallback.errors import ConfigError, UsageError
from fallback.settings import (
    EngineSettings,
    MemorySearchSettings,
    QmdExtraCollection,
    SettingsModel,
    named_store_path,
)
from qmdbridge.config_compat import adjusted_values, as_object, merge_search, read_layout, unknown_keys
from qmdbridge.config_env import state_dir as env_state_dir
from qmdbridge.config_env import substitute_env

__all__ = [
    "AgentEntry",
    "CompactionSettings",
    "MemoryConfig",
    "MemoryFlushSettings",
    "OpenClawConfig",
    "QmdConfig",
    "QmdLimits",
    "QmdMcp",
    "QmdScope",
    "QmdSessions",
    "QmdUpdate",
    "ResolvedAgent",
    "ScopeRule",
    "config_warning_line",
    "default_config_path",
    "load_config",
    "parse_duration_ms",
    "resolve_agent",
    "state_dir",
]

log = logging.getLogger("qmdbridge.config")


_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$", re.IGNORECASE)
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_duration_ms(value: str | int | float) -> int:
    """``<number>[ms|s|m|h|d]`` (a bare number: minutes) in ms: ``"5m"`` -> 300000.

    Raises ``ValueError``: not a non-negative duration.
    """
    if isinstance(value, bool):
        raise ValueError("a duration like '5m', '30s' or '1h'")
    if isinstance(value, (int, float)):
        if not math.isfinite(value) or value < 0:
            raise ValueError("a non-negative duration")
        return int(value * 60_000)
    m = _DURATION_RE.match(value)
    if not m:
        raise ValueError("a duration like '5m', '30s' or '1h'")
    return int(float(m.group(1)) * _UNIT_MS[(m.group(2) or "m").lower()])


class QmdSessions(SettingsModel):
    """``memory.qmd.sessions``: export of session transcripts as a qmd collection."""

    enabled: bool = False
    export_dir: str | None = None
    # 0: keep every transcript (as None)
    retention_days: Annotated[int | None, AfterValidator(lambda v: v or None)] = Field(default=None, ge=0)


# A duration written as ``<number>[ms|s|m|h|d]`` (:func:`parse_duration_ms`), held in ms.
DurationMs = Annotated[int, BeforeValidator(parse_duration_ms)]


class QmdUpdate(SettingsModel):
    """``memory.qmd.update``: the update/embed cycle; ``interval_ms`` / ``embed_interval_ms``
    (keys ``interval`` / ``embedInterval``, durations) are 0 for no timer."""

    interval_ms: DurationMs = Field(default=300_000, alias="interval", validate_default=False)
    debounce_ms: int = Field(default=15_000, ge=0)
    on_boot: bool = True
    wait_for_boot_sync: bool = False
    embed_interval_ms: DurationMs = Field(default=3_600_000, alias="embedInterval",
                                          validate_default=False)
    command_timeout_ms: int = Field(default=30_000, gt=0)
    update_timeout_ms: int = Field(default=120_000, gt=0)
    embed_timeout_ms: int = Field(default=120_000, gt=0)


class QmdLimits(SettingsModel):
    """``memory.qmd.limits``: result count, snippet and injection budgets (chars), deadline."""

    max_results: int = Field(default=6, gt=0)
    max_snippet_chars: int = Field(default=700, gt=0)
    max_injected_chars: int = Field(default=4000, gt=0)
    timeout_ms: int = Field(default=4000, gt=0)


class _ScopeModel(SettingsModel):
    """A scope rule or its match: a key it does not read is a bad value, never ignored (a rule
    without its misspelt ``chatType`` or ``match`` would apply to every session)."""

    @model_validator(mode="before")
    @classmethod
    def _known_keys_only(cls, data: Any) -> Any:
        keys = [f.alias or name for name, f in cls.model_fields.items()]
        for key in data if isinstance(data, dict) else ():
            if key not in keys and key not in cls.model_fields:
                close = difflib.get_close_matches(str(key), keys, n=1)
                raise ValueError(f"only the keys {', '.join(keys)}, not {key!r}"
                                 + (f" (did you mean {close[0]}?)" if close else "")
                                 + ": the rule would apply to more sessions without it")
        return data


class ScopeMatch(_ScopeModel):
    """``scope.rules[].match``: every given field must match."""

    channel: str | None = None
    chat_type: Literal["direct", "group", "channel", "dm"] | None = None
    key_prefix: str | None = None
    raw_key_prefix: str | None = None


class ScopeRule(_ScopeModel):
    """One ordered scope rule."""

    action: Literal["allow", "deny"]
    match: ScopeMatch = Field(default_factory=ScopeMatch)


class QmdScope(SettingsModel):
    """``memory.qmd.scope``: which sessions may search memory (default: direct chats only)."""

    default: Literal["allow", "deny"] = "deny"
    rules: list[ScopeRule] = Field(
        default_factory=lambda: [ScopeRule(action="allow", match=ScopeMatch(chat_type="direct"))])


class QmdMcp(SettingsModel):
    """``memory.qmd.mcp`` (the warm ``qmd mcp`` child of long-lived mode, docs/qmd.md) and
    OpenClaw's ``memory.qmd.mcporter``: only ``enabled`` is read (:attr:`QmdConfig.warm_child`)."""

    enabled: bool | None = None


class QmdConfig(SettingsModel):
    """``memory.qmd``: the qmd sidecar."""

    command: str | list[str] = "qmd"
    search_mode: Literal["search", "vsearch", "query"] = "search"
    rerank: bool | None = None
    include_default_memory: bool = True
    paths: list[QmdExtraCollection] = Field(default_factory=list)
    sessions: QmdSessions = Field(default_factory=QmdSessions)
    update: QmdUpdate = Field(default_factory=QmdUpdate)
    limits: QmdLimits = Field(default_factory=QmdLimits)
    scope: QmdScope = Field(default_factory=QmdScope)
    mcp: QmdMcp = Field(default_factory=QmdMcp)
    mcporter: QmdMcp = Field(default_factory=QmdMcp)

    @property
    def warm_child(self) -> bool:
        """Whether long-lived mode keeps a warm ``qmd mcp`` child: ``mcp.enabled``, else
        ``mcporter.enabled``, else on."""
        return next((v for v in (self.mcp.enabled, self.mcporter.enabled) if v is not None), True)

    @field_validator("command")
    @classmethod
    def _command(cls, v: str | list[str]) -> str | list[str]:
        if isinstance(v, list) and not [w for w in v if w.strip()]:
            raise ValueError("a program path, or a list whose first item is the program")
        return v


class MemoryConfig(SettingsModel):
    """``memory``: backend choice, citations and the qmd sidecar."""

    backend: Literal["builtin", "qmd", "none"] = "builtin"
    # any other value reads as auto (parse_config warns)
    citations: Annotated[Literal["auto", "on", "off"],
                         BeforeValidator(lambda v: v if v in ("auto", "on", "off") else "auto")] = "auto"
    qmd: QmdConfig = Field(default_factory=QmdConfig)


DEFAULT_FLUSH_SYSTEM_PROMPT = (
    "Pre-compaction memory flush turn. The session is near auto-compaction; capture durable "
    "memories to disk now.")
DEFAULT_FLUSH_PROMPT = (
    "Pre-compaction memory flush. Store durable memories now (use memory/YYYY-MM-DD.md; create "
    "memory/ if needed). If nothing to store, reply with NO_REPLY.")


class MemoryFlushSettings(SettingsModel):
    """``agents.defaults.compaction.memoryFlush``: the pre-compaction flush turn."""

    enabled: bool = True
    soft_threshold_tokens: int = Field(default=4000, ge=0)
    prompt: str = DEFAULT_FLUSH_PROMPT
    system_prompt: str = DEFAULT_FLUSH_SYSTEM_PROMPT


class CompactionSettings(SettingsModel):
    """``agents.defaults.compaction``."""

    reserve_tokens_floor: int = Field(default=20_000, ge=0)
    memory_flush: MemoryFlushSettings = Field(default_factory=MemoryFlushSettings)


class AgentEntry(BaseModel):
    """One agent (``agents.list[]`` or ``agents.entries.<id>``) with its raw search
    overrides, where it is written (``key_path``) and its own config warnings."""

    model_config = ConfigDict(extra="ignore")

    id: str
    default: bool = False
    workspace: str | None = None
    memory_search: dict[str, Any] = Field(default_factory=dict, alias="memorySearch")
    key_path: str = ""
    warnings: list[str] = Field(default_factory=list)


class OpenClawConfig(BaseModel):
    """The parts of an OpenClaw config that qmdbridge reads: ``memory.*``, the raw search
    defaults (merged per agent) and where they are written (``defaults_key``), the defaults'
    workspace and compaction, the agents (``agents.list[]`` then ``agents.entries.<id>``), the
    ``source_file`` (or ``None``) and the config-wide warnings, each naming its key path."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    memory: MemoryConfig = Field(default_factory=MemoryConfig)
    defaults_memory_search: dict[str, Any] = Field(default_factory=dict)
    defaults_workspace: str | None = None
    compaction: CompactionSettings = Field(default_factory=CompactionSettings)
    agents: list[AgentEntry] = Field(default_factory=list)
    source_file: str | None = None
    defaults_key: str = "agents.defaults.memorySearch"
    warnings: list[str] = Field(default_factory=list)


class ResolvedAgent(BaseModel):
    """One agent's effective configuration: normalised id, absolute workspace and
    state dirs, ``memory.*``, merged search settings, compaction, the builtin engine's
    settings, the config file, ``named_paths`` (``(as named, resolved)`` for the workspace and
    the store) and the config warnings that concern it."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    agent_id: str
    workspace_dir: Path
    state_dir: Path
    memory: MemoryConfig
    memory_search: MemorySearchSettings
    compaction: CompactionSettings
    engine: EngineSettings
    source_file: str | None = None
    named_paths: tuple[tuple[Path, Path], ...] = ()
    config_warnings: list[str] = Field(default_factory=list)

    def config_warning_lines(self) -> list[str]:
        """Each of :attr:`config_warnings` as every route tells it (:func:`config_warning_line`)."""
        return [config_warning_line(w, self.source_file) for w in self.config_warnings]


def config_warning_line(warning: str, file: str | None) -> str:
    """How a config warning is told, on every route and in the log: ``config <file>: <warning>``
    (``config: <warning>`` without a file)."""
    return f"config{f' {file}' if file else ''}: {warning}"


def state_dir(env: dict[str, str] | None = None) -> Path:
    """Return ``$OPENCLAW_STATE_DIR`` (``~`` expanded) or ``~/.openclaw``."""
    return Path(env_state_dir(os.environ if env is None else env))


def default_config_path(env: dict[str, str] | None = None) -> Path:
    """``<stateDir>/openclaw.json`` (used when it exists and no ``--config`` is given)."""
    return state_dir(env) / "openclaw.json"


def _key_path(loc: tuple[Any, ...], prefix: str) -> str:
    return (prefix + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc)).lstrip(".")


# Parts of a pydantic error location that name a union member or validator, not a key.
_UNION_TAG_RE = re.compile(r"^(?:function-.*|str|int|float|bool|list\[.*\]|dict\[.*\])$")


def _validate(model: type[BaseModel], data: Any, *, prefix: str, file: str | None) -> Any:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and _UNION_TAG_RE.match(p)))
        if err.get("type") == "missing":  # pydantic's input is then the enclosing object
            raise ConfigError("missing", file=file, key=_key_path(loc, prefix),
                              expected=_expected(err)) from None
        raise ConfigError(f"invalid value {err.get('input')!r}", file=file,
                          key=_key_path(loc, prefix), expected=_expected(err)) from None


def _expected(err: Any) -> str:
    """What a key takes, from pydantic's error message: ``'builtin', 'qmd' or 'none'`` for
    ``Input should be 'builtin', 'qmd' or 'none'``; ``an object`` for a model."""
    msg = str(err.get("msg", "a valid value"))
    msg = msg.removeprefix("Value error, ").removeprefix("Input should be ")
    msg = _MODEL_EXPECTED_RE.sub("an object", msg)
    return msg[0].lower() + msg[1:] if msg else "a valid value"


# pydantic's wording for a model's input: the class name means nothing to the config's author.
_MODEL_EXPECTED_RE = re.compile(r"^a valid dictionary or instance of \w+$")


def _validate_search(written: list[tuple[str, dict[str, Any]]], merged: dict[str, Any], *,
                     key_path: str, file: str | None,
                     agent_ids: list[str]) -> tuple[MemorySearchSettings, list[str]]:
    """Validate each search object as written (so errors and clamps name their own key
    path), then the merge; returns the merged settings and one warning per unknown key, per
    clamped number, per ``store.shareWith`` a non-postgres store ignores, and per name in it
    that is not one of ``agent_ids`` (the config's agents)."""
    alone = [_validate(MemorySearchSettings, raw, prefix=path, file=file) for path, raw in written]
    settings = _validate(MemorySearchSettings, merged, prefix=key_path, file=file)
    used = settings.model_dump(by_alias=True)
    notes = [w for path, raw in written for w in unknown_keys(MemorySearchSettings, raw, path,
                                                              "memorySearch")]
    for (path, raw), own in zip(written, alone, strict=True):
        notes += adjusted_values(raw, own.model_dump(by_alias=True), path, used)
        if own.store.share_with and settings.store.driver != "postgres":
            notes.append(f"{path}.store.shareWith: ignored: only the postgres store "
                         f'(store.driver "postgres") shares an agent\'s memory; this store is '
                         f"{settings.store.driver}")
        elif unknown := [a for a in own.store.share_with if a not in agent_ids]:
            notes += [f"{path}.store.shareWith: {a!r} is not an agent of this config (its agents: "
                      f"{', '.join(agent_ids)}); the share is recorded under that name" for a in unknown]
    return settings, notes


def parse_config(data: Any, *, file: str | None = None,
                 loaded_notes: Sequence[str] = ()) -> OpenClawConfig:
    """Build an :class:`OpenClawConfig` from a parsed JSON5 document in either layout;
    warnings (``loaded_notes`` first: what loading the file noticed) are logged here, once.

    Raises ``ConfigError``: a value has the wrong type or is out of range (key path included).
    """
    root = as_object(data, key="<root>", file=file)
    memory_raw = as_object(root.get("memory"), key="memory", file=file)
    agents_raw = as_object(root.get("agents"), key="agents", file=file)
    defaults = as_object(agents_raw.get("defaults"), key="agents.defaults", file=file)
    layout = read_layout(root, file=file)
    memory = _validate(MemoryConfig, {k: v for k, v in memory_raw.items() if k != "search"},
                       prefix="memory", file=file)
    defaults_key = layout.search_sources[-1][0] if layout.search_sources else (
        "agents.defaults.memorySearch")
    listed = []
    for src in layout.agents:
        fields = {k: v for k, v in src.raw.items() if k not in ("memorySearch", "memory")}
        entry = _validate(AgentEntry, {**fields, "memorySearch": src.search},
                          prefix=src.key_path, file=file)
        listed.append((src, entry, normalize_agent_id(entry.id, file=file, key=src.key_path if (
            src.key_path.startswith("agents.entries.")) else f"{src.key_path}.id")))
    # the agents resolve_agent finds: those listed, else the default agent main
    agent_ids = list(dict.fromkeys(aid for _, _, aid in listed)) or ["main"]
    _, notes = _validate_search(layout.search_sources, layout.search, key_path=defaults_key,
                                file=file, agent_ids=agent_ids)
    warnings = [*loaded_notes, *layout.warnings, *notes]
    marked = [src.key_path for src, entry, _ in listed if entry.default]  # resolve_agent takes the first
    warnings += [f"{key}.default: {marked[0]} is already marked default; the first one marked is "
                 "the default agent" for key in marked[1:]]
    if memory_raw.get("citations") not in (None, memory.citations):  # read as auto, not silently
        warnings.append(f"memory.citations: {memory_raw['citations']!r} is not auto, on or off; using auto")
    warnings += unknown_keys(MemoryConfig, memory_raw, "memory", "memory")
    compaction = _validate(CompactionSettings,
                           as_object(defaults.get("compaction"), key="agents.defaults.compaction",
                                    file=file),
                           prefix="agents.defaults.compaction", file=file)
    ws = defaults.get("workspace")
    if ws is not None and not isinstance(ws, str):
        raise ConfigError(f"invalid value {ws!r}", file=file, key="agents.defaults.workspace",
                          expected="a path string")
    entries = []
    for src, entry, _ in listed:
        merged = merge_search(layout.search, entry.memory_search)
        key = src.search_sources[-1][0] if src.search_sources else f"{src.key_path}.memorySearch"
        _, own = _validate_search(src.search_sources, merged, key_path=key, file=file,
                                  agent_ids=agent_ids)
        entries.append(entry.model_copy(update={"key_path": src.key_path, "warnings": own}))
    for warning in [*warnings, *(w for e in entries for w in e.warnings)]:
        log.warning("%s", config_warning_line(warning, file))
    return OpenClawConfig(memory=memory, defaults_memory_search=layout.search,
                          defaults_workspace=ws, compaction=compaction, agents=entries,
                          source_file=file, defaults_key=defaults_key, warnings=warnings)


def load_config(path: str | Path | None = None, *,
                env: dict[str, str] | None = None) -> OpenClawConfig:
    """Load a JSON5 config file (``None``: ``<stateDir>/openclaw.json`` when it exists,
    else the defaults; ``env``, default ``os.environ``, finds the state dir and the values of
    the ``${NAME}`` references in its strings: :mod:`qmdbridge.config_env`).

    Raises ``ConfigError``: a given file is missing, unreadable, not JSON5 or holds a bad value.
    """
    import json5

    if path is None:
        candidate = default_config_path(env)
        if not candidate.is_file():
            return OpenClawConfig()
        path = candidate
    p = Path(path).expanduser()
    file = str(p)
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        raise ConfigError("config file not found", file=file) from None
    except OSError as exc:
        raise ConfigError(f"cannot read config file: {exc.strerror or exc}", file=file) from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"not valid UTF-8 at byte {exc.start}", file=file) from None
    if not text.strip():
        return OpenClawConfig(source_file=file)
    try:
        data = json5.loads(text)
    except ValueError as exc:
        if not _COMMENT_RE.sub("", text).strip():  # only comments: an empty config
            return OpenClawConfig(source_file=file)
        raise ConfigError(f"invalid JSON5: {_json5_message(str(exc))}", file=file) from None
    data, unset = substitute_env(data, os.environ if env is None else env)
    return parse_config(data, file=file, loaded_notes=unset)


# A `//` or `/* */` comment (a file of comments only is an empty config).
_COMMENT_RE = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
# json5's syntax error: '<string>:2 Unexpected " " at column 32' (the parsed text has no name).
_JSON5_ERROR_RE = re.compile(r"<string>:(\d+) (.*) at column (\d+)")


def _json5_message(message: str) -> str:
    """json5's syntax error as ``line N, column C: <what>`` (its first line otherwise)."""
    first = message.splitlines()[0] if message else message
    m = _JSON5_ERROR_RE.fullmatch(first)
    return f"line {m[1]}, column {m[3]}: {m[2]}" if m else first


_AGENT_ID_UNSAFE_RE = re.compile(r"[^a-z0-9_.-]+")


def normalize_agent_id(agent_id: str | None, *, file: str | None = None, key: str = "agent") -> str:
    """Lower-case and trim an agent id, other runs of characters -> ``-``, empty ->
    ``main`` (``"Ops Bot"`` -> ``ops-bot``); ``file``/``key`` say where it is written.

    Raises ``ConfigError``: a path separator, ``..`` or a leading ``.``.
    """
    raw = (agent_id or "").strip().lower()
    if "/" in raw or "\\" in raw or ".." in raw or raw.startswith("."):
        raise ConfigError(f"invalid agent id {agent_id!r}", file=file, key=key,
                          expected="a name without path separators or '..'")
    aid = _AGENT_ID_UNSAFE_RE.sub("-", raw).strip("-")[:64]
    return aid or "main"


def _model_path_from_config_folder(search: MemorySearchSettings,
                                   source_file: str | None) -> MemorySearchSettings:
    """A relative ``local.modelPath`` read against the config file's folder."""
    raw = (search.local.model_path or "").strip()
    if (not raw or source_file is None or raw.startswith(("~", "hf:", "http:", "https:"))
            or Path(raw).is_absolute()):
        return search
    local = search.local.model_copy(update={"model_path": str(Path(source_file).absolute().parent / raw)})
    return search.model_copy(update={"local": local})


def resolve_agent(cfg: OpenClawConfig, agent_id: str | None = None, *,
                  workspace: str | Path | None = None,
                  env: dict[str, str] | None = None) -> ResolvedAgent:
    """Resolve one agent of ``cfg``: workspace, state dir, merged search settings, store path.

    Args:
        agent_id: ``None`` picks the ``default`` entry, else ``agents.entries.main``, the first, else ``main``.
        workspace: overrides the workspace (``--workspace``); else the agent's own, else
            ``agents.defaults.workspace`` (``/<id>`` added for other agents than the default),
            else ``<stateDir>/workspace`` (``workspace-<id>``).
        env: gives ``OPENCLAW_STATE_DIR`` (default ``os.environ``).

    Raises:
        ConfigError: the merged per-agent settings are invalid.
        UsageError: ``workspace`` is given but blank.
    """
    if workspace is not None and not str(workspace).strip():
        raise UsageError("workspace must not be empty")
    sd = state_dir(env)
    default_entry = next((a for a in cfg.agents if a.default), None) or next(
        (a for a in cfg.agents if a.key_path.startswith("agents.entries.")
         and a.id.strip().lower() == "main"), None) or (cfg.agents[0] if cfg.agents else None)
    aid = normalize_agent_id(agent_id or (default_entry.id if default_entry else None))
    entry = next((a for a in cfg.agents if normalize_agent_id(a.id) == aid), None)
    is_default = default_entry is None or normalize_agent_id(default_entry.id) == aid
    if workspace is not None:
        ws = Path(workspace).expanduser()
    elif entry is not None and entry.workspace:
        ws = Path(entry.workspace).expanduser()
    elif cfg.defaults_workspace:
        base = Path(cfg.defaults_workspace).expanduser()
        ws = base if is_default else base / aid
    else:
        ws = sd / "workspace" if is_default else sd / f"workspace-{aid}"
    named, ws = ws.absolute(), ws.resolve()
    merged = merge_search(cfg.defaults_memory_search, entry.memory_search if entry else {})
    prefix = cfg.defaults_key if entry is None else (entry.key_path or "agents.list") + (
        ".memory.search" if entry.key_path.startswith("agents.entries.") else ".memorySearch")
    search = _validate(MemorySearchSettings, merged, prefix=prefix, file=cfg.source_file)
    search = _model_path_from_config_folder(search, cfg.source_file)
    engine = EngineSettings.for_workspace(ws, agent_id=aid, state_dir=sd, search=search)
    return ResolvedAgent(agent_id=aid, workspace_dir=ws, state_dir=sd, memory=cfg.memory,
                         memory_search=search, compaction=cfg.compaction, engine=engine,
                         source_file=cfg.source_file, named_paths=(
                             (named, ws), (named_store_path(search, aid, sd).absolute(), engine.db_path)),
                         config_warnings=[*cfg.warnings, *(entry.warnings if entry else [])])
