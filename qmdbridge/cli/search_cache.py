"""Recording the settings a one-shot ``qmdbridge search`` reads on its fast path.

:mod:`qmdbridge.cli.fast_search` answers a one-shot search without the config models, anyio or
the engine when it finds this agent's keyword-only search settings recorded under the
command's key and the index in sync. This module writes them, after an in-process search
succeeded, from the loaded config and the resolved agent (it runs in that full process, so it
may import anything; the fast path never imports it). The file, ``<stateDir>/cli-cache/<crc>.json``
(folder 0700, file 0600, both this user's: the fast path trusts nothing else):

- ``key``: :func:`~qmdbridge.cli.fast_search.settings_key`, taken before the config was read;
- ``backend``: ``builtin`` (the fields below) or ``qmd``: then ``qmd`` holds what
  ``qmdbridge/cli/qmd_prefetch.py`` needs to start the next search's qmd calls ahead
  (:func:`qmd_prefetch_settings`), and the search itself always runs in-process;
- ``cwd``: the working directory when the config names a relative workspace or store path
  (resolved against it), else ``null``;
- ``settings``: :class:`~fallback.engine.in_sync.InSyncSettings` as JSON (workspace, store,
  extra paths, discovery's size cap, the index identity, ``sync.onSearch``, the query knobs);
- ``paths``: ``[as named, resolved]`` for the workspace and the store
  (:attr:`~qmdbridge.config.ResolvedAgent.named_paths`): used only while each named path
  still resolves to the recorded one (a symlink on the way may be retargeted);
- ``citations``: ``memory.citations``; ``keywordNotice``: whether a plain answer says it is
  keyword-only (the provider is ``auto``, not ``none``);
- ``providerEnvKeys``: the API-key variables that would give ``auto`` a provider.

A builtin search is recorded only when it needs no engine: no embedding provider that
anything but those variables could bring (``provider: "none"``, or ``"auto"`` without
``local.modelPath`` and ``remote.apiKey``), the ``memory`` source only, no reranker; a qmd
search only as :func:`qmd_prefetch_settings` says; either only with a config file that did not
change within a tick of the key (racily clean, ``fallback/index/racy.py``). For any other, a
recorded file of the key is removed. At most :data:`MAX_FILES` files are kept.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fallback.fs.atomic import TEMP_PREFIX, TEMP_SUFFIX, write_atomic
from fallback.index.racy import racily_clean
from qmdbridge.cli.fast_search import FORMAT, cache_disabled, code_stamped, settings_path
from qmdbridge.cli.qmd_prefetch import breaker_healthy
from qmdbridge.cli.render import keyword_notice
from qmdbridge.config import OpenClawConfig, ResolvedAgent, normalize_agent_id

if TYPE_CHECKING:  # (a qmd-mode search records neither: not loaded for it)
    from fallback.engine.in_sync import InSyncSettings

__all__ = ["MAX_FILES", "in_sync_settings", "provider_env_keys", "qmd_prefetch_settings",
           "record_search_settings"]

log = logging.getLogger("qmdbridge.cli")

# Files kept in the cache folder (one per agent, workspace, config and flags); the oldest go.
MAX_FILES = 64
# A temporary file older than this (seconds) was left by a writer killed mid-write (a write
# takes microseconds); the next recording removes it, so the folder stays bounded.
STALE_TEMP_S = 60


def _depends_on_cwd(args: argparse.Namespace, cfg: OpenClawConfig, agent: ResolvedAgent) -> bool:
    """Whether resolving the agent read a relative path against the cwd: the configured
    workspace (when ``--workspace`` is not given) or ``store.path``."""
    raw: list[str | None] = [agent.memory_search.store.path]
    if args.workspace is None:
        entry = next((a for a in cfg.agents if normalize_agent_id(a.id) == agent.agent_id), None)
        raw += [entry.workspace if entry is not None else None, cfg.defaults_workspace]
    return any(p and not os.path.isabs(os.path.expanduser(p)) for p in raw)


def provider_env_keys(agent: ResolvedAgent, env: Mapping[str, str]) -> list[str] | None:
    """The variables whose being set would give ``agent`` an embedding provider, when it has
    none now and nothing else could give it one.

    Returns:
        ``[]`` for ``provider: "none"``; :data:`~fallback.embeddings.AUTO_ENV_KEYS` for
        ``"auto"`` without ``local.modelPath`` and ``remote.apiKey`` that selects no provider
        in ``env``; ``None`` otherwise (a provider is in use, or a file on disk or the config
        could bring one).
    """
    from fallback.embeddings import AUTO_ENV_KEYS, select_provider  # not for provider "none"

    ms = agent.memory_search
    if ms.provider == "none":
        return []
    if ms.provider != "auto" or (ms.local.model_path or "").strip() or (ms.remote.api_key or "").strip():
        return None
    if select_provider(ms, env=env).provider is not None:
        return None
    return list(AUTO_ENV_KEYS)


def in_sync_settings(agent: ResolvedAgent) -> InSyncSettings:
    """The agent's keyword-only search settings as plain values (the builtin engine's store,
    discovery inputs and query knobs, and the identity of an index built without a provider)."""
    from fallback.engine.in_sync import InSyncSettings
    from fallback.index.identity import index_identity

    ms = agent.memory_search
    decay = ms.query.hybrid.temporal_decay
    return InSyncSettings(
        db_path=agent.engine.db_path, workspace_dir=agent.workspace_dir,
        extra_paths=list(ms.extra_paths), max_file_bytes=ms.max_file_bytes,
        identity=index_identity(agent.engine, None), sync_on_search=ms.sync.on_search,
        max_results=ms.query.max_results, min_score=ms.query.min_score,
        candidate_multiplier=ms.query.hybrid.candidate_multiplier,
        half_life_days=decay.half_life_days if decay.enabled else None)


def qmd_prefetch_settings(agent: ResolvedAgent, env: Mapping[str, str]) -> dict[str, Any] | None:
    """What ``qmdbridge/cli/qmd_prefetch.py`` needs to start this agent's next one-shot search's
    qmd calls ahead, as plain values; ``None`` when it should not.

    Recorded only on a POSIX system, in ``search`` mode, without a boot update the search
    waits for (``update.onBoot`` with ``waitForBootSync``: its calls would come after an
    update), with qmd's location in the probe cache (as the sidecar finds it) and neither
    breaker holding a failure (a search that fell back records nothing).

    Returns:
        ``{command, childPath, probeCommand, stateDir, agentId, workspace, collections,
        maxResults, marker, indexYml}``: qmd's path and its ``PATH``, ``memory.qmd.command``
        (the probe cache's key with ``PATH``), the qmd home, the workspace (qmd's cwd), the
        managed collections' names, ``limits.maxResults``, the reconcile marker's text and
        ``index.yml``'s ``(mtime_ns, size, inode)``.
    """
    from qmdbridge.paths import qmd_home
    from qmdbridge.qmd.collections import build_collections
    from qmdbridge.qmd.probe_cache import ProbeCache
    from qmdbridge.qmd.startup import yml_stamp

    cfg = agent.memory.qmd
    if os.name != "posix" or cfg.search_mode != "search" or (
            cfg.update.on_boot and cfg.update.wait_for_boot_sync):
        return None
    home = qmd_home(agent.state_dir, agent.agent_id)
    cached = ProbeCache(home.probe_cache).get(ProbeCache.key(cfg.command, env.get("PATH", "")))
    if cached is None or not all(map(breaker_healthy, (home.breaker, home.startup_breaker))):
        return None
    try:
        marker = home.reconciled.read_text()
    except OSError:
        return None
    location = cached[0]
    return {"command": str(location.path), "childPath": location.child_path,
            "probeCommand": cfg.command if isinstance(cfg.command, str) else list(cfg.command),
            "stateDir": str(agent.state_dir), "agentId": agent.agent_id,
            "workspace": str(agent.workspace_dir),
            "collections": [c.name for c in build_collections(agent, sessions_dir=home.sessions_dir)],
            "maxResults": cfg.limits.max_results, "marker": marker,
            "indexYml": yml_stamp(home.index_yml)}


def _config_settled(key: dict[str, Any], key_taken_ms: int | None) -> bool:
    """Whether the config file of ``key`` last changed clearly before the key was taken: not
    racily clean (``fallback/index/racy.py``), since a save of the same size in the tick of the
    one the key saw would keep its size, mtime and ctime, and so the key. No config file, or
    no time given: True."""
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
    """Record (or remove) the settings of this search's key; see the module docstring.

    A cache: a folder that cannot be written is skipped (logged, shown with ``-v``).

    Args:
        args: the parsed ``search`` command line.
        cfg: the loaded config.
        agent: the agent the search ran for.
        key: :func:`~qmdbridge.cli.fast_search.settings_key`, taken before the config was read
            (a config written meanwhile has another key, so its settings are never recorded
            under the old one).
        env: the environment (default ``os.environ``).
        key_taken_ms: the wall clock (epoch ms) just before ``key`` was taken; a config file
            changed within a tick of it is not recorded (see :func:`_config_settled`).

    Returns:
        True when a file was written.
    """
    e = os.environ if env is None else env
    if cache_disabled(e) or key.get("format") != FORMAT or not code_stamped(key):
        return False
    target = Path(settings_path(key))
    ms = agent.memory_search
    backend = args.backend or agent.memory.backend
    keys = provider_env_keys(agent, e) if backend == "builtin" else None
    qmd = qmd_prefetch_settings(agent, e) if backend == "qmd" else None
    eligible = ((qmd is not None or (keys is not None and list(ms.sources) == ["memory"]
                                     and not ms.query.rerank.enabled
                                     and ms.store.driver == "sqlite"))
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
    """Create the cache folder 0700, or take back group and other bits from ours; False (and
    nothing is written) when it belongs to another user, whose files the fast path would not
    trust anyway (:func:`~qmdbridge.cli.fast_search.untrusted`).

    Raises:
        OSError: the folder cannot be created or changed.
    """
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)  # paths of the agent: ours only
    st = folder.stat()
    if hasattr(os, "geteuid") and st.st_uid != os.geteuid():
        log.info("search settings not recorded: %s belongs to uid %d", folder, st.st_uid)
        return False
    if st.st_mode & 0o077:
        os.chmod(folder, 0o700)
    return True


def _prune(folder: Path, *, keep: str) -> None:
    """Keep the newest :data:`MAX_FILES` files of the cache folder, ``keep`` (the file just
    written) always among them, however the clock stood when the others were written; remove
    the temporary files of writers killed mid-write (older than :data:`STALE_TEMP_S`)."""
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
        try:
            os.remove(folder / name)
        except FileNotFoundError:
            pass
