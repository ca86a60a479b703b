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
   with its consonants). The first call ANDs those (file R@5 0.18 -> 0.40 on LoCoMo, qmd alone).
2. :func:`relax`: when that call fills fewer than the slots asked for, each content word is
   searched on its own, and the documents found that way follow the AND hits, best qmd score
   first (one entry per document, its best-scoring match; equal scores, common when qmd rounds
   a weak BM25 to 0, in the order of the query's words, then of each word's hits):
   coordination-level matching, where documents holding every query word rank first.

Through the bridge (``qmdbridge eval --backend qmd``, maxResults 6) the two steps take LoCoMo
from R@5 0.108 / file R@5 0.183 (the question as written) to 0.507 / 0.760, at a search p50 of
345 ms instead of 120 ms (one qmd process per word and collection, side by side); the passages
of the notes found, ranked for the question (``passages.py``), then give R@5 0.727.

In long-lived mode with the warm ``qmd mcp`` child ready, :func:`warm_candidates` asks both
steps of a collection in one call instead (qmd's typed ``lex`` sub-searches, fused by
reciprocal rank; ``warm.py``): on LoCoMo a search p50 of 33 ms instead of 350 ms, with the same
recall once the passages are ranked (R@5 0.726 against 0.727, R@1 0.481 against 0.471).

A query written in qmd's own syntax (a ``"quoted phrase"``, a ``-negated`` word) is sent as
written, with no relaxed pass; a double quote left open is a typo and dropped first
(:func:`without_stray_quote`). A query holding CJK text is sent as written first (qmd matches a
CJK term as the phrase of its characters), then its words one by one (:func:`cjk_terms`).

