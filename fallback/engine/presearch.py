"""What a builtin search does with the index before ranking: sync it (in full, or within the
search's sync budget), answer from it as it is, or answer nothing from it (an index of another
workspace that could not be re-indexed).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

import anyio

from fallback.index.identity import WORKSPACE_META, full_reindex_reason, other_workspace
from fallback.store.migrations import META_KEY
from fallback.store.seam import SearchStore

__all__ = ["STILL_SYNCING", "IndexState", "PresearchSync", "presearch_sync", "read_index_state",
           "run_presearch_sync"]

PresearchSync = Literal["await", "budget"]
# Why a live-mode answer is stale while the sync it waited for runs on past its budget.
STILL_SYNCING = "the sync before this search still runs after its {budget_ms} ms budget"


@dataclass(frozen=True)
class IndexState:
    """What a search knows of the index before ranking: whether it ``has_chunks``, the other
    workspace it holds (absolute, or ``None``) and why this engine would rebuild it (a
    :func:`~fallback.index.identity.full_reindex_reason`, or ``None``)."""

    has_chunks: bool
    held_workspace: str | None
    rebuild: str | None = None


def read_index_state(store: SearchStore, workspace: str, identity: dict[str, Any]) -> IndexState:
    """The :class:`IndexState` of ``store`` for the absolute ``workspace`` path and the
    ``identity`` this engine builds (blocking); chunks without metadata (the postgres store
    keeps none) tell no rebuild. Raises ``IndexStoreError``."""
    held = other_workspace(store.get_meta_json(WORKSPACE_META), workspace)
    has_chunks, meta = store.has_chunks(), store.get_meta_json(META_KEY)
    rebuild = full_reindex_reason(meta, identity) if meta is not None or not has_chunks else None
    return IndexState(has_chunks, held, rebuild)


def presearch_sync(state: IndexState, *, synced: bool, dirty: bool,
                   on_search: bool) -> PresearchSync | None:
    """Which sync a search runs before ranking, given the index ``state``, whether this
    process ``synced`` already (not counted while ``state.rebuild`` is set), knows of changes
    not indexed (``dirty``) and ``sync.onSearch``: ``"await"`` (in full: the index holds
    another workspace, or is empty before the first sync), ``"budget"`` (within the search's
    budget: ``onSearch`` on and the index dirty or not synced yet) or ``None``."""
    synced = synced and state.rebuild is None
    if state.held_workspace is not None or (not synced and not state.has_chunks):
        return "await"
    if on_search and (dirty or not synced):
        return "budget"
    return None


async def run_presearch_sync(state: IndexState, *, synced: bool, dirty: bool, on_search: bool,
                             budget_ms: int, sync: Callable[[float], Awaitable[None]],
                             live: Any = None) -> Literal["done", "running"] | None:
    """Run the sync :func:`presearch_sync` asks for (arguments as there).

    Args:
        budget_ms: the longest wait in ms for a ``"budget"`` sync (>= 0); past it the sync goes
            on in the background (live mode) or is cancelled between files (one-shot).
        sync: ``sync(lock_deadline)`` runs one sync for the search (failures recorded, not
            raised), waiting for another process's lock until ``lock_deadline`` (anyio clock).
        live: the engine's ``LiveSync`` in live mode (it runs a ``"budget"`` sync), or ``None``.

    Returns: ``None`` when no sync was due (else the store file may have been replaced);
    ``"running"`` when live mode's sync of changes seen since this process synced still runs
    past the budget (the answer tells :data:`STILL_SYNCING`); else ``"done"``.
    """
    kind = presearch_sync(state, synced=synced, dirty=dirty, on_search=on_search)
    if kind is None:
        return None
    with anyio.move_on_after(max(0, budget_ms) / 1000 if kind == "budget" else None) as scope:
        if kind == "budget" and live is not None:
            await live.spawn_sync("search").wait()
        else:
            await sync(scope.deadline)
    return "running" if live is not None and synced and dirty and scope.cancelled_caught else "done"

