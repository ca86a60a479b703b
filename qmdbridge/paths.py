"""Per-agent qmd home: the XDG folders, lock files and child environment of one agent's qmd.

The reference system's layout, so an existing deployment's folders are reused::

    <stateDir>/agents/<agentId>/qmd/                 qmd_dir
      xdg-config/qmd/index.yml                       XDG_CONFIG_HOME, QMD_CONFIG_DIR
      xdg-cache/qmd/index.sqlite                     XDG_CACHE_HOME: the index
      xdg-cache/qmd/models -> <user's model cache>   downloaded once
      sessions/                                      default session-export folder
    <stateDir>/agents/<agentId>/qmd-write.lock       per-agent write lock
    <stateDir>/qmd/embed.lock                        global embed lock

Every qmd call also passes ``--index index``, which pins those two files and stops qmd's walk up
from the cwd for a project-local ``.qmd/index.yml``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from fallback.errors import UsageError

__all__ = ["QmdHome", "child_env", "ensure_home", "qmd_home", "user_models_dir"]

# Environment variables that would redirect qmd's index away from the agent's home.
_DROPPED_ENV = ("INDEX_PATH",)


@dataclass(frozen=True)
class QmdHome:
    """The folders and files of one agent's qmd, all absolute (see the module docstring),
    with the breakers' state files (``breaker.json``, ``startup-breaker.json``), the reconcile
    marker (``reconciled.json``) and the probe cache shared by all agents
    (``<stateDir>/qmd/probe-cache.json``)."""

    qmd_dir: Path
    xdg_config: Path
    xdg_cache: Path
    config_dir: Path
    index_yml: Path
    index_db: Path
    models_dir: Path
    sessions_dir: Path
    write_lock: Path
    embed_lock: Path
    breaker: Path
    startup_breaker: Path
    reconciled: Path
    probe_cache: Path


def qmd_home(state_dir: Path, agent_id: str) -> QmdHome:
    """The qmd home of ``agent_id`` (one path segment) under ``state_dir`` (nothing is created).

    Raises ``UsageError``: ``agent_id`` is empty, ``.``/``..``, or holds a path separator or NUL.
    """
    if (not agent_id or agent_id in (".", "..") or "/" in agent_id or "\\" in agent_id
            or "\x00" in agent_id):
        raise UsageError(f"invalid agent id for a qmd home: {agent_id!r}")
    root = Path(os.path.abspath(os.path.expanduser(state_dir)))
    agent_dir = root / "agents" / agent_id
    qmd_dir = agent_dir / "qmd"
    xdg_config = qmd_dir / "xdg-config"
    xdg_cache = qmd_dir / "xdg-cache"
    config_dir = xdg_config / "qmd"
    return QmdHome(
        qmd_dir=qmd_dir, xdg_config=xdg_config, xdg_cache=xdg_cache, config_dir=config_dir,
        index_yml=config_dir / "index.yml", index_db=xdg_cache / "qmd" / "index.sqlite",
        models_dir=xdg_cache / "qmd" / "models", sessions_dir=qmd_dir / "sessions",
        write_lock=agent_dir / "qmd-write.lock", embed_lock=root / "qmd" / "embed.lock",
        breaker=qmd_dir / "breaker.json", startup_breaker=qmd_dir / "startup-breaker.json",
        reconciled=qmd_dir / "reconciled.json", probe_cache=root / "qmd" / "probe-cache.json")


def user_models_dir(parent_env: Mapping[str, str]) -> Path | None:
    """The user's own qmd model cache: ``$XDG_CACHE_HOME/qmd/models``, else
    ``$HOME/.cache/qmd/models`` (from ``parent_env``); ``None`` when neither can be formed."""
    xdg = parent_env.get("XDG_CACHE_HOME", "").strip()
    if xdg:
        return Path(xdg).expanduser() / "qmd" / "models"
    home = parent_env.get("HOME", "").strip()
    if home:
        return Path(home).expanduser() / ".cache" / "qmd" / "models"
    return None


def ensure_home(home: QmdHome, *, parent_env: Mapping[str, str]) -> list[str]:
    """Create the home's folders and, when the user's model cache exists and ``models_dir``
    does not (not even as a broken link), link it; never raises. Returns the warnings
    (``failed to symlink qmd models directory: ...``)."""
    warnings: list[str] = []
    for folder in (home.config_dir, home.xdg_cache / "qmd", home.sessions_dir,
                   home.write_lock.parent, home.embed_lock.parent):
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            warnings.append(f"failed to create qmd folder {folder}: {exc}")
    source = user_models_dir(parent_env)
    if source is None or not source.is_dir() or os.path.lexists(home.models_dir):
        return warnings
    try:
        os.symlink(source, home.models_dir, target_is_directory=True)
    except OSError as exc:
        warnings.append(f"failed to symlink qmd models directory: {exc}")
    return warnings


def child_env(home: QmdHome, *, parent_env: Mapping[str, str], path_env: str) -> dict[str, str]:
    """The environment of every qmd process of this agent: ``parent_env`` with the XDG
    and ``QMD_CONFIG_DIR`` variables of ``home``, ``NO_COLOR=1`` and ``PATH=path_env``, without
    ``INDEX_PATH``."""
    return {**{k: v for k, v in parent_env.items() if k not in _DROPPED_ENV},
            "XDG_CONFIG_HOME": str(home.xdg_config), "QMD_CONFIG_DIR": str(home.config_dir),
            "XDG_CACHE_HOME": str(home.xdg_cache), "NO_COLOR": "1", "PATH": path_env}

