"""Questions through qmd's lexical search: content words, then a relaxed pass.

``qmd search`` ANDs every word of its query, stop words included, each as a prefix (``"when"*
AND "did"* AND "caroline"* ...``), over whole documents. Agents ask questions, so a question
sent as written matches almost nothing ("When did Caroline go to the LGBTQ support group?" needs
a note holding *when*, *did*, *go* and *the*). On the LoCoMo development conversations (760
questions, one qmd document per session), ``qmd search`` with the question as written finds the
evidence's file among the first five hits for 0.18 of the evidence turns.

Two steps, in ``search`` mode only (``vsearch`` and ``query`` read the question as a sentence):

1. :func:`lexical_terms`: the query's content words, as qmd's grammar reads them: stop words of
   every supported language (``fallback.text.keywords.STOP_WORDS``) and the pieces of English
   contractions and possessives (the ``s`` of ``Nate's``, whichever apostrophe is typed) dropped;
   hyphenated and dotted tokens (``Wi-Fi``, ``ABC-1234``, ``2026.4.10``) kept whole, since qmd
   matches them as phrases (a token mixing both, ``1.2.3-rc1``, which qmd matches neither way,
   is cut at its hyphens); a word keeps its combining marks, as FTS5 reads it (qmd 2.8.3 drops
   the marks from a query term, so its search finds no word written with them, a Devanagari or
   Thai word say; cut at its marks, the word would match any note holding words that start
   with its consonants). The first call ANDs those.
2. :func:`relax`: when that call fills fewer than the slots asked for, each content word is
   searched on its own, and the documents found that way follow the AND hits, best qmd score
   first (one entry per document, its best-scoring match; equal scores, common when qmd rounds
   a weak BM25 to 0, in the order of the query's words, then of each word's hits):
   coordination-level matching, where documents holding every query word rank first.

The relaxed pass costs one qmd process per word and collection, side by side; the passages of
the notes found are then ranked for the question (``passages.py``). What each step gives
through the bridge (``qmdbridge eval --backend qmd``) is in docs/benchmarks.md ("Questions in
qmd's search mode").

A question asks both steps of a collection in one call instead (``query_text.search_call``:
``qmd query --no-rerank`` with a ``lex:`` line per search, or the warm ``qmd mcp`` child's
``query`` tool in long-lived mode; qmd fuses them by reciprocal rank), with the same recall once
the passages are ranked (figures: docs/benchmarks.md); :func:`relax` is left for a qmd that
rejects that call.

A query written in qmd's own syntax (a ``"quoted phrase"``, a ``-negated`` word) is sent as
written, with no relaxed pass; a double quote left open is a typo and dropped first
(:func:`without_stray_quote`). A query holding CJK text is sent as written first (qmd matches a
CJK term as the phrase of its characters), then its words one by one (:func:`cjk_terms`).

Source: coordination-level matching (Salton & McGill, "Introduction to Modern Information
Retrieval", 1983, ch. 4): rank by the number of query terms matched, then by weight.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import anyio

from fallback.errors import BackendUnavailableError
from qmdbridge.qmd.parse import merge_key
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
    seen = {merge_key(entry, coll) for entry, coll in found}
    best: dict[str, tuple[QmdEntry, str | None]] = {}
    for answer in answers:  # in query order, each best first: equal scores keep that order
        for entry, coll in answer:
            key = merge_key(entry, coll)
            if key in seen:
                continue
            if key not in best or (entry.score or 0.0) > (best[key][0].score or 0.0):
                best[key] = (entry, coll)
    more = sorted(best.values(), key=lambda pair: -(pair[0].score or 0.0))  # stable
    return [*found, *more][:plan.limit if keep is None else keep]
