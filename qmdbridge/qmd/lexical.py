"""Questions through qmd's lexical search: the relaxed pass, for a qmd that rejects the ``lex`` call.

Why: docs/qmd.md, "Questions in ``search`` mode".

Source: coordination-level matching (Salton & McGill, "Introduction to Modern Information
Retrieval", 1983, ch. 4).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

import anyio

from fallback.errors import BackendUnavailableError
from qmdbridge.qmd.parse import merge_best, merge_key
from qmdbridge.qmd.query_text import relaxed_terms
from qmdbridge.qmd.results_json import QmdEntry
from qmdbridge.qmd.search_calls import (
    MAX_PARALLEL_CALLS,
    CallPlan,
    FlagRejected,
    MissingCollection,
    RunSearch,
    VectorModuleMissing,
    WarmSearch,
    search_collections,
)

if TYPE_CHECKING:
    from qmdbridge.qmd.collections import ManagedCollection
    from qmdbridge.qmd.parse import IndexCounts

__all__ = ["RELAX_MIN_LEFT_MS", "relax"]

log = logging.getLogger("qmdbridge.qmd.backend")

# The relaxed pass is skipped when less than this is left of the search deadline, ms.
RELAX_MIN_LEFT_MS = 500


async def relax(terms: Sequence[str], found: list[tuple[QmdEntry, str | None]],
                colls: list[ManagedCollection], plan: CallPlan, *, run: RunSearch,
                warm: WarmSearch | None, keep: int, sent: str,
                counts: IndexCounts) -> list[tuple[QmdEntry, str | None]]:
    """The relaxed pass: ``found`` first, then the documents each :func:`relaxed_terms` term other
    than ``sent`` finds alone, best qmd score first, one per document, at most ``keep``. Nothing
    is searched when ``found`` fills ``plan.limit``, less than :data:`RELAX_MIN_LEFT_MS` is left,
    or ``found`` holds every document of each collection (qmd's index ``counts``); a failed
    relaxed call is logged and left out.

    Returns:
        ``(entry, collection)`` pairs, best first.
    """
    picked = [t for t in relaxed_terms(terms) if t != sent]
    if len(found) >= plan.limit or not picked or plan.remaining_ms() < RELAX_MIN_LEFT_MS:
        return found
    keys: dict[str | None, set[str]] = {}
    for entry, coll in found:
        keys.setdefault(coll, set()).add(merge_key(entry, coll))
    known = (await counts.read())[0]
    colls = [c for c in colls if c.name not in known or len(keys.get(c.name, ())) < known[c.name]]
    if not colls:
        return found
    answers: list[list[tuple[QmdEntry, str | None]]] = [[] for _ in picked]
    limiter = anyio.CapacityLimiter(MAX_PARALLEL_CALLS)

    async def one(i: int, term: str) -> None:
        try:
            answers[i] = await search_collections(term, colls, plan, run=run, warm=warm,
                                                  limiter=limiter)
        except (BackendUnavailableError, FlagRejected, MissingCollection,
                VectorModuleMissing) as exc:  # timeouts, busy or failed calls
            log.info("qmd search for %r alone failed, its hits are left out: %s", term, exc)

    async with anyio.create_task_group() as tg:
        for i, term in enumerate(picked):
            tg.start_soon(one, i, term)
    # in query order, each best first: equal scores keep that order
    more = merge_best((pair for answer in answers for pair in answer),
                      skip={merge_key(entry, coll) for entry, coll in found})
    return [*found, *more][:keep]
