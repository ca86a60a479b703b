"""qmd start-up steps under their own budgets (``update.commandTimeoutMs`` per command, never a
search deadline): the qmd home, and the collection reconcile, skipped while nothing changed."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
from collections.abc import Mapping
from pathlib import Path

import orjson

from fallback.errors import BackendTimeoutError, BackendUnavailableError
from fallback.fs.atomic import write_atomic
from fallback.index.racy import wall_clock_ms
from qmdbridge.paths import QmdHome, ensure_home
from qmdbridge.qmd.collections import (
    ManagedCollection,
    ReconcileState,
    RunCollectionCommand,
    reconcile,
    render_index_yml,
)
from qmdbridge.qmd.index_stats import file_stamp
from qmdbridge.qmd.runner import RunResult

__all__ = ["prepare_home", "reconcile_if_changed"]

log = logging.getLogger("qmdbridge.qmd.backend")


def prepare_home(home: QmdHome, *, parent_env: Mapping[str, str], workspace: Path,
                 collections: list[ManagedCollection]) -> None:
    """Create the qmd home (per-agent XDG folders; what fails there is logged), the workspace and
    the sessions folder (blocking).

    Raises:
        BackendUnavailableError: the workspace or the sessions folder cannot be created.
    """
    for warning in ensure_home(home, parent_env=parent_env):
        log.warning("%s", warning)
    try:
        workspace.mkdir(parents=True, exist_ok=True)
        for c in collections:
            if c.kind == "sessions":
                c.path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BackendUnavailableError("qmd", f"cannot create the qmd home {home.qmd_dir}: {exc}") from exc


def reconcile_fingerprint(collections: list[ManagedCollection], qmd_version: str | None,
                          index_yml: Path) -> str:
    """sha256 hex of the managed collections (and whether each folder exists), qmd's version and
    ``index.yml``'s stamp: while unchanged, a reconcile would find nothing to do."""
    doc = {"collections": [[c.name, str(c.path), c.pattern, c.path.is_dir()] for c in collections],
           "version": qmd_version, "indexYml": file_stamp(index_yml)}
    return hashlib.sha256(orjson.dumps(doc)).hexdigest()


async def reconcile_if_changed(collections: list[ManagedCollection], *, run: RunCollectionCommand,
                               agent_id: str, workspace: Path, state: ReconcileState, marker: Path,
                               qmd_version: str | None, index_yml: Path, force: bool = False) -> None:
    """Make qmd's collections match the config (spec 2.6) unless ``marker`` holds the current
    :func:`reconcile_fingerprint` (``force`` reconciles anyway); never raises for qmd errors.

    An ``index.yml`` qmd cannot parse is kept as ``index.yml.broken-<ms>`` and written again. Only
    a reconcile without a timeout or a refused collection records the fingerprint. After a
    command timed out the rest are not run (each would wait its whole ``commandTimeoutMs``);
    ``state.timed_out`` keeps its reason.
    """
    state.timed_out = None
    if not force:
        with contextlib.suppress(OSError):
            if marker.read_text() == reconcile_fingerprint(collections, qmd_version, index_yml):
                return
    timed_out: BackendTimeoutError | None = None

    async def counted(args: list[str], positionals: list[str]) -> RunResult:
        nonlocal timed_out
        if timed_out is not None:  # qmd hangs: the next command would wait as long
            raise timed_out
        try:
            return await run(args, positionals)
        except BackendTimeoutError as exc:
            timed_out = exc
            state.timed_out = exc.reason
            raise

    await reconcile(collections, run=counted, agent_id=agent_id, workspace=workspace, state=state)
    if state.unreadable_yml is not None:  # a hand edit qmd cannot parse: the bridge owns the file
        broken = index_yml.with_name(f"{index_yml.name}.broken-{wall_clock_ms()}")
        log.warning("qmd cannot read its collection list (%s); keeping it as %s and writing the "
                    "managed collections again", state.unreadable_yml, broken)
        try:
            os.replace(index_yml, broken)
            write_atomic(index_yml, render_index_yml(collections).encode("utf-8"))
        except OSError as exc:
            log.warning("cannot write %s again: %s", index_yml, exc)
            return
        await reconcile(collections, run=counted, agent_id=agent_id, workspace=workspace, state=state)
    if timed_out is not None or state.refused or state.unreadable_yml is not None:
        return  # incomplete (or a collection refused): try again next start
    try:
        write_atomic(marker, reconcile_fingerprint(collections, qmd_version, index_yml).encode())
    except OSError as exc:
        log.debug("cannot record the reconcile fingerprint: %s", exc)
