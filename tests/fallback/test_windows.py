"""Chunk vectors as windows: which texts are embedded, how they are stored and cached, and that a
chunk is found by its best window. The embedding provider is a deterministic word counter built
on the real ``BaseProvider`` and created through the real registry (``select_provider``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fallback.embeddings import PROVIDERS, select_provider
from fallback.embeddings.base import BaseProvider, compute_provider_key
from fallback.engine.builtin import BuiltinEngine
from fallback.errors import EmbeddingProviderError
from fallback.index.indexer import full_reindex_reason, index_identity
from fallback.index.windows import EMBED_WINDOW_OVERLAP, EMBED_WINDOW_TOKENS, chunk_windows, pack_windows
from fallback.request import SearchRequest
from fallback.settings import EngineSettings, MemorySearchSettings
from fallback.store.db import META_KEY, Store
from fallback.text.chunking import Chunk
from fallback.text.scripts import sha256_hex

pytestmark = pytest.mark.anyio

VOCAB = ("alpha", "beta", "gamma")


class WordCountProvider(BaseProvider):
    """Vector = counts of "alpha", "beta", "gamma" (whole words, case-folded)."""

    provider_id = "test-words"

    def __init__(self) -> None:
        super().__init__(model="words-v1", provider_key=compute_provider_key("test-words", "words-v1"),
                         max_input_tokens=8192)
        self.batches: list[list[str]] = []
        self.down = False

    @staticmethod
    def vector(text: str) -> list[float]:
        words = text.lower().split()
        return [float(words.count(w)) for w in VOCAB]

    async def _request_query(self, text: str) -> list[float]:
        return self.vector(text)

    async def _request_batch(self, texts: list[str]) -> list[list[float]]:
        if self.down:
            raise EmbeddingProviderError(self.provider_id, "provider is down")
        self.batches.append(list(texts))
        return [self.vector(t) for t in texts]


def _line(n: int, words: str) -> str:
    """A 120-character line: its number, the given words, then filler the provider ignores."""
    head = f"L{n:02d} {words} "
    return head + "x" * (119 - len(head))


def _notes() -> str:
    lines = [_line(1, "filler"), _line(2, "alpha beta"), *(_line(n, "filler") for n in range(3, 7)),
             *(_line(n, "gamma gamma gamma") for n in range(7, 13))]
    return "\n".join(lines) + "\n"


def test_windows_are_whole_lines_with_overlap():
    text = _notes().rstrip("\n")
    windows = chunk_windows(Chunk(text=text, start_line=1, end_line=12, content_hash=sha256_hex(text)),
                            max_input_tokens=8192)
    # 192 tokens = 768 chars: six 121-char lines; the next window repeats 3 lines (96 tokens)
    assert (EMBED_WINDOW_TOKENS, EMBED_WINDOW_OVERLAP) == (192, 96)
    assert [(w.start_line, w.end_line) for w in windows] == [(1, 6), (4, 9), (7, 12)]
    lines = text.split("\n")
    assert [w.text for w in windows] == ["\n".join(lines[a - 1:b]) for a, b in [(1, 6), (4, 9), (7, 12)]]
    assert all(w.content_hash == sha256_hex(w.text) for w in windows)
    # a short chunk is one window; the provider's input limit cuts a window into byte pieces
    short = Chunk(text="alpha", start_line=3, end_line=3, content_hash=sha256_hex("alpha"))
    assert [w.text for w in chunk_windows(short, max_input_tokens=8192)] == ["alpha"]
    assert [w.text for w in chunk_windows(short, max_input_tokens=2)] == ["alph", "a"]


def test_pack_windows():
    blob, dims = pack_windows([[1.0, 2.0], [], [3.0, 4.0], [5.0]]) or (b"", 0)
    assert dims == 2 and np.frombuffer(blob, dtype="<f4").tolist() == [1.0, 2.0, 3.0, 4.0]
    assert pack_windows([[], []]) is None


def test_window_settings_are_part_of_the_identity(tmp_path: Path):
    settings = EngineSettings.for_workspace(tmp_path, search=MemorySearchSettings(provider="openai"))
    identity = index_identity(settings, WordCountProvider())
    assert identity["embedWindows"] == {"tokens": 192, "overlap": 96}
    assert full_reindex_reason(identity, identity) is None
    whole_chunks = {k: v for k, v in identity.items() if k != "embedWindows"}  # an older index
    assert full_reindex_reason(whole_chunks, identity) == "embedding windows changed"
    keyword_only = index_identity(settings, None)
    assert keyword_only["embedWindows"] is None
    assert full_reindex_reason({k: v for k, v in keyword_only.items() if k != "embedWindows"},
                               keyword_only) is None


async def test_a_chunk_is_found_by_its_best_window(tmp_path: Path):
    ws = tmp_path / "ws"
    (ws / "memory").mkdir(parents=True)
    (ws / "memory" / "2026-03-01.md").write_text(_notes())
    (ws / "memory" / "2026-03-02.md").write_text("alpha gamma\n")
    provider = WordCountProvider()
    search = MemorySearchSettings.model_validate({"provider": "openai", "query": {"minScore": 0.0}})
    selection = select_provider(search, env={}, registry={**PROVIDERS, "openai": lambda s, *, env: provider})
    assert selection.provider is provider
    engine = BuiltinEngine(EngineSettings.for_workspace(ws, state_dir=tmp_path / "state", search=search),
                           provider_selection=selection)
    try:
        hits = (await engine.search(SearchRequest.of("alpha beta"))).results
        store = Store(engine.settings.db_path)
        try:
            rows = store.query("SELECT path, start_line, end_line, text, vector, dims FROM chunks ORDER BY path")
            cached = {r[0] for r in store.query("SELECT hash FROM embedding_cache")}
            meta = store.get_meta_json(META_KEY)
        finally:
            store.close()
    finally:
        await engine.close()
    # The whole notes file is one chunk of three windows. Its whole-text vector (1, 1, 18)
    # would have cosine 0.08 with the query; its first window (1, 1, 0) has cosine 1, so it
    # ranks above the short note (1, 0, 1), cosine 0.5.
    assert [(h.path, h.start_line, h.end_line) for h in hits] == [("memory/2026-03-01.md", 1, 12),
                                                                  ("memory/2026-03-02.md", 1, 1)]
    assert [h.vector_score for h in hits] == pytest.approx([1.0, 0.5])
    notes, short = rows
    windows = np.frombuffer(notes[4], dtype="<f4").reshape(-1, 3).tolist()
    assert notes[5] == 3 and windows == [[1.0, 1.0, 0.0], [0.0, 0.0, 9.0], [0.0, 0.0, 18.0]]
    assert np.frombuffer(short[4], dtype="<f4").tolist() == [1.0, 0.0, 1.0] and short[5] == 3
    # each distinct window text is embedded once and cached under its own hash
    lines = notes[3].split("\n")
    texts = ["\n".join(lines[a:b]) for a, b in [(0, 6), (3, 9), (6, 12)]] + ["alpha gamma"]
    assert sorted(t for batch in provider.batches for t in batch) == sorted(texts)
    assert cached == {sha256_hex(t) for t in texts}
    assert meta["embedWindows"] == {"tokens": 192, "overlap": 96} and meta["vectorDims"] == 3


async def test_a_chunk_left_without_vectors_gets_all_its_windows_later(tmp_path: Path):
    ws = tmp_path / "ws"
    (ws / "memory").mkdir(parents=True)
    (ws / "memory" / "2026-03-01.md").write_text(_notes())
    provider = WordCountProvider()
    provider.down = True
    search = MemorySearchSettings.model_validate({"provider": "openai"})
    selection = select_provider(search, env={}, registry={**PROVIDERS, "openai": lambda s, *, env: provider})
    engine = BuiltinEngine(EngineSettings.for_workspace(ws, state_dir=tmp_path / "state", search=search),
                           provider_selection=selection)
    try:
        first = await engine.sync(reason="test")
        assert (first.chunks_written, first.chunks_pending) == (1, 1)
        provider.down = False
        second = await engine.sync(reason="test")
        # one chunk, embedded as three windows: progress counts the chunk, the provider saw three
        assert (second.chunks_filled, second.chunks_pending, second.windows_embedded) == (1, 0, 3)
        assert second.chunks_embedded == 1
        store = Store(engine.settings.db_path)
        try:
            [(blob, dims)] = store.query("SELECT vector, dims FROM chunks")
        finally:
            store.close()
    finally:
        await engine.close()
    assert dims == 3
    assert np.frombuffer(blob, dtype="<f4").reshape(-1, 3).tolist() == [
        [1.0, 1.0, 0.0], [0.0, 0.0, 9.0], [0.0, 0.0, 18.0]]
