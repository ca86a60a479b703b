"""The passages of lexical qmd hits, ranked across the notes qmd found.

The notes are cut into the builtin index's chunks in a throw-away in-memory store and ranked
there by the builtin keyword search; a note it does not match, or one too large for the pool,
keeps qmd's lines. Why: docs/qmd.md, "Questions in ``search`` mode".

Source: passage retrieval inside retrieved documents (Salton, Allan & Buckley, SIGIR 1993;
Callan, SIGIR 1994), with the builtin keyword ranking as the passage ranker.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
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

# A note longer than this (code points) is not ranked: it keeps qmd's lines.
MAX_FOCUS_CHARS = 200_000
# Notes are pooled in qmd's order while they fit in this many characters.
MAX_POOL_CHARS = 600_000
# The builtin index's default tokenizer, so a word matches as the builtin engine matches it.
_TOKENIZER = "unicode61"


@dataclass(frozen=True)
class Note:
    """One note qmd found: ``path`` (shown for its hits, searched as the builtin index searches a
    path), ``source``, and ``lines`` as ``memory_get`` numbers them, without line ends."""

    path: str
    source: Source
    lines: Sequence[str]


class _NoteStore(MetaReads):
    """A throw-away in-memory store with the builtin schema holding a few notes' chunks."""

    def __init__(self) -> None:
        self.conn = in_memory_store(fts_tokenizer=_TOKENIZER)

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Rows of one statement (``IndexStoreError`` when SQLite fails)."""
        try:
            return self.conn.execute(sql, params).fetchall()
        except sqlite3.Error as exc:
            raise IndexStoreError(f"passage ranking: {exc}") from exc

    def add(self, key: str, note: Note, text: str, *, tokens: int, overlap: int,
            sections: bool) -> int:
        """Index ``text``'s builtin chunks under ``key``; returns how many were written."""
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
    """The lines joined by ``\\n`` without NUL bytes and snippet markers (line numbers unchanged)."""
    text = "\n".join(lines)
    for control in (MARK_OPEN, MARK_CLOSE, "\x00"):
        text = text.replace(control, "")
    return text


@dataclass(frozen=True)
class Ranking:
    """What :func:`rank_passages` found.

    Attributes:
        passages: at most ``limit`` hits, best first, score ``sqrt(BM25 / best BM25)`` in ``[0, 1]``.
        matched: indexes of the notes the question's plan matched.
        pooled: indexes of the notes cut and ranked, matched or not.
    """

    passages: list[Hit]
    matched: set[int]
    pooled: set[int]


def rank_passages(question: str, notes: Sequence[Note], *, tokens: int, overlap: int,
                  sections: bool, snippet_chars: int, limit: int) -> Ranking:
    """The passages of ``notes`` (qmd's order) that best answer ``question`` as written, cut by
    the agent's ``chunking`` (``tokens``/``overlap``/``sections``); snippets of ``snippet_chars``
    code points (> 0), ``limit`` passages (>= 1). Empty when the question has nothing to search
    or SQLite fails."""
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
    passages = [h._replace(path=notes[int(h.path)].path, source=notes[int(h.path)].source)
                for h in found.hits]
    return Ranking(passages, {int(p) for p in found.ranked_paths}, pooled)
