"""Questions through qmd's lexical search: the relaxed pass, for a qmd that rejects the ``lex`` call.

``qmd search`` ANDs every word of its query as a prefix, stop words included, so a question is
sent as its content words (``query_text.lexical_terms``; a CJK question as written, then its
words, ``query_text.cjk_terms``). A question's AND and each word alone normally go in one call
per collection (``query_text.search_call``); for a qmd that rejects that call, :func:`relax`
searches each content word on its own when the AND call filled fewer than the slots asked for,
and the documents found that way follow the AND hits, best qmd score first (one entry per
document, its best-scoring match; equal scores in the order of the query's words, then of each
word's hits): coordination-level matching. The passages of the notes found are then ranked for
the question (``passages.py``). docs/qmd.md, "Questions in ``search`` mode", says why.

Source: coordination-level matching (Salton & McGill, "Introduction to Modern Information
Retrieval", 1983, ch. 4): rank by the number of query terms matched, then by weight.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import anyio

from fallback.errors import BackendUnavailableError
from qmdbridge.qmd.parse import merge_best, merge_key
from qmdbridge.qmd.query_text import (
    relaxed_terms,
)
from qmdbridge.qmd.results_json import QmdEntry

if TYPE_CHECKING:
    from qmdbridge.qmd.collections import ManagedCollection
    from qmdbridge.qmd.parse import IndexCounts
    from qmdbridge.qmd.search_calls import CallPlan, RunSearch, WarmSearch

__all__ = ["RELAX_MIN_LEFT_MS", "all_found", "relax"]

log = logging.getLogger("qmdbridge.qmd.backend")

# The relaxed pass is skipped when less than this is left of the search deadline, ms.
RELAX_MIN_LEFT_MS = 500


def all_found(found: list[tuple[QmdEntry, str | None]], colls: Sequence[ManagedCollection],
              counts: Mapping[str, int] | None) -> set[str]:
    """The collections of ``colls`` whose every document the AND call found (pure): as many
    distinct hits (``parse.merge_key``) as qmd's index holds active documents of it
    (``counts``). A word searched alone there could only find those notes again. A collection
    missing from ``counts`` (or no ``counts``) is never in it."""
    keys: dict[str | None, set[str]] = {}
    for entry, coll in found:
        keys.setdefault(coll, set()).add(merge_key(entry, coll))
    return {c.name for c in colls if counts is not None and c.name in counts
            and len(keys.get(c.name, ())) >= counts[c.name]}


async def relax(terms: Sequence[str], found: list[tuple[QmdEntry, str | None]],
                colls: list[ManagedCollection], plan: CallPlan, *, run: RunSearch,
                warm: WarmSearch | None, keep: int | None = None,
                sent: str | None = None,
                counts: IndexCounts | None = None) -> list[tuple[QmdEntry, str | None]]:
    """The relaxed pass (see the module docstring): ``found`` (the AND call's hits, kept first
    and in order), then the documents each of the :func:`relaxed_terms` other than the AND
    call's query finds on its own, best qmd score first, one per document, at most ``keep`` in
    all (``plan.limit`` unless given: ``search`` mode keeps more documents than slots for its
    passage ranking, ``passages.py``).

    Nothing is searched when ``found`` already fills ``plan.limit``, when no term differs from
    the AND call's query (one content word: the AND call searched it), or when less than
    :data:`RELAX_MIN_LEFT_MS` is left of the search deadline. A CJK question's one word is not
    its AND call (``护照`` of ``我的护照呢？``, sent as written), so it is searched alone. A
    collection whose every document ``found`` holds (:func:`all_found`: ``MEMORY.md`` alone,
    found by the AND call) is not searched word by word: those calls could only find notes
    already found, which the pass drops, so the answer is the same without them (and without
    any call at all when that holds for every collection). A relaxed call that fails (a
    deadline, a busy index, a crash) is logged and left out: the AND hits stand on their own.

    Args:
        terms: :func:`lexical_terms` of the query, else its :func:`cjk_terms`.
        found: the AND call's ``(entry, collection)`` pairs, best first.
        colls: the collections the AND call searched.
        plan: that call's plan (``search`` mode, limit, deadline).
        run / warm: as for ``search_calls.search_collections``.
        keep: documents returned at most (default ``plan.limit``).
        sent: the AND call's query (default the ``terms`` joined by spaces).
        counts: qmd's index counts (active documents per collection), read after the AND call
            when the pass would run; ``None``: not known (every collection is searched).

    Returns:
        ``(entry, collection)`` pairs, best first.
    """
    from qmdbridge.qmd.search_calls import (
        MAX_PARALLEL_CALLS,
        FlagRejected,
        MissingCollection,
        VectorModuleMissing,
        search_collections,
    )

    sent = " ".join(terms) if sent is None else sent
    picked = [t for t in relaxed_terms(terms) if t != sent]
    if len(found) >= plan.limit or not picked or plan.remaining_ms() < RELAX_MIN_LEFT_MS:
        return found
    done = all_found(found, colls, (await counts.read())[0] if counts is not None else None)
    colls = [c for c in colls if c.name not in done]
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
    return [*found, *more][:plan.limit if keep is None else keep]
