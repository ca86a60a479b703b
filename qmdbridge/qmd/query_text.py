"""What a qmd search call sends: the content words, the words searched alone, the query encoded.

Pure functions with nothing heavy imported, so the one-shot CLI works out a search's qmd
calls before it loads the config (``cli/qmd_prefetch.py``) exactly as the backend does.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Mapping, Sequence

from fallback.text.keywords import STOP_WORDS, cjk_words, contraction_fragments
from fallback.text.scripts import contains_cjk, narrow_fullwidth

__all__ = ["BUSY_TIMEOUT_VAR", "MAX_RELAXED_TERMS", "MIN_RELAXED_CHARS", "POOL_FACTOR",
           "SEARCH_BUSY_TIMEOUT_MS", "cjk_terms", "encode_query", "is_lex_call", "lex_queries", "lexical_terms",
           "loads_models",
           "qmd_argv", "relaxed_terms", "search_call", "search_env", "search_limits", "search_words", "without_stray_quote"]

# At most this many content words are searched one by one in the relaxed pass.
MAX_RELAXED_TERMS = 6
# Shorter terms are not searched on their own (qmd reads every term as a prefix).
MIN_RELAXED_CHARS = 2
# Notes asked of each collection per result slot by a question's ``lex`` call (the passage pool).
POOL_FACTOR = 4
# qmd's SQLite busy timeout, ms, read from this variable (qmd 2.8.3: 120,000 ms by default).
BUSY_TIMEOUT_VAR = "QMD_SQLITE_BUSY_TIMEOUT"
# A search call's wait for a writer on qmd's index, ms: a busy answer is then retried in the deadline.
SEARCH_BUSY_TIMEOUT_MS = 250

# A token that is qmd syntax: a negation at a token start (``-word``, ``-"phrase"``), not the
# query's first (:func:`encode_query` detaches leading dashes: the builtin engine reads a word).
_NEGATION_RE = re.compile(r"\s-[\w\"]")
# Apostrophes as keyboards and autocorrection write them, read as ``'``.
_APOSTROPHES = str.maketrans(dict.fromkeys("\u2019\u2018\u02bc`\u00b4\uff07", "'"))
# Separators of a hyphenated or dotted token (``wi-fi``, ``2026.4.10``), matched whole by qmd.
_JOINERS = ("-", ".")


def _is_word_char(ch: str) -> bool:
    """A letter, mark, digit or ``_``: part of a token for FTS5's ``unicode61``."""
    return ch == "_" or unicodedata.category(ch)[0] in "LMN"


def _word_spans(text: str, start: int, end: int) -> list[tuple[int, int]]:
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
    """What qmd matches whole of a token whose runs are joined by single ``-`` or ``.`` (the token,
    or its hyphen-separated parts when it mixes both: ``1.2.3-rc1``); ``None`` otherwise."""
    seps = [text[a_end:b_start] for (_, a_end), (b_start, _) in zip(spans, spans[1:], strict=False)]
    if not seps or any(sep not in _JOINERS for sep in seps):
        return None
    token = text[spans[0][0]:spans[-1][1]]
    return token.split("-") if len(set(seps)) > 1 else [token]


