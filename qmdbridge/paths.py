"""Per-agent qmd home: the XDG folders, lock files and child environment of one agent's qmd.

Layout (the reference system's per-agent qmd home, kept so an existing deployment's folders are reused)::

    <stateDir>/agents/<agentId>/qmd/                 qmd_dir
      xdg-config/                                    XDG_CONFIG_HOME
        qmd/index.yml                                QMD_CONFIG_DIR = xdg-config/qmd
      xdg-cache/                                     XDG_CACHE_HOME
        qmd/index.sqlite                             the index qmd writes and the bridge reads
        qmd/models -> <user's qmd model cache>       symlink, so models are downloaded once
      sessions/                                      default session-export folder
    <stateDir>/agents/<agentId>/qmd-write.lock       per-agent write lock
    <stateDir>/qmd/embed.lock                        global embed lock (all agents)

Every qmd call also passes ``--index index``: with the XDG variables below that pins
``xdg-config/qmd/index.yml`` and ``xdg-cache/qmd/index.sqlite``, and it stops qmd's walk up from
the cwd for a project-local ``.qmd/index.yml`` (verified with qmd 2.8.3; see
``tests/qmdbridge/test_paths.py``).
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
    """The folders and files of one agent's qmd (all absolute).

    Attributes:
        qmd_dir: ``<stateDir>/agents/<agentId>/qmd``.
        xdg_config: ``qmd_dir/xdg-config`` (the child's ``XDG_CONFIG_HOME``).
        xdg_cache: ``qmd_dir/xdg-cache`` (the child's ``XDG_CACHE_HOME``).
        config_dir: ``xdg_config/qmd`` (the child's ``QMD_CONFIG_DIR``).
        index_yml: ``config_dir/index.yml`` (qmd's collections config for ``--index index``).
        index_db: ``xdg_cache/qmd/index.sqlite``.
        models_dir: ``xdg_cache/qmd/models`` (symlinked to the user's model cache).
        sessions_dir: ``qmd_dir/sessions`` (default session-export folder).
        write_lock: ``<stateDir>/agents/<agentId>/qmd-write.lock``.
        embed_lock: ``<stateDir>/qmd/embed.lock`` (shared by all agents).
        breaker / startup_breaker: ``qmd_dir/breaker.json`` (searches) and
            ``qmd_dir/startup-breaker.json`` (start-up): the circuit breakers' state files.
        reconciled: ``qmd_dir/reconciled.json``, the marker of the last collections reconcile.
        probe_cache: ``<stateDir>/qmd/probe-cache.json`` (where qmd was found; all agents).
    """

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
    """The qmd home of ``agent_id`` under ``state_dir`` (nothing is created).

    Args:
        state_dir: the OpenClaw state dir (``$OPENCLAW_STATE_DIR`` or ``~/.openclaw``); made
            absolute.
        agent_id: the agent id; one path segment.

    Raises:
        UsageError: ``agent_id`` is empty, ``.``/``..``, or contains a path separator or NUL.
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
    """Create the home's folders and link the user's model cache; return warnings, never raise.

    Creates ``config_dir``, ``xdg_cache/qmd``, ``sessions_dir`` and the lock files' folders.
    Then, when the user's model cache (:func:`user_models_dir`) is a directory and
    ``home.models_dir`` does not exist at all (not even as a broken symlink), creates the
    symlink ``models_dir -> <user cache>``. An existing ``models_dir`` is never replaced; a
    missing user cache is silent.

    Returns:
        Warnings, e.g. ``failed to symlink qmd models directory: [Errno 13] ...``; ``[]`` when
        all went well.
    """
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
    """The environment of every qmd process of this agent.

    ``parent_env`` plus ``XDG_CONFIG_HOME=xdg_config``, ``QMD_CONFIG_DIR=config_dir``,
    ``XDG_CACHE_HOME=xdg_cache``, ``NO_COLOR=1`` and ``PATH=path_env`` (use
    ``QmdLocation.child_path``), without ``INDEX_PATH`` (it would redirect the index). Other
    variables, ``CI`` included, pass through unchanged.
    """
    env = {k: v for k, v in parent_env.items() if k not in _DROPPED_ENV}
    env.update({
        "XDG_CONFIG_HOME": str(home.xdg_config),
        "QMD_CONFIG_DIR": str(home.config_dir),
        "XDG_CACHE_HOME": str(home.xdg_cache),
        "NO_COLOR": "1",
        "PATH": path_env,
    })
    return env