Source: coordination-level matching (Salton & McGill, "Introduction to Modern Information
Retrieval", 1983, ch. 4): rank by the number of query terms matched, then by weight.
"""

from __future__ import annotations

import logging
import re
import unicodedata
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import anyio

from fallback.errors import BackendUnavailableError
from fallback.text.keywords import STOP_WORDS, cjk_words, contraction_fragments
from fallback.text.scripts import contains_cjk, narrow_fullwidth
from qmdbridge.qmd.parse import QmdEntry, merge_key

if TYPE_CHECKING:
    from qmdbridge.qmd.collections import ManagedCollection
    from qmdbridge.qmd.parse import IndexCounts
    from qmdbridge.qmd.search_calls import CallPlan, RunSearch, WarmSearch

__all__ = ["MAX_RELAXED_TERMS", "MIN_RELAXED_CHARS", "RELAX_MIN_LEFT_MS", "all_found", "cjk_terms",
           "lexical_terms", "relax", "warm_candidates", "without_stray_quote"]

log = logging.getLogger("qmdbridge.qmd.backend")

# At most this many content words are searched one by one in the relaxed pass (each is one
# qmd process per collection).
MAX_RELAXED_TERMS = 6
# Shorter terms are not searched on their own (qmd reads every term as a prefix).
MIN_RELAXED_CHARS = 2
# The relaxed pass is skipped when less than this is left of the search deadline, ms.
RELAX_MIN_LEFT_MS = 500

# A token that is qmd syntax: a negation at a token start (``-word``, ``-"phrase"``).
_NEGATION_RE = re.compile(r"(?:^|\s)-[\w\"]")
# Apostrophes as keyboards and autocorrection write them (right and left single quotation
# marks, the modifier letter, grave and acute accents, the fullwidth form), read as ``'``.
_APOSTROPHES = str.maketrans(dict.fromkeys("\u2019\u2018\u02bc`\u00b4\uff07", "'"))
# The separators of a hyphenated or dotted token, which qmd matches as a phrase or as its parts
# ANDed: ``wi-fi``, ``abc-1234``, ``2026.4.10``.
_JOINERS = ("-", ".")


def _is_word_char(ch: str) -> bool:
    """A letter, mark, digit or ``_``: what FTS5's ``unicode61`` reads as part of a token."""
    return ch == "_" or unicodedata.category(ch)[0] in "LMN"


def _word_spans(text: str, start: int, end: int) -> list[tuple[int, int]]:
    """Spans of the runs of word characters in ``text[start:end]``, in order."""
    spans: list[tuple[int, int]] = []
    i = start
    while i < end:
        if _is_word_char(text[i]):
            j = i + 1
            while j < end and _is_word_char(text[j]):
                j += 1
            spans.append((i, j))
            i = j
        else:
            i += 1
    return spans


def _joined_pieces(text: str, spans: list[tuple[int, int]]) -> list[str] | None:
    """The pieces qmd matches whole when the runs ``spans`` of one token are joined by single
    hyphens or dots (``None`` otherwise): the token itself, or, when it mixes both, its
    hyphen-separated parts (qmd matches ``1.2.3-rc1`` neither as a phrase nor by its dotted
    parts, but ``1.2.3`` and ``rc1`` each)."""
    seps = [text[a_end:b_start] for (_, a_end), (b_start, _) in zip(spans, spans[1:], strict=False)]
    if not seps or any(sep not in _JOINERS for sep in seps):
        return None
    token = text[spans[0][0]:spans[-1][1]]
    return token.split("-") if len(set(seps)) > 1 else [token]


def lexical_terms(query: str) -> tuple[str, ...]:
    """The content words of ``query`` for qmd's lexical grammar, first occurrence kept, in query
    order (pure).

    Args:
        query: the user's query (any text).

    Returns:
        The terms as written (qmd lower-cases them), each once whatever its case; ``()`` when
        the query should be sent as written: it uses qmd syntax (a
        double quote, a ``-`` at a token start), holds CJK text, or has no content word at all
        (only stop words: the words are all there is to search). A word is a run of letters,
        marks, digits and ``_``, as FTS5 reads a token (a Devanagari or Thai word keeps its
        vowel signs); every apostrophe form (right and left single quotation marks, the modifier
        letter apostrophe, grave and acute accents, the fullwidth apostrophe) separates words
        as ``'`` does.

    Examples:
        ``When did Caroline go to the LGBTQ support group?`` -> ``("Caroline", "LGBTQ",
        "support", "group")``; ``What's Nate\u00b4s Wi-Fi password?`` -> ``("Nate", "Wi-Fi",
        "password")``; ``1.2.3-rc1 router`` -> ``("1.2.3", "rc1", "router")``;
        ``"exact phrase" -draft`` -> ``()``; ``ｒｏｕｔｅｒ`` (full width) -> ``("router",
        "ｒｏｕｔｅｒ")``: its ASCII form first, then the word as typed.
    """
    text = unicodedata.normalize("NFC", query).strip().translate(_APOSTROPHES)
    if not text or '"' in text or _NEGATION_RE.search(text) or contains_cjk(text):
        return ()
    fragments = set(contraction_fragments(text))
    terms: dict[str, str] = {}  # lower-cased -> first surface form
    for token in re.finditer(r"\S+", text):
        spans = _word_spans(text, token.start(), token.end())
        pieces = _joined_pieces(text, spans) if len(spans) > 1 else None
        if pieces is not None:
            for piece in pieces:
                if any(p.lower() not in STOP_WORDS for p in piece.split(".")):
                    terms.setdefault(piece.lower(), piece)
            continue
        for span in spans:
            word = text[span[0]:span[1]]
            narrow = narrow_fullwidth(word)  # qmd finds router only as router, not ｒｏｕｔｅｒ
            if span not in fragments and narrow.lower() not in STOP_WORDS:
                terms.setdefault(narrow.lower(), narrow)
                terms.setdefault(word.lower(), word)
    return tuple(terms.values())


def without_stray_quote(query: str) -> str:
    """The query without a double quote that is never closed (pure).

    qmd reads a quote that opens no pair as part of the term (``"pottery``): it still finds the
    note, but its snippet, looking for the quoted text, falls back to the note's first lines,
    which need not hold the word, and a query in qmd's syntax keeps qmd's lines. A quote left
    open is a typo, so the last one of an odd number is dropped: the rest is searched as a
    question, or as the phrases its balanced quotes make.

    Args:
        query: the user's query.

    Returns:
        ``query`` unchanged when its double quotes pair up (or it holds nothing else), else
        ``query`` without its last double quote.

    Examples:
        ``"pottery workshop`` -> ``pottery workshop``; ``"support group" "weekly`` ->
        ``"support group" weekly``.
    """
    if query.count('"') % 2 == 0:
        return query
    i = query.rfind('"')
    return (query[:i] + query[i + 1:]).strip() or query


def cjk_terms(query: str) -> tuple[str, ...]:
    """The words of a query holding CJK text, for the relaxed pass (pure).

    qmd indexes a CJK run character by character and matches a CJK query term as the phrase of
    its characters (``normalizeCjkForFTS``), so a question sent whole ("我们什么时候去了支持小组")
    matches only a note that holds it verbatim. Its words are the builtin engine's
    (``fallback.text.keywords.cjk_words``: ideograph bigrams that take no stop word's
    character, Japanese and Korean words, then lone ideographs), which its keyword search
    also searches one by one.

    Args:
        query: the user's query (any text).

    Returns:
        The words in query order; ``()`` without CJK text, with qmd syntax (a double quote,
        a ``-`` at a token start) or without any word.

    Examples:
        ``我们什么时候去了支持小组？`` -> ``("时候", "候去", "支持", "持小", "小组")``;
        ``東京の会議はいつですか`` -> ``("東京", "会議")``.
    """
    text = unicodedata.normalize("NFC", query).strip().lower()
    if not text or '"' in text or _NEGATION_RE.search(text):
        return ()
    return cjk_words(text)


def relaxed_terms(terms: Sequence[str]) -> list[str]:
    """The terms the relaxed pass searches one by one: the first :data:`MAX_RELAXED_TERMS` of
    at least :data:`MIN_RELAXED_CHARS` characters, or of one CJK character (qmd matches that
    character alone, where a one-letter Latin term is a prefix of every word)."""
    return [t for t in terms if len(t) >= MIN_RELAXED_CHARS or contains_cjk(t)][:MAX_RELAXED_TERMS]


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


async def warm_candidates(first: str, terms: Sequence[str], colls: list[ManagedCollection],
                          plan: CallPlan, *, warm: WarmSearch,
                          keep: int) -> list[tuple[QmdEntry, str | None]] | None:
    """Both steps through the warm child, one call per collection (in turn, as the child takes
    them): ``first`` (the content words ANDed, or a CJK question as written), then each of the
    :func:`relaxed_terms` alone, as qmd's ``lex`` sub-searches, fused by qmd (reciprocal rank,
    ``first`` weighted twice).

    Args:
        first: the AND call's query.
        terms: :func:`lexical_terms` of the query, else its :func:`cjk_terms` (at least one).
        colls: the collections to search.
        plan: the search's plan (``search`` mode, deadline).
        warm: the warm child.
        keep: documents asked of each collection (the passage ranking's pool).

    Returns:
        ``(entry, collection)`` pairs, best fused rank first (across collections, rank by
        rank), at most ``keep`` per collection and not cut further: a fused rank says nothing
        across collections (every collection's best note scores 1), so cutting the union in
        collection order could drop the only note holding every word; the passage ranking
        decides among them. ``None`` when a call was declined (the child is not ready, or qmd
        refused the call): the caller spawns the ``search`` calls instead.

    Raises:
        BackendTimeoutError: past the search deadline.
    """
    queries = list(dict.fromkeys([first, *relaxed_terms(terms)]))
    best: dict[str, tuple[QmdEntry, str | None]] = {}
    for coll in colls:
        answer = await warm.search_lex(queries, coll, plan, limit=keep)
        if answer is None:  # counted once; the question is spawned for every collection
            warm.count_spawned(len(colls) - 1)
            return None
        for entry in answer:
            key = merge_key(entry, coll.name)
            if key not in best or (entry.score or 0.0) > (best[key][0].score or 0.0):
                best[key] = (entry, coll.name)
    return sorted(best.values(), key=lambda pair: -(pair[0].score or 0.0))  # stable