def lexical_terms(query: str) -> tuple[str, ...]:
    """The content words of ``query`` for qmd's lexical grammar, once each, in query order, as
    written (a full-width word first in its ASCII form); ``()`` when the query is sent as written
    (qmd syntax, CJK text, only stop words). Words are FTS5 tokens; every apostrophe form splits.

    Example: ``When did Caroline go to the LGBTQ support group?`` -> ``("Caroline", "LGBTQ",
    "support", "group")``; ``1.2.3-rc1 router`` -> ``("1.2.3", "rc1", "router")``.
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
    """``query`` without the last of an odd number of double quotes (a quote left open is a typo,
    not qmd syntax); unchanged otherwise."""
    if query.count('"') % 2 == 0:
        return query
    i = query.rfind('"')
    return (query[:i] + query[i + 1:]).strip() or query


def cjk_terms(query: str) -> tuple[str, ...]:
    """The words of a query holding CJK text (``fallback.text.keywords.cjk_words``), for the
    relaxed pass; ``()`` without CJK, with qmd syntax or without a word."""
    text = unicodedata.normalize("NFC", query).strip().lower()
    if not text or '"' in text or _NEGATION_RE.search(text):
        return ()
    return cjk_words(text)


def relaxed_terms(terms: Sequence[str]) -> list[str]:
    """The terms searched one by one: the first :data:`MAX_RELAXED_TERMS` of at least
    :data:`MIN_RELAXED_CHARS` characters, or of one CJK character."""
    return [t for t in terms if len(t) >= MIN_RELAXED_CHARS or contains_cjk(t)][:MAX_RELAXED_TERMS]


# qmd's structured query document: a line starting with one of these prefixes (``query`` mode).
_QUERY_DOC_PREFIX_RE = re.compile(r"^(\s*)(lex|vec|hyde|intent|expand)(\s*):", re.I)
# Leading dashes of a query, which qmd's FTS grammar would read as a negation.
_LEADING_DASHES_RE = re.compile(r"^(-+)(?=\S)")


def encode_query(query: str, mode: str) -> str:
    """A trimmed query as qmd reads it literally: in ``query`` mode newlines become spaces and a
    leading ``lex:``/``vec:``/... prefix gets a space before its colon; leading dashes are
    detached (``-dash x`` -> ``- dash x``) so they are no negation."""
    q = query.strip()
    if mode == "query":
        q = " ".join(q.splitlines())
        q = _QUERY_DOC_PREFIX_RE.sub(lambda m: f"{m.group(1)}{m.group(2)} :", q, count=1)
    return _LEADING_DASHES_RE.sub(lambda m: m.group(1) + " ", q, count=1)


def search_words(query: str, mode: str) -> tuple[str, tuple[str, ...]]:
    """``(first, words)``: what ``search`` mode sends first (the :func:`lexical_terms` joined, or the
    query as written) and the words the relaxed pass may search (in ``search`` mode also the
    :func:`cjk_terms`)."""
    terms = lexical_terms(query)
    return " ".join(terms) or query, terms or (cjk_terms(query) if mode == "search" else ())


def search_limits(cap: int, max_results: int | None, min_score: float | None) -> tuple[int, float]:
    """``(hits, score floor)`` of a qmd search: ``max_results`` capped at ``cap``
    (``limits.maxResults``; ``cap`` when none) and ``min_score`` (0 when none)."""
    return min(cap, max_results or cap), min_score or 0.0


def search_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with qmd's SQLite busy timeout at most :data:`SEARCH_BUSY_TIMEOUT_MS` (a new dict)."""
    raw = env.get(BUSY_TIMEOUT_VAR, "")
    if raw.isdigit() and int(raw) <= SEARCH_BUSY_TIMEOUT_MS:
        return dict(env)
    return {**env, BUSY_TIMEOUT_VAR: str(SEARCH_BUSY_TIMEOUT_MS)}


def lex_queries(first: str, terms: Sequence[str]) -> tuple[str, ...]:
    """A question's lexical searches, most important first: ``first``, then each of the
    :func:`relaxed_terms`, once each; ``()`` without ``terms`` (qmd syntax)."""
    return tuple(dict.fromkeys([first, *relaxed_terms(terms)])) if terms else ()


def search_call(q: str, collection: str, *, mode: str, limit: int, no_rerank: bool = False,
                lex: Sequence[str] = ()) -> tuple[list[str], str, str]:
    """One collection's search call: ``(flags, positional, command)`` of ``qmd <flags> --index index
    -- <positional>``; ``command`` names the qmd command whose answer is parsed.

    A lex call (:func:`is_lex_call`) is ``qmd query --json -n <POOL_FACTOR * limit> --no-rerank -c
    <collection>`` of one ``lex:`` line per ``lex`` query (no model loaded); else ``qmd <mode>
    --json -n <limit> [--no-rerank] -c <collection>`` of ``q`` (:func:`encode_query`).
    """
    if is_lex_call(mode, lex):
        return (["query", "--json", "-n", str(POOL_FACTOR * limit), "--no-rerank", "-c", collection],
                "\n".join(f"lex: {t}" for t in lex), "query")
    return ([mode, "--json", "-n", str(limit), *(["--no-rerank"] if no_rerank else []), "-c", collection],
            encode_query(q, mode), mode)


def qmd_argv(program: str, flags: Sequence[str], positionals: Sequence[str] = ()) -> list[str]:
    """Every qmd command line: ``[program, *flags, "--index", "index", "--", *positionals]`` (no
    ``--`` without positionals). ``--`` ends qmd's option parsing, so user text is never a flag;
    ``--index index`` pins the collections and database to the per-agent XDG dirs."""
    out = [program, *flags, "--index", "index"]
    return out + ["--", *positionals] if positionals else out


def loads_models(argv: Sequence[str]) -> bool:
    """Whether a qmd command line (:func:`qmd_argv`'s shape) may load a GGUF model: ``vsearch``,
    ``embed`` and a ``query`` of anything but ``lex:`` lines (:func:`search_call`'s lex call);
    ``search`` (BM25), ``update`` and the collection commands load none."""
    command = argv[1] if len(argv) > 1 else ""
    if command in ("vsearch", "embed"):
        return True
    if command != "query":
        return False
    lines = [ln for ln in argv[-1].splitlines() if ln.strip()] if "--" in argv[:-1] else []
    return not lines or not all(ln.startswith("lex:") for ln in lines)


def is_lex_call(mode: str, lex: Sequence[str]) -> bool:
    """Whether a search's spawned call is one ``qmd query`` of ``lex`` searches: ``search`` mode
    with several :func:`lex_queries`."""
    return mode == "search" and len(lex) > 1
