"""Config shapes across OpenClaw releases, and notes about values the settings changed.

:func:`read_layout` reads both layouts (docs/configuration.md, "Two layouts"), the 2026.9 one
winning where both set a key; :func:`adjusted_values` reports each number the settings models
clamped; :func:`unknown_keys` reports each key no settings model reads; :func:`merge_search`
lays an agent's settings over the defaults.
"""

from __future__ import annotations

import copy
import difflib
import math
import typing
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from fallback.errors import ConfigError
from fallback.settings import ProviderName

__all__ = ["AgentSource", "Layout", "adjusted_values", "as_object", "merge_search", "read_layout",
           "unknown_keys"]

# Keys normalised together (a sum of 1), reported only when a value is outside [0, 1].
_NORMALISED_PAIRS = {"vectorWeight", "textWeight"}


@dataclass
class AgentSource:
    """One agent as written, in either layout: the id as written, the entry without its
    search settings (``raw``), its search overrides (both layouts merged) and each as written
    (``search_sources``, ``[(key path, dict)]``), and where the entry is (``key_path``)."""

    agent_id: str
    raw: dict[str, Any]
    search: dict[str, Any]
    search_sources: list[tuple[str, dict[str, Any]]]
    key_path: str


@dataclass
class Layout:
    """A config's settings in one shape: the search defaults (both layouts merged) and each
    as written, the agents (``agents.list`` then ``agents.entries``; an id in both is one
    agent) and one warning per key set in both layouts."""

    search: dict[str, Any] = field(default_factory=dict)
    search_sources: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    agents: list[AgentSource] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def as_object(value: Any, *, key: str, file: str | None) -> dict[str, Any]:
    """A config value that must be an object: ``{}`` for a missing one (``None``).

    Raises ``ConfigError``: the value is not an object (names ``file`` and the dotted ``key``).
    """
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"invalid value {value!r}", file=file, key=key, expected="an object")
    return value


def _overlap(a: dict[str, Any], b: dict[str, Any], prefix: str = "") -> list[str]:
    """Dotted keys set (as leaves) in both ``a`` and ``b``."""
    out = []
    for key in a.keys() & b.keys():
        if isinstance(a[key], dict) and isinstance(b[key], dict):
            out += _overlap(a[key], b[key], f"{prefix}{key}.")
        else:
            out.append(f"{prefix}{key}")
    return sorted(out)


def _overlay(base: dict[str, Any], over: dict[str, Any], *, concatenated: tuple[str, ...] = ()) -> dict[str, Any]:
    """``base`` overlaid with ``over`` key by key into nested objects (``over`` wins); a list
    under a key in ``concatenated`` is appended to ``base``'s instead. Neither is modified."""
    merged = copy.deepcopy(base)
    for key, value in over.items():
        if key in concatenated and isinstance(value, list):
            earlier = merged.get(key)
            merged[key] = [*(earlier if isinstance(earlier, list) else []), *copy.deepcopy(value)]
        elif isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _overlay(merged[key], value, concatenated=concatenated)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def _both_set(new_key: str, old_key: str, both: list[str]) -> str:
    """The warning for keys (``both``) set in both layouts, at ``new_key`` and ``old_key``."""
    return (f"{new_key} and {old_key} both set {', '.join(both)}; {new_key} wins "
            f"({old_key} is the layout before OpenClaw 2026.9)")


# OpenClaw's ``models.providers.<id>.api`` -> our provider speaking it (memorySearch.provider may name <id>).
_CUSTOM_PROVIDER_APIS = {"ollama": "ollama", "openai-completions": "openai-compatible",
                         "openai-responses": "openai-compatible"}


# OpenClaw's ``models.providers`` id of each remote provider of ours that reads one for its key.
_KEYED_PROVIDERS = {"openai": "openai", "google": "gemini", "voyage": "voyage", "mistral": "mistral"}


def _custom_provider(search: dict[str, Any], providers: dict[str, Any]) -> dict[str, Any]:
    """``search`` whose ``provider`` names a ``models.providers.<id>`` entry (not a provider
    name of ours) of an API we speak, as that provider, the entry's ``baseUrl`` and ``apiKey``
    filled into ``remote`` where ``search`` sets none; else ``search`` itself."""
    name, remote = search.get("provider"), search.get("remote", {})
    entry = providers.get(name) if isinstance(name, str) and name not in typing.get_args(ProviderName) else None
    if not isinstance(entry, dict) or not isinstance(remote, dict):
        return search
    ours = _CUSTOM_PROVIDER_APIS.get(str(entry.get("api")))
    if ours is None:
        return search
    filled = {k: entry[k] for k in ("baseUrl", "apiKey") if k not in remote and entry.get(k) is not None}
    return {**search, "provider": ours, "remote": {**remote, **filled}}


