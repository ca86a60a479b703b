"""Hybrid search end to end on real files: the floor runs on the calibrated score before temporal
decay, so decay reorders what matched and never empties the answer."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from fallback.embeddings import PROVIDERS, select_provider
from fallback.embeddings.base import BaseProvider, compute_provider_key
from fallback.engine.builtin import BuiltinEngine
from fallback.request import SearchRequest
from fallback.settings import EngineSettings, MemorySearchSettings

pytestmark = pytest.mark.anyio

NOW_MS = int(dt.datetime(2026, 6, 15, tzinfo=dt.timezone.utc).timestamp() * 1000)


class TermProvider(BaseProvider):
    """Vector = counts of a few terms (case-folded substrings; "wi-fi" counts as "wifi")."""

    provider_id = "test-terms"
    TERMS = ("guest", "wifi", "password", "lunch")

    def __init__(self) -> None:
        super().__init__(model="terms-v1", provider_key=compute_provider_key("test-terms", "terms-v1"),
                         max_input_tokens=8192)

    def vector(self, text: str) -> list[float]:
        low = text.lower().replace("wi-fi", "wifi")
        return [float(low.count(t)) for t in self.TERMS]

    async def _request_query(self, text: str) -> list[float]:
        return self.vector(text)

    async def _request_batch(self, texts: list[str]) -> list[list[float]]:
        return [self.vector(t) for t in texts]


def _engine(ws: Path, state: Path, **hybrid: object) -> BuiltinEngine:
    search = MemorySearchSettings.model_validate({"provider": "openai", "query": {"hybrid": hybrid}})
    provider = TermProvider()
    selection = select_provider(search, env={}, registry={**PROVIDERS, "openai": lambda s, *, env: provider})
    return BuiltinEngine(EngineSettings.for_workspace(ws, state_dir=state, search=search),
                         provider_selection=selection, now_ms=lambda: NOW_MS)


async def test_temporal_decay_keeps_an_old_note_that_matches_every_word(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / "memory").mkdir(parents=True)
    (ws / "memory" / "2026-01-10.md").write_text("# Home\nGuest Wi-Fi password: tulip-42\n")
    (ws / "memory" / "2026-01-12.md").write_text("# Home\nGuest Wi-Fi password rotated, now tulip-43\n")
    (ws / "memory" / "2026-06-14.md").write_text("# Today\nLunch with Sam at noon\n")
    engine = _engine(ws, tmp_path / "state", temporalDecay={"enabled": True, "halfLifeDays": 30})
    try:
        outcome = await engine.search(SearchRequest.of("guest wifi password", explain=True))  # minScore 0.35
    finally:
        await engine.close()
    # Five months old: decay leaves about 3 % of the score, under minScore, and the notes stay;
    # the newer one first. The unrelated note of yesterday never passed the floor.
    assert [r.path for r in outcome.results] == ["memory/2026-01-12.md", "memory/2026-01-10.md"]
    for r, age in zip(outcome.results, (154.0, 156.0), strict=True):
        e = r.explain
        assert e and e.fusion and e.decay and e.decay.age_days == age
        # cosines 1, 1 and 0 over the three chunks: z = 0.707 of the sqrt(2) three values allow
        assert e.fusion.vector_evidence == pytest.approx(0.5) and e.fusion.score >= 0.35
        assert r.score == pytest.approx(e.fusion.score * 0.5 ** (age / 30)) and r.score < 0.05
        assert e.floor.reason == f"calibrated score {e.fusion.score:.4f} >= minScore 0.35"


async def test_hybrid_search_keeps_a_note_beside_a_verbose_transcript(tmp_path: Path) -> None:
    import orjson

    ws = tmp_path / "ws"
    (ws / "memory").mkdir(parents=True)
    (ws / "MEMORY.md").write_text("# Home\nGuest Wi-Fi password: tulip-42\n")
    search = MemorySearchSettings.model_validate({
        "provider": "openai", "sources": ["memory", "sessions"],
        "experimental": {"sessionMemory": True}})
    provider = TermProvider()
    selection = select_provider(search, env={},
                                registry={**PROVIDERS, "openai": lambda s, *, env: provider})
    engine = BuiltinEngine(EngineSettings.for_workspace(ws, state_dir=tmp_path / "state",
                                                        search=search),
                           provider_selection=selection, now_ms=lambda: NOW_MS)
    lines = []
    for i in range(120):  # one topic, nearly the same words, 60 chunks
        lines.append(orjson.dumps({"type": "message", "message": {"role": "user", "content": (
            f"What was the guest wifi password again, attempt {i}? "
            + "I keep asking about the guest wifi password. " * 6)}}))
        lines.append(orjson.dumps({"type": "message", "message": {"role": "assistant", "content": (
            "The guest wifi password question again: it is in your notes. " * 5)}}))
    sessions = engine.settings.sessions_dir
    sessions.mkdir(parents=True)
    (sessions / "chatty.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    try:
        await engine.sync(reason="test")
        outcome = await engine.search(SearchRequest.of("guest wifi password", explain=True))
    finally:
        await engine.close()
    hits = outcome.results
    assert all(h.explain is not None and h.explain.mode == "hybrid" for h in hits)
    assert sorted((h.path, h.source) for h in hits) == [
        ("MEMORY.md", "memory"), ("sessions/chatty.jsonl", "sessions")]
