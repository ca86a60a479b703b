"""Recording the settings a one-shot ``qmdbridge search`` reads on its fast path (``qmdbridge/cli/fast_search.py``).

Written after an in-process search succeeded to ``<stateDir>/cli-cache/<crc>.json`` (folder
0700, file 0600): ``key``, ``backend``, ``cwd``, ``paths``, and either ``qmd``
(:func:`qmd_prefetch_settings`) or ``settings``, ``citations``, ``keywordNotice`` and
``providerEnvKeys``. What is recorded when: docs/cli.md, "One-shot search without a daemon".
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fallback.fs.atomic import TEMP_PREFIX, TEMP_SUFFIX, write_atomic
from fallback.index.racy import racily_clean
from qmdbridge.cli.fast_search import CACHE_ENV, code_stamped, settings_path
from qmdbridge.cli.qmd_prefetch import breaker_healthy
from qmdbridge.cli.render import keyword_notice
from qmdbridge.config import OpenClawConfig, ResolvedAgent, normalize_agent_id
from qmdbridge.server.wire import turned_off

if TYPE_CHECKING:  # (a qmd-mode search records neither: not loaded for it)
    from fallback.engine.in_sync import InSyncSettings

__all__ = ["MAX_FILES", "in_sync_settings", "provider_env_keys", "qmd_prefetch_settings",
           "record_search_settings"]

log = logging.getLogger("qmdbridge.cli")

# Files kept in the cache folder (one per agent, workspace, config and flags); the oldest go.
MAX_FILES = 64
# A temporary file older than this (seconds) was left by a killed writer: the next recording removes it.
STALE_TEMP_S = 60


def _depends_on_cwd(args: argparse.Namespace, cfg: OpenClawConfig, agent: ResolvedAgent) -> bool:
    """Whether resolving the agent read a relative workspace or ``store.path`` against the cwd."""
    raw: list[str | None] = [agent.memory_search.store.path]
    if args.workspace is None:
        entry = next((a for a in cfg.agents if normalize_agent_id(a.id) == agent.agent_id), None)
        raw += [entry.workspace if entry is not None else None, cfg.defaults_workspace]
    return any(p and not os.path.isabs(os.path.expanduser(p)) for p in raw)


def provider_env_keys(agent: ResolvedAgent, env: Mapping[str, str]) -> list[str] | None:
    """The variables whose being set would give ``agent`` an embedding provider, when
    it has none now and nothing else could give it one.

    Returns:
        ``[]`` for ``provider: "none"``; :data:`~fallback.embeddings.AUTO_ENV_KEYS` for
        ``"auto"`` without ``local.modelPath`` and an API key setting (``remote.apiKey``, a
        ``models.providers`` entry's) and no provider in ``env``; ``None`` otherwise.
    """
    from fallback.embeddings import AUTO_ENV_KEYS, select_provider  # not for provider "none"

    ms = agent.memory_search
    if ms.provider == "none":
        return []
    keys = (ms.remote.api_key, *(e.api_key for e in ms.model_providers.values()))
    if ms.provider != "auto" or (ms.local.model_path or "").strip() or any(
            # a SecretRef (not a str) may name any variable: always the engine
            key.strip() if isinstance(key, str) else key is not None for key in keys):
        return None
    if select_provider(ms, env=env).provider is not None:
        return None
    return list(AUTO_ENV_KEYS)


def in_sync_settings(agent: ResolvedAgent) -> InSyncSettings:
    """The agent's keyword-only search settings as plain values."""
    from fallback.engine.in_sync import InSyncSettings
    from fallback.index.identity import index_identity

    ms = agent.memory_search
    return InSyncSettings(
        db_path=agent.engine.db_path, workspace_dir=agent.workspace_dir,
        extra_paths=list(ms.extra_paths), max_file_bytes=ms.max_file_bytes,
        identity=index_identity(agent.engine, None), sync_on_search=ms.sync.on_search,
        max_results=ms.query.max_results, min_score=ms.query.min_score,
        candidate_multiplier=ms.query.hybrid.candidate_multiplier,
        half_life_days=ms.query.hybrid.temporal_decay.effective_half_life_days)


def qmd_prefetch_settings(agent: ResolvedAgent, env: Mapping[str, str]) -> dict[str, Any] | None:
    """What ``qmdbridge/cli/qmd_prefetch.py`` needs to start this agent's next
    one-shot search's qmd calls ahead; ``None`` when it should not (not POSIX, a mode other
    than ``search``, a boot update the search waits for, qmd not in the probe cache, a
    breaker holding a failure, no reconcile marker).

    Returns:
        ``{command, childPath, probeCommand, stateDir, agentId, workspace, collections,
        maxResults, marker, indexYml}``.
    """
    from qmdbridge.paths import qmd_home
    from qmdbridge.qmd.collections import build_collections
    from qmdbridge.qmd.index_stats import file_stamp
    from qmdbridge.qmd.probe_cache import ProbeCache, probe_key

    cfg = agent.memory.qmd
    if os.name != "posix" or cfg.search_mode != "search" or (
            cfg.update.on_boot and cfg.update.wait_for_boot_sync):
        return None
    home = qmd_home(agent.state_dir, agent.agent_id)
    location = ProbeCache(home.probe_cache).get(probe_key(cfg.command, env.get("PATH", "")))
    if location is None or not all(map(breaker_healthy, (home.breaker, home.startup_breaker))):
        return None
    try:
        marker = home.reconciled.read_text()
    except OSError:
        return None
    return {"command": str(location.path), "childPath": location.child_path,
            "probeCommand": cfg.command if isinstance(cfg.command, str) else list(cfg.command),
            "stateDir": str(agent.state_dir), "agentId": agent.agent_id,
            "workspace": str(agent.workspace_dir),
            "collections": [c.name for c in build_collections(agent, sessions_dir=home.sessions_dir)],
            "maxResults": cfg.limits.max_results, "marker": marker,
            "indexYml": file_stamp(home.index_yml)}


def _config_settled(key: dict[str, Any], key_taken_ms: int | None) -> bool:
    """Whether the config file of ``key`` last changed clearly before the key was taken (not
    racily clean); True without a config file or a time."""
    path = key.get("config")
    if path is None or key.get("configStamp") is None or key_taken_ms is None:
        return True
    try:
        changed_ns = os.stat(path).st_ctime_ns
    except OSError:
        return False
    return not racily_clean(changed_ns, key_taken_ms)


def record_search_settings(args: argparse.Namespace, cfg: OpenClawConfig, agent: ResolvedAgent, *,
                           key: dict[str, Any], env: Mapping[str, str] | None = None,
                           key_taken_ms: int | None = None) -> bool:
    """Record (or remove) the settings of this search's ``key``
    (:func:`~qmdbridge.cli.fast_search.settings_key`, taken at ``key_taken_ms``, epoch ms, before
    the config was read); True when a file was written. A folder that cannot be written is
    skipped (logged)."""
    e = os.environ if env is None else env
    if turned_off(e, CACHE_ENV) or not code_stamped(key):
        return False
    target = Path(settings_path(key))
    ms = agent.memory_search
    backend = args.backend or agent.memory.backend
    keys = provider_env_keys(agent, e) if backend == "builtin" else None
    qmd = qmd_prefetch_settings(agent, e) if backend == "qmd" else None
    # config warnings are read fresh, and told, by the in-process search: none on the read-only route
    eligible = ((qmd is not None or (keys is not None and list(ms.sources) == ["memory"]
                                     and not ms.query.rerank.enabled
                                     and ms.store.driver == "sqlite" and not agent.config_warnings))
                and _config_settled(key, key_taken_ms))
    try:
        if not eligible:
            target.unlink(missing_ok=True)
            return False
        doc: dict[str, Any] = {
            "key": key, "backend": backend, "cwd": os.getcwd() if _depends_on_cwd(args, cfg, agent) else None,
            "paths": [[str(named), str(real)] for named, real in agent.named_paths]}
        if qmd is not None:
            doc["qmd"] = qmd
        else:
            doc.update(settings=in_sync_settings(agent).to_json(), citations=agent.memory.citations,
                       keywordNotice=keyword_notice(ms.provider), providerEnvKeys=keys)
        if not _private_folder(target.parent):
            return False
        write_atomic(target, json.dumps(doc, indent=1, sort_keys=True).encode(), durable=False,
                     mode=0o600)
        _prune(target.parent, keep=target.name)
    except OSError as exc:
        log.info("search settings not recorded: %s", exc)
        return False
    return True


def _private_folder(folder: Path) -> bool:
    """Create the cache folder 0700 (or take group and other bits back from ours); False when it
    belongs to another user, ``OSError`` when it cannot be created or changed."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)  # paths of the agent: ours only
    st = folder.stat()
    if hasattr(os, "geteuid") and st.st_uid != os.geteuid():
        log.info("search settings not recorded: %s belongs to uid %d", folder, st.st_uid)
        return False
    if st.st_mode & 0o077:
        os.chmod(folder, 0o700)
    return True


def _prune(folder: Path, *, keep: str) -> None:
    """Keep the newest :data:`MAX_FILES` files, ``keep`` among them; remove temporary files
    older than :data:`STALE_TEMP_S` (left by killed writers)."""
    entries = []
    now_ns = time.time_ns()
    for name in os.listdir(folder):
        try:
            mtime_ns = os.stat(folder / name).st_mtime_ns
            if name.startswith(TEMP_PREFIX) and name.endswith(TEMP_SUFFIX):
                if now_ns - mtime_ns > STALE_TEMP_S * 1_000_000_000:
                    os.remove(folder / name)
            elif name.endswith(".json") and name != keep:
                entries.append((mtime_ns, name))
        except OSError:
            continue
    for _, name in sorted(entries, reverse=True)[MAX_FILES - 1:]:
        with contextlib.suppress(FileNotFoundError):
            os.remove(folder / name)
