"""The store seam: what the ranking pipeline and the sync need from a store, in their terms.

Both stores implement :class:`SearchStore` (SQLite: ``readonly.MetaReads``; postgres:
``postgres/seam.py``), so ranking never knows which store it runs on; SQL stays in the stores.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

__all__ = ["COLUMN_WEIGHTS", "KeywordRow", "SearchStore", "row_order"]

# bm25() weight of each indexed column (text, title, terms; fallback/store/fts_rows.py), on both
# stores: a query word found in a note's path or first heading counts twice as much as in its text.
COLUMN_WEIGHTS = (1.0, 2.0, 1.0)

KeywordRow = tuple[str, str, str, int, int, str, float]
"""``(chunk_id, path, source, start_line, end_line, text, rank)``: ``rank`` is FTS5's
``bm25()`` (more negative = better; ``0.0`` for a row without one: a LIKE-only match, a chunk
read by id) or, for the postgres store's vector rows, the cosine distance (smaller = closer)."""


def row_order(rank: float, path: str, start_line: int) -> tuple[float, str, int]:
    """The sort key of keyword rows on both stores, best first: ``rank`` ascending (see
    :data:`KeywordRow`), then ``path`` in code point order (SQLite's ``BINARY`` collation), then
    ``start_line`` (1-based)."""
    return rank, path, start_line


class SearchStore(Protocol):
    """The reads of one search (blocking); every method raises ``IndexStoreError`` (or a
    subclass) when the store cannot be read."""

    @property
    def fts_tokenizer(self) -> str:
        """The main full-text index's tokenizer (``unicode61`` or ``trigram``)."""
        ...

    @property
    def fts_error(self) -> str | None:
        """Why the store has no full-text index, or ``None`` when it has one."""
        ...

    def get_meta_json(self, key: str) -> object:
        """An index ``meta`` value parsed as JSON, or ``None`` (missing, unparsable, no meta)."""
        ...

    def has_chunks(self) -> bool:
        """Whether the index holds at least one chunk."""
        ...

    def part_counts(self, exprs: Sequence[str]) -> tuple[int, list[int]]:
        """``(chunks, [chunks matching each MATCH expression])`` over every source."""
        ...

    def keyword_rows(self, match: str | None, *, sources: Sequence[str], limit: int,
                     trigram_match: str | None = None,
                     like_patterns: Sequence[str] = (),
                     fallback_like_patterns: Sequence[str] = ()) -> list[KeywordRow]:
        """The best ``limit`` rows of one keyword plan (``match``, ``trigram_match`` and
        ``like_patterns``, ANDed) of ``sources``, by rank, path, start line; when ``match`` is
        refused, the rows matching every ``fallback_like_patterns`` (rank 0)."""
        ...

    def substring_rows(self, like_patterns: Sequence[str], *,
                       sources: Sequence[str]) -> list[KeywordRow]:
        """Every chunk of ``sources`` whose text matches all escaped ``%tok%`` patterns (rank 0)."""
        ...

    def chunk_rows(self, chunk_ids: Sequence[str]) -> list[KeywordRow]:
        """The chunks with these ids (rank ``0.0``); ids no longer indexed are left out."""
        ...

    def file_mtimes(self, paths: Sequence[str]) -> dict[tuple[str, str], int]:
        """``{(source, path): mtime in epoch ms}`` of the indexed files among ``paths``."""
        ...

    def highlights(self, mark_match: str, texts: Mapping[str, str], *, open_mark: str,
                   close_mark: str) -> dict[str, str]:
        """``{chunk_id: text}`` of the hits (``texts``: ``{chunk_id: chunk text}``) that match
        ``mark_match``, each matching token wrapped in ``open_mark`` / ``close_mark``."""
        ...