def _searches(legacy: tuple[str, Any], new: tuple[str, Any], *, file: str | None, warnings: list[str],
              providers: dict[str, Any]) -> tuple[dict[str, Any], list[tuple[str, dict[str, Any]]]]:
    """The search settings written in the layout before 2026.9 and in 2026.9's (each ``(key
    path, value)``) merged, 2026.9's winning (a warning per key both set), and each as written."""
    (old_key, old), (new_key, now) = [(k, _custom_provider(as_object(v, key=k, file=file), providers))
                                      for k, v in (legacy, new)]
    if both := _overlap(now, old):
        warnings.append(_both_set(new_key, old_key, both))
    return _overlay(old, now), [(k, v) for k, v in ((old_key, old), (new_key, now)) if v]


def _entry_search(entry: dict[str, Any], key_path: str, *, file: str | None, warnings: list[str],
                  providers: dict[str, Any]) -> tuple[dict[str, Any], list[tuple[str, dict[str, Any]]]]:
    memory = as_object(entry.get("memory"), key=f"{key_path}.memory", file=file)
    return _searches((f"{key_path}.memorySearch", entry.get("memorySearch")),
                     (f"{key_path}.memory.search", memory.get("search")), file=file, warnings=warnings,
                     providers=providers)


def read_layout(root: dict[str, Any], *, file: str | None = None) -> Layout:
    """Read the search settings and agents of a parsed config (``root``) in either layout;
    values are validated later, by the settings models.

    Raises ``ConfigError``: a section that must be an object or an array is not.
    """
    out = Layout()
    memory = as_object(root.get("memory"), key="memory", file=file)
    agents = as_object(root.get("agents"), key="agents", file=file)
    defaults = as_object(agents.get("defaults"), key="agents.defaults", file=file)
    models = root.get("models")  # OpenClaw's section: custom provider ids, remote providers' keys
    providers = models.get("providers") if isinstance(models, dict) else None
    providers = providers if isinstance(providers, dict) else {}
    out.search, out.search_sources = _searches(
        ("agents.defaults.memorySearch", defaults.get("memorySearch")),
        ("memory.search", memory.get("search")), file=file, warnings=out.warnings, providers=providers)
    entries = {ours: {k: v for k, v in entry.items() if k in ("baseUrl", "apiKey", "headers")}
               for theirs, ours in _KEYED_PROVIDERS.items() if isinstance(entry := providers.get(theirs), dict)}
    if entries:  # where OpenClaw's remote providers also find a key, base URL and headers
        out.search["modelProviders"] = entries

    listed = agents.get("list") or []
    if not isinstance(listed, list):
        raise ConfigError(f"invalid value {listed!r}", file=file, key="agents.list",
                          expected="an array")
    by_id: dict[str, AgentSource] = {}
    for i, raw in enumerate(listed):
        key_path = f"agents.list[{i}]"
        entry = as_object(raw, key=key_path, file=file)
        search, sources = _entry_search(entry, key_path, file=file, warnings=out.warnings,
                                        providers=providers)
        agent_id = entry.get("id")
        src = AgentSource(agent_id if isinstance(agent_id, str) else "", entry, search, sources,
                          key_path)
        out.agents.append(src)
        first = by_id.setdefault(src.agent_id.strip().lower(), src)
        if first is not src:  # resolve_agent takes the first entry of an id
            out.warnings.append(f"{key_path} repeats the id of {first.key_path} ({src.agent_id!r}); "
                                f"only {first.key_path} is used")
    entries = as_object(agents.get("entries"), key="agents.entries", file=file)
    for agent_id, raw in entries.items():
        key_path = f"agents.entries.{agent_id}"
        entry = as_object(raw, key=key_path, file=file)
        search, sources = _entry_search(entry, key_path, file=file, warnings=out.warnings,
                                        providers=providers)
        fields = {k: v for k, v in entry.items() if k not in ("memory", "memorySearch")}
        earlier = by_id.get(str(agent_id).strip().lower())
        if earlier is None:
            out.agents.append(AgentSource(str(agent_id), {**fields, "id": str(agent_id)}, search,
                                          sources, key_path))
            continue
        both = _overlap(fields, {k: v for k, v in earlier.raw.items() if k != "id"})
        both += [f"memory.search.{k}" for k in _overlap(search, earlier.search)]
        if both:
            out.warnings.append(_both_set(key_path, earlier.key_path, both))
        earlier.raw = {**earlier.raw, **fields}
        earlier.search = _overlay(earlier.search, search)
        earlier.search_sources += sources
    return out


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def adjusted_values(written: dict[str, Any], resolved: dict[str, Any], key_path: str,
                    used: dict[str, Any] | None = None) -> list[str]:
    """One warning per number in ``written`` (a settings object as written at ``key_path``) that
    the settings changed in ``resolved`` (it validated alone, dumped by alias), in key order:
    ``<key path>.<key>: <written> is out of range; using <used>`` (``used``, default
    ``resolved``: the value in effect; hybrid weights only when one lies outside [0, 1] or both
    are 0)."""
    used = resolved if used is None else used
    notes: list[str] = []
    for key, value in written.items():
        got = resolved.get(key) if isinstance(resolved, dict) else None
        now = used.get(key) if isinstance(used, dict) else None
        path = f"{key_path}.{key}"
        if isinstance(value, dict) and isinstance(got, dict):
            notes += adjusted_values(value, got, path, now if isinstance(now, dict) else got)
            continue
        w, r = _number(value), _number(got)
        if w is None or r is None or w == r:
            continue
        if key in _NORMALISED_PAIRS and math.isfinite(w) and 0.0 <= w <= 1.0 and any(
                _number(written.get(k)) not in (None, 0.0) for k in _NORMALISED_PAIRS):
            continue
        shown = _number(now)
        shown = r if shown is None else shown
        notes.append(f"{path}: {value!r} is out of range; using "
                     f"{int(shown) if shown.is_integer() else round(shown, 6)}")
    return notes


