"""What a ``search``-mode call sends qmd: the content words, the words searched alone, the query encoded.

Pure functions over the query text, with no I/O and nothing heavy imported (the standard
library and ``fallback.text``), so the one-shot CLI can work out a search's qmd calls before it
loads the config models (``qmdbridge/cli/qmd_prefetch.py``) exactly as the backend does
(``qmdbridge/qmd/backend.py``, ``qmdbridge/qmd/lexical.py``, which explains the two steps).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Mapping, Sequence

from fallback.text.keywords import STOP_WORDS, cjk_words, contraction_fragments
from fallback.text.scripts import contains_cjk, narrow_fullwidth

__all__ = ["BUSY_TIMEOUT_VAR", "MAX_RELAXED_TERMS", "MIN_RELAXED_CHARS", "POOL_FACTOR",
           "SEARCH_BUSY_TIMEOUT_MS", "cjk_terms", "encode_query", "is_lex_call", "lex_queries", "lexical_terms",
           "qmd_argv", "relaxed_terms", "search_call", "search_env", "search_limits", "search_words", "without_stray_quote"]

# At most this many content words are searched one by one in the relaxed pass (each is one
# qmd process per collection).
MAX_RELAXED_TERMS = 6
# Shorter terms are not searched on their own (qmd reads every term as a prefix).
MIN_RELAXED_CHARS = 2
# Notes asked of each collection per result slot by a question's ``lex`` call: the pool whose
# passages are ranked (``passages.py``); more stopped adding recall (docs/benchmarks.md).
POOL_FACTOR = 4
# qmd's SQLite busy timeout, ms, read from this variable (qmd 2.8.3: 120,000 ms by default).
BUSY_TIMEOUT_VAR = "QMD_SQLITE_BUSY_TIMEOUT"
# A search call waits at most this long for qmd's index while a writer (``qmd embed``, an
# update) holds it, then answers "database is locked": a busy answer, retried within the search
# deadline and never a qmd failure. qmd's default would outlast any search deadline, and a
# timeout opens the circuit breaker.
SEARCH_BUSY_TIMEOUT_MS = 250

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


# qmd's structured query document: a line starting with one of these prefixes (``query`` mode).
_QUERY_DOC_PREFIX_RE = re.compile(r"^(\s*)(lex|vec|hyde|intent|expand)(\s*):", re.I)
# Leading dashes of a query, which qmd's FTS grammar would read as a negation.
_LEADING_DASHES_RE = re.compile(r"^(-+)(?=\S)")


def encode_query(query: str, mode: str) -> str:
    """Make a trimmed user query reach qmd literally.

    ``--`` already stops flag parsing; two qmd grammars remain:
    - ``query`` mode reads a multi-line text or a line starting with ``lex:``/``vec:``/
      ``hyde:``/``intent:``/``expand:`` as a structured query document. Newlines become
      spaces and a leading prefix gets a space before its colon (``lex : x``); FTS drops the
      colon anyway, so the words searched are the same.
    - qmd's FTS grammar reads ``-word`` as NOT. A query *starting* with ``-`` would match
      nothing but negations, so the leading dashes are detached (``-dash x`` -> ``- dash x``);
      a ``-word`` later in the query keeps qmd's negation meaning.
    """
    q = query.strip()
    if mode == "query":
        q = " ".join(q.splitlines())
        q = _QUERY_DOC_PREFIX_RE.sub(lambda m: f"{m.group(1)}{m.group(2)} :", q, count=1)
    return _LEADING_DASHES_RE.sub(lambda m: m.group(1) + " ", q, count=1)


def search_words(query: str, mode: str) -> tuple[str, tuple[str, ...]]:
    """What a search of ``query`` in ``mode`` sends qmd first, and the words the relaxed pass
    may search one by one (pure).

    Args:
        query: the trimmed user query, a stray quote dropped (:func:`without_stray_quote`).
        mode: ``search`` | ``vsearch`` | ``query``.

    Returns:
        ``(first, words)``: ``first`` is the :func:`lexical_terms` joined by spaces, or the
        query as written when it has none (``search`` mode sends it; ``vsearch`` and ``query``
        send the query as written whatever this says); ``words`` are those terms, or in
        ``search`` mode the :func:`cjk_terms` of a query without them, else ``()``.
    """
    terms = lexical_terms(query)
    return " ".join(terms) or query, terms or (cjk_terms(query) if mode == "search" else ())


def search_limits(cap: int, max_results: int | None, min_score: float | None) -> tuple[int, float]:
    """What a qmd search applies (pure): ``(hits, score floor)``, ``max_results`` capped at
    ``limits.maxResults`` (``cap``; ``cap`` when none was asked) and ``min_score`` (0, no floor,
    when none was given). The backend, the one-shot prefetch and the eval report call it."""
    return min(cap, max_results or cap), min_score or 0.0


def search_env(env: Mapping[str, str]) -> dict[str, str]:
    """The environment of a search call (pure): ``env`` with qmd's SQLite busy timeout at most
    :data:`SEARCH_BUSY_TIMEOUT_MS` (a smaller value already set is kept). The backend and the
    one-shot prefetch both build a search call's environment with it.

    Args:
        env: the child environment of every qmd command (``qmdbridge.paths.child_env``).

    Returns:
        A new dict.
    """
    raw = env.get(BUSY_TIMEOUT_VAR, "")
    if raw.isdigit() and int(raw) <= SEARCH_BUSY_TIMEOUT_MS:
        return dict(env)
    return {**env, BUSY_TIMEOUT_VAR: str(SEARCH_BUSY_TIMEOUT_MS)}


def lex_queries(first: str, terms: Sequence[str]) -> tuple[str, ...]:
    """A question's lexical searches for one ``lex`` call per collection, most important first
    (pure): ``first`` (the content words ANDed, or a CJK question as written), then each of the
    :func:`relaxed_terms` alone, once each (``qmdbridge/qmd/lexical.py`` explains the two
    steps); spawned as one call only when there are several (:func:`is_lex_call`).

    Args:
        first: what ``search`` mode sends first (:func:`search_words`).
        terms: the words searched one by one (:func:`search_words`; ``()`` for qmd syntax).

    Returns:
        The queries, ``first`` first; ``()`` for a query in qmd's syntax (no ``terms``).
    """
    return tuple(dict.fromkeys([first, *relaxed_terms(terms)])) if terms else ()


def search_call(q: str, collection: str, *, mode: str, limit: int, no_rerank: bool = False,
                lex: Sequence[str] = ()) -> tuple[list[str], str, str]:
    """One collection's search call (pure), as the backend runs it and the one-shot CLI
    starts it ahead: ``(flags, positional, command)`` of ``qmd <flags> --index index --
    <positional>``.

    A lex call (:func:`is_lex_call`), one ``qmd query --json -n <POOL_FACTOR * limit>
    --no-rerank -c <collection>`` whose positional is a query document with a ``lex:`` line
    per query: qmd's typed lexical sub-searches, each ``qmd search``'s BM25, fused by
    reciprocal rank with the first weighted twice; it loads no model and works with ``CI`` set.
    Else one ``qmd <mode> --json -n <limit> [--no-rerank] -c <collection>`` of ``q`` encoded
    (:func:`encode_query`).

    Args:
        q: the query as ``mode`` sends it (unused with ``lex``).
        collection: the collection's name.
        mode: ``search`` | ``vsearch`` | ``query``.
        limit: results asked (result slots).
        no_rerank: pass ``--no-rerank`` (``query`` with ``rerank: false``).
        lex: the typed lexical sub-searches (used in ``search`` mode only), or ``()``.

    Returns:
        ``(flags, positional, command)``; ``command`` names the qmd command (``query`` for a
        ``lex`` call), for parsing its answer.
    """
    if is_lex_call(mode, lex):
        return (["query", "--json", "-n", str(POOL_FACTOR * limit), "--no-rerank", "-c", collection],
                "\n".join(f"lex: {t}" for t in lex), "query")
    return ([mode, "--json", "-n", str(limit), *(["--no-rerank"] if no_rerank else []), "-c", collection],
            encode_query(q, mode), mode)


def qmd_argv(program: str, flags: Sequence[str], positionals: Sequence[str] = ()) -> list[str]:
    """Every qmd command line (pure): ``[program, *flags, "--index", "index", "--",
    *positionals]`` (no ``--`` without positionals).

    How qmd 2.8.3 parses it (``util.parseArgs``, ``strict: false``; checked against the real
    CLI): ``--`` ends option parsing, so user text after it is never read as a flag (without
    it, ``-leading`` is read as ``-l eading`` and dropped; after it even ``--index`` is query
    text); the query then goes through qmd's FTS grammar, where ``-word`` is a negation and
    ``"..."`` a phrase (:func:`encode_query`). ``--index index`` pins the collections to
    ``$QMD_CONFIG_DIR/index.yml`` and the database to ``$XDG_CACHE_HOME/qmd/index.sqlite``, so
    a ``.qmd/index.yml`` in a folder above the cwd cannot replace them."""
    out = [program, *flags, "--index", "index"]
    return out + ["--", *positionals] if positionals else out


def is_lex_call(mode: str, lex: Sequence[str]) -> bool:
    """Whether a search's spawned call is one ``qmd query`` of typed ``lex`` searches (pure):
    in ``search`` mode with several :func:`lex_queries`; one query alone is a plain
    ``qmd search`` (the warm child takes it as one ``lex`` search either way)."""
    return mode == "search" and len(lex) > 1
