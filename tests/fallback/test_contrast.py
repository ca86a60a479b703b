"""The query's common terms (fallback/search/contrast.py): which words count as common in a real
store, and the contrasted query vector; then hybrid search end to end, where the contrast lets
a chunk about what the question asks beat chunks that only repeat a name."""

from __future__ import annotations

import math
import sqlite3
from pathlib import Path

import pytest

from fallback.embeddings import PROVIDERS, select_provider
from fallback.embeddings.base import BaseProvider, compute_provider_key
from fallback.engine.builtin import BuiltinEngine
from fallback.request import SearchRequest
from fallback.search.contrast import (
    COMMON_MIN_CHUNKS,
    MAX_COUNTED_WORDS,
    common_words,
    content_words,
    contrast_vector,
)
from fallback.settings import EngineSettings, MemorySearchSettings
from fallback.store.db import Store
from fallback.store.fts_rows import insert_chunk_fts, note_title


def _fill(store: Store, texts: list[str]) -> None:
    with store.transaction() as conn:
        for i, text in enumerate(texts, start=1):
            path = f"memory/2026-01-{i:02d}.md"
            conn.execute("INSERT INTO chunks(rowid, id, path, source, start_line, end_line, hash, model,"
                         " text, embedding, updated_at) VALUES (?, ?, ?, 'memory', 1, 1, 'h', 'fts-only',"
                         " ?, '[]', 0)", (i, f"c{i}", path, text))
            insert_chunk_fts(conn, [(i, text)], title=note_title(path, text), fill_trigram=False)


def _chat(n_named: int, n_other: int) -> list[str]:
    """``n_named`` chunks that say "Melanie" (and "paints" in every second one), ``n_other``
    that do not."""
    named = [f"Melanie: day {i}, {'paints again' if i % 2 else 'a walk'}" for i in range(n_named)]
    return named + [f"Caroline: note {i} about the garden" for i in range(n_other)]


def test_content_words_drop_stop_words_single_characters_and_cjk() -> None:
    assert content_words("What books has Melanie's kid read? Melanie, books!") == [
        "books", "melanie", "kid", "read"]  # "s" and repeats left out, query order kept
    assert content_words("What is it?") == []
    assert content_words("東京 trip planning") == ["trip", "planning"]
    many = " ".join(f"word{i}" for i in range(MAX_COUNTED_WORDS + 3))
    assert content_words(many) == [f"word{i}" for i in range(MAX_COUNTED_WORDS)]