# Keys OpenClaw defines in the subtrees read here that no settings model has, by where they are
# written (``memorySearch`` for either layout's search settings): read without a warning and
# not acted on (docs/configuration.md, *accepted*).
_REFERENCE_ONLY = {
    "memory": {"isolation", "search"},  # memory.search: the 2026.9 layout, read by read_layout
    "memory.qmd": {"searchTool"},
    "memory.qmd.mcporter": {"serverName", "startDaemon"},
    "memory.qmd.update": {"startup", "startupDelayMs"},
    "memorySearch": {"multimodal"},  # Gemini image and audio indexing
    "memorySearch.local": {"contextSize"},
    "memorySearch.store": {"cache"},
}


def _models(annotation: Any) -> list[type[BaseModel]]:
    """The settings models a field's type holds: itself, or inside a list, union or optional."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models(arg)]


def unknown_keys(model: type[BaseModel], written: Any, key_path: str, where: str) -> list[str]:
    """One warning per key of ``written`` (an object as written at ``key_path``, read by
    ``model``) and of its nested objects that is neither a field of the model (its name or
    camelCase key) nor a key OpenClaw defines there (``where`` names the subtree in
    :data:`_REFERENCE_ONLY`), in key order: ``<key path>.<key>: unknown key, ignored (did you
    mean <ours>?)``, the suggestion when one of the model's keys is close. A value that is not
    an object is left to the model to refuse."""
    if not isinstance(written, dict):
        return []
    fields = {k: f for name, f in model.model_fields.items() for k in (name, f.alias or name)}
    accepted = _REFERENCE_ONLY.get(where, set())
    notes: list[str] = []
    for key, value in written.items():
        field_info = fields.get(key)
        if field_info is None:
            if key not in accepted:
                ours = [f.alias or name for name, f in model.model_fields.items()]
                close = difflib.get_close_matches(str(key), ours, n=1)
                notes.append(f"{key_path}.{key}: unknown key, ignored"
                             + (f" (did you mean {close[0]}?)" if close else ""))
            continue
        alias = field_info.alias or key
        for sub in _models(field_info.annotation):
            items = value if isinstance(value, list) else [value]
            for i, item in enumerate(items):
                at = f"{key_path}.{key}[{i}]" if isinstance(value, list) else f"{key_path}.{key}"
                notes += unknown_keys(sub, item, at, f"{where}.{alias}")
    return notes


def merge_search(defaults: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """The search settings of one agent: ``override`` (its own ``memorySearch`` or
    ``memory.search``) over ``defaults``, key by key into nested objects, with ``extraPaths``
    concatenated (the defaults' first); neither input is modified."""
    return _overlay(defaults, override, concatenated=("extraPaths",))
