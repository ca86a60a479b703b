"""The passages of lexical qmd hits, ranked across the notes qmd found.

In ``search`` mode qmd chooses the notes and the builtin engine's keyword ranking chooses the
passages (:func:`rank_passages`): the notes qmd found (``query_text.POOL_FACTOR`` per result
slot) are read as ``memory_get`` reads them, cut into chunks exactly as the builtin index cuts
a note (``chunking.tokens``, ``overlap``, ``sections``) into a throw-away in-memory SQLite with
the builtin index's full-text columns and tokenizer, and the question as written is ranked
there by the builtin engine's keyword-only search (its FTS5 plan and ``bm25()`` weights; the
IDF is that of those chunks). Each hit's snippet is the window of its chunk's lines that best
matches the question, its score ``sqrt(BM25 / best BM25)``. A note the plan does not match,
one over :data:`MAX_FOCUS_CHARS`, or one that no longer fits the :data:`MAX_POOL_CHARS` pool,
keeps qmd's lines (``parse.passage_hits``); so does every ``vsearch`` and ``query`` hit.
docs/qmd.md, "Questions in ``search`` mode", says why.

Source: passage retrieval inside retrieved documents (Salton, Allan & Buckley, "Approaches to
passage retrieval in full text information systems", SIGIR 1993; Callan, "Passage-level
evidence in document retrieval", SIGIR 1994), with the builtin engine's keyword ranking over
the builtin engine's chunks as the passage ranker.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from fallback.errors import IndexStoreError
from fallback.models import Source
from fallback.search.fts_only import MAX_CANDIDATES, Hit, keyword_search
from fallback.search.keyword import search_plan
from fallback.search.snippets import MARK_CLOSE, MARK_OPEN
from fallback.store.fts_rows import insert_chunk_fts, note_title
from fallback.store.migrations import in_memory_store
from fallback.store.readonly import MetaReads
from fallback.text.chunking import chunk_markdown

__all__ = ["MAX_FOCUS_CHARS", "MAX_POOL_CHARS", "Note", "Ranking", "rank_passages"]

log = logging.getLogger("qmdbridge.qmd.backend")

# A note longer than this (code points, its lines joined by \n) is not ranked: it keeps qmd's
# lines (what cutting and indexing costs: docs/benchmarks.md, "Costs behind constants").
MAX_FOCUS_CHARS = 200_000
# Notes are pooled in qmd's order while they fit in this many characters; a note that does not
# fit keeps qmd's lines.
MAX_POOL_CHARS = 600_000
# The builtin index's tokenizer (``store.fts.tokenizer`` default), so a word matches the forms
# the builtin engine would match (``painting`` -> ``paint``).
_TOKENIZER = "unicode61"


@dataclass(frozen=True)
class Note:
    """One note qmd found, as the ranking reads it.

    Attributes:
        path: the path shown for its hits (``memory/2023-05-08.md``, ``qmd/notes/a.md``); its
            words and dates are searched as the builtin index searches a note's path.
        source: ``memory`` or ``sessions`` (transcripts are held to half of the slots).
        lines: the note's lines as ``memory_get`` numbers them (line ``i`` is
            ``lines[i - 1]``), without line ends.
    """

    path: str
    source: Source
    lines: Sequence[str]


class _NoteStore(MetaReads):
    """A throw-away in-memory SQLite with the builtin store's schema
    (``fallback/store/migrations.py``) holding a few notes' chunks, read by the builtin keyword
    search as it reads a store."""

    def __init__(self) -> None:
        self.conn = in_memory_store(fts_tokenizer=_TOKENIZER)

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Rows of one statement. Raises ``IndexStoreError`` (the SQLite error as its cause)."""
        try:
            return self.conn.execute(sql, params).fetchall()
        except sqlite3.Error as exc:
            raise IndexStoreError(f"passage ranking: {exc}") from exc

    def add(self, key: str, note: Note, text: str, *, tokens: int, overlap: int,
            sections: bool) -> int:
        """Cut ``text`` (the note's lines joined by ``\\n``) into the builtin index's chunks and
        index them under ``key``; returns how many chunks were written."""
        written: list[tuple[int, str]] = []
        for n, chunk in enumerate(chunk_markdown(text, tokens=tokens, overlap=overlap,
                                                 sections=sections)):
            cur = self.conn.execute(
                "INSERT INTO chunks(id, path, source, start_line, end_line, hash, model, text,"
                " updated_at) VALUES (?, ?, ?, ?, ?, ?, '', ?, 0)",
                (f"{key}:{n}", key, note.source, chunk.start_line, chunk.end_line,
                 chunk.content_hash, chunk.text))
            if cur.lastrowid is not None:
                written.append((cur.lastrowid, chunk.text))
        insert_chunk_fts(self.conn, written, title=note_title(note.path, text), fill_trigram=True)
        return len(written)

    def close(self) -> None:
        self.conn.close()


