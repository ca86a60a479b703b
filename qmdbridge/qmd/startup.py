"""qmd start-up steps under their own budgets: the qmd home, collection reconcile (skipped
while nothing changed) and the ``qmd --help`` probe for repeatable ``-c`` flags.

Neither ever runs under a search deadline (``limits.timeoutMs``): ``QmdBackend.start`` calls
them with ``update.commandTimeoutMs`` per qmd command.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from pathlib import Path

from fallback.errors import BackendTimeoutError, BackendUnavailableError
from fallback.fs.atomic import write_atomic
from qmdbridge.paths import QmdHome, ensure_home
from qmdbridge.qmd.collections import (
    CollectionRun,
    ManagedCollection,
    ReconcileState,
    RunCollectionCommand,
    reconcile,
    reconcile_fingerprint,
)
from qmdbridge.qmd.runner import run_command

__all__ = ["HELP_PROBE_MAX_MS", "prepare_home", "probe_multi_c", "reconcile_if_changed"]

log = logging.getLogger("qmdbridge.qmd.backend")

# Ceiling of the `qmd --help` probe, ms (it is also at most update.commandTimeoutMs).
HELP_PROBE_MAX_MS = 5000
_MULTI_C_RE = re.compile(r"\b(?:one or more collections|collection\(s\)|multiple -c flags)\b", re.I)


def prepare_home(home: QmdHome, *, parent_env: Mapping[str, str], workspace: Path,
                 collections: list[ManagedCollection]) -> list[str]:
    """Create the qmd home (per-agent XDG folders), the workspace and the sessions collection's
    folder (blocking: call in a worker thread).

    Returns:
        Warnings about the home (``qmdbridge.paths.ensure_home``), for the log.

    Raises:
        BackendUnavailableError: a folder cannot be created.
    """
    try:
        warnings = list(ensure_home(home, parent_env=parent_env) or [])
        workspace.mkdir(parents=True, exist_ok=True)
        for c in collections:
            if c.kind == "sessions":
                c.path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BackendUnavailableError("qmd", f"cannot create the qmd home {home.qmd_dir}: {exc}") from exc
    return warnings


async def probe_multi_c(exe: str, *, env: Mapping[str, str], cwd: Path,
                        command_timeout_ms: int) -> bool:
    """Whether ``qmd --help`` promises several ``-c`` flags in one search.

    Args:
        exe: the qmd executable.
        env / cwd: the child's environment and folder.
        command_timeout_ms: ``update.commandTimeoutMs``; the probe gets at most
            :data:`HELP_PROBE_MAX_MS` of it.

    Raises:
        BackendUnavailableError: qmd could not be run (``BackendTimeoutError`` past the deadline).
    """
    res = await run_command([exe, "--help"], env=env, cwd=cwd,
                            timeout_ms=min(command_timeout_ms, HELP_PROBE_MAX_MS))
    return bool(_MULTI_C_RE.search(res.stdout + res.stderr))


async def reconcile_if_changed(collections: list[ManagedCollection], *, run: RunCollectionCommand,
                               agent_id: str, workspace: Path, state: ReconcileState, marker: Path,
                               qmd_version: str | None, index_yml: Path, force: bool = False) -> bool:
    """Make qmd's collections match the config (spec 2.6) unless nothing changed since the last
    complete reconcile; never raises for qmd errors.

    A reconcile in which no qmd command timed out and no collection was refused (see
    ``ReconcileState.refused``) records a fingerprint (collections, qmd
    version, ``index.yml`` size and mtime) in ``marker``; while it matches, later calls skip the
    ``collection list/show`` round trips (each costs one qmd start), unless ``force`` (the
    "Collection not found" repair forces it).

    Returns:
        Whether a reconcile ran.
    """
    if not force:
        try:
            if marker.read_text() == reconcile_fingerprint(collections, qmd_version, index_yml):
                return False
        except OSError:
            pass
    timeouts = 0

    async def counted(args: list[str], positionals: list[str]) -> CollectionRun:
        nonlocal timeouts
        try:
            return await run(args, positionals)
        except BackendTimeoutError:
            timeouts += 1
            raise

    await reconcile(collections, run=counted, agent_id=agent_id, workspace=workspace, state=state)
    if timeouts or state.refused:
        return True  # incomplete (or a collection refused): try again next start
    try:
        write_atomic(marker, reconcile_fingerprint(collections, qmd_version, index_yml).encode())
    except OSError as exc:
        log.debug("cannot record the reconcile fingerprint: %s", exc)
    return True