def test_a_word_in_half_of_the_chunks_is_common(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.sqlite")
    try:
        _fill(store, _chat(10, 10))  # Melanie in 10 of 20 chunks, "paints" in 5
        assert common_words(store, "What paints has Melanie sold?") == ["melanie"]
        assert common_words(store, "MELANIE") == ["melanie"]
        assert common_words(store, "garden party") == ["garden"]  # 10 of 20: Caroline's chunks
        assert common_words(store, "tulips") == []
    finally:
        store.close()


def test_fewer_than_half_or_than_the_minimum_is_not_common(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.sqlite")
    try:
        _fill(store, _chat(9, 11))  # 9 of 20: under half
        assert common_words(store, "Melanie") == []
    finally:
        store.close()
    small = Store(tmp_path / "small.sqlite")
    try:
        _fill(small, _chat(COMMON_MIN_CHUNKS - 1, 0))  # in every chunk, but only 9 chunks
        assert common_words(small, "Melanie") == []
    finally:
        small.close()


def test_trigram_store_counts_only_words_it_can_match(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.sqlite", fts_tokenizer="trigram")
    try:
        _fill(store, [f"Al and Melanie, chunk {i}" for i in range(12)])
        assert common_words(store, "Al Melanie") == ["melanie"]
    finally:
        store.close()


def test_a_store_without_fts5_has_no_common_words(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.sqlite")
    _fill(store, _chat(12, 0))
    store.close()
    with sqlite3.connect(tmp_path / "s.sqlite") as conn:  # as a SQLite without FTS5 leaves it
        conn.execute("DROP TABLE chunks_fts")
        conn.execute("DROP TABLE chunks_trigram")
        conn.execute("INSERT OR REPLACE INTO meta(key, value) VALUES ('fts_error', 'no such module: fts5')")
    store = Store(tmp_path / "s.sqlite")
    try:
        assert store.fts_error == "no such module: fts5"
        assert common_words(store, "Melanie") == []
    finally:
        store.close()


def test_contrast_vector_removes_half_of_the_background_direction() -> None:
    out = contrast_vector([3.0, 4.0, 0.0], [0.0, 2.0, 0.0])
    assert out == pytest.approx([0.6, 0.3, 0.0])  # (0.6, 0.8, 0) - 0.5 x (0, 1, 0)
    assert contrast_vector([1.0, 1.0], [1.0, 0.0], weight=0.25) == pytest.approx(
        [1 / math.sqrt(2) - 0.25, 1 / math.sqrt(2)])
    # a query that is its own background keeps its direction (half its length)
    assert contrast_vector([2.0, 0.0], [5.0, 0.0]) == pytest.approx([0.5, 0.0])


def test_contrast_vector_leaves_unusable_input_alone() -> None:
    assert contrast_vector([1.0, 2.0], [0.0, 0.0]) == [1.0, 2.0]
    assert contrast_vector([1.0, 2.0], [1.0, 2.0, 3.0]) == [1.0, 2.0]
    assert contrast_vector([1.0, 2.0], [math.nan, 1.0]) == [1.0, 2.0]
    assert contrast_vector([0.0, 0.0], [1.0, 0.0]) == [0.0, 0.0]
    assert contrast_vector([1.0, 0.0], [1.0, 0.0], weight=1.0) == [1.0, 0.0]  # nothing would be left


class TermProvider(BaseProvider):
    """Vector = counts of three terms (case-folded substrings): a name, and two topics."""

    provider_id = "test-terms"
    TERMS = ("melanie", "book", "paint")

    def __init__(self) -> None:
        super().__init__(model="terms-v1", provider_key=compute_provider_key("test-terms", "terms-v1"),
                         max_input_tokens=8192)
        self.queries: list[str] = []

    def vector(self, text: str) -> list[float]:
        low = text.lower()
        return [float(low.count(t)) for t in self.TERMS]

    async def _request_query(self, text: str) -> list[float]:
        self.queries.append(text)
        return self.vector(text)

    async def _request_batch(self, texts: list[str]) -> list[list[float]]:
        return [self.vector(t) for t in texts]


def _workspace(root: Path, *, named_fillers: int) -> Path:
    ws = root / "ws"
    (ws / "memory").mkdir(parents=True)
    notes = {"2026-02-01.md": "Melanie: Hi Melanie! Melanie here.\n",  # the name, three times
             "2026-02-02.md": "Caroline: that book was great, painting too\n"}  # the topic
    for i in range(named_fillers):
        notes[f"2026-03-{i + 1:02d}.md"] = f"Melanie: off to paint, day {i}\n"
    for i in range(12 - named_fillers):
        notes[f"2026-04-{i + 1:02d}.md"] = f"Caroline: garden day {i}\n"
    for name, text in notes.items():
        (ws / "memory" / name).write_text(text)
    return ws


def _engine(ws: Path, state: Path, provider: TermProvider) -> BuiltinEngine:
    search = MemorySearchSettings.model_validate({"provider": "openai",
                                                  "query": {"hybrid": {"enabled": False}}})
    selection = select_provider(search, env={}, registry={**PROVIDERS, "openai": lambda s, *, env: provider})
    return BuiltinEngine(EngineSettings.for_workspace(ws, state_dir=state, search=search),
                         provider_selection=selection)


@pytest.mark.anyio
async def test_vector_search_contrasts_a_name_found_in_most_chunks(tmp_path: Path) -> None:
    provider = TermProvider()
    # Melanie in 11 of 14 chunks: common. Plain query (1, 1, 0): the name-only chunk (3, 0, 0)
    # has cosine 0.707, the book chunk (0, 1, 1) 0.5. Contrasted, q' = (0.207, 0.707, 0): 0.28
    # and 0.68, so the chunk about books comes first.
    engine = _engine(_workspace(tmp_path, named_fillers=10), tmp_path / "state", provider)
    try:
        first = await engine.search(SearchRequest.of("Melanie book", min_score=0.0, explain=True))
        again = await engine.search(SearchRequest.of("Melanie book", min_score=0.0))
    finally:
        await engine.close()
    assert first.results[0].path == "memory/2026-02-02.md"
    e = first.results[0].explain
    assert e and e.mode == "vector-only" and e.vector and e.vector.contrast == ["melanie"]
    r = 1 / math.sqrt(2)
    assert e.vector.cosine == pytest.approx(r / math.sqrt((r - 0.5) ** 2 + 0.5) / math.sqrt(2))  # 0.679
    assert [r.path for r in again.results] == [r.path for r in first.results]
    # the query is embedded once per search; its background once for both (the engine's cache)
    assert provider.queries == ["Melanie book", "melanie", "Melanie book"]


@pytest.mark.anyio
async def test_a_name_in_fewer_than_half_of_the_chunks_is_searched_as_it_is(tmp_path: Path) -> None:
    provider = TermProvider()
    # Melanie in 6 of 14 chunks: not common, the plain query vector ranks the name-only chunk first
    engine = _engine(_workspace(tmp_path, named_fillers=5), tmp_path / "state", provider)
    try:
        outcome = await engine.search(SearchRequest.of("Melanie book", min_score=0.0, explain=True))
    finally:
        await engine.close()
    assert outcome.results[0].path == "memory/2026-02-01.md"
    e = outcome.results[0].explain
    assert e and e.vector and e.vector.contrast == [] and e.vector.cosine == pytest.approx(1 / math.sqrt(2))
    assert provider.queries == ["Melanie book"]