def _note_text(lines: Sequence[str]) -> str:
    """The lines joined by ``\\n``, without NUL bytes (FTS5 reads a NUL as the end of the text,
    which would hide the lines after it; the builtin index drops them too) and without the
    snippet markers (which would read as matches). Line numbers are unchanged."""
    text = "\n".join(lines)
    for control in (MARK_OPEN, MARK_CLOSE, "\x00"):
        text = text.replace(control, "")
    return text


@dataclass(frozen=True)
class Ranking:
    """What :func:`rank_passages` found.

    Attributes:
        passages: at most ``limit`` passages as hits, best first, each with its note's path
            and source: the chunk's lines, the builtin keyword score in ``[0, 1]``
            (``sqrt(BM25 / best BM25)``), the snippet (whole lines of the chunk within the
            snippet budget) and its lines.
        matched: the indexes of the notes the question's plan matched (a note not among them
            keeps qmd's lines).
        pooled: the indexes of the notes cut and ranked, matched or not (a pooled note the plan
            did not match holds none of the question's words as the builtin engine reads them).
    """

    passages: list[Hit]
    matched: set[int]
    pooled: set[int]


def rank_passages(question: str, notes: Sequence[Note], *, tokens: int, overlap: int,
                  sections: bool, snippet_chars: int, limit: int) -> Ranking:
    """The passages of ``notes`` that best answer ``question`` (module docstring).

    Args:
        question: the query as the agent wrote it (the builtin keyword plan drops stop words).
        notes: the notes qmd found, in qmd's order.
        tokens / overlap / sections: the agent's ``chunking`` (chunk budget and overlap in
            tokens of 4 chars; start a chunk at every Markdown heading).
        snippet_chars: the snippet budget in code points (``limits.maxSnippetChars``), ``> 0``.
        limit: passages wanted (``>= 1``).

    Returns:
        The :class:`Ranking`; all empty when the question has nothing to search or SQLite
        fails (logged).
    """
    store = _NoteStore()
    pooled: set[int] = set()
    try:
        size = 0
        for i, note in enumerate(notes):
            text = _note_text(note.lines)
            if not text.strip() or len(text) > MAX_FOCUS_CHARS or size + len(text) > MAX_POOL_CHARS:
                continue
            size += len(text)
            store.add(f"{i:05d}", note, text, tokens=tokens, overlap=overlap, sections=sections)
            pooled.add(i)
        plan = search_plan(store, question)
        if plan is None:
            return Ranking([], set(), set())
        found = keyword_search(store, question, sources=["memory", "sessions"],
                               limit=max(1, limit), candidates=MAX_CANDIDATES, floor=0.0,
                               half_life_days=None, now_ms=0,
                               max_snippet_chars=max(1, snippet_chars), plan=plan)
    except IndexStoreError as exc:
        log.info("qmd hits keep qmd's lines, the passage ranking failed: %s", exc)
        return Ranking([], set(), set())
    finally:
        store.close()
    passages = [replace(h, path=notes[int(h.path)].path, source=notes[int(h.path)].source)
                for h in found.hits]
    return Ranking(passages, {int(p) for p in found.ranked_paths}, pooled)
