"""Hits whose lines better hits mostly show already are dropped (fallback/search/ranking.py
``drop_covered``), in the pure function and through a keyword-only search of a real store."""

from __future__ import annotations

from pathlib import Path

import pytest

from fallback.embeddings import ProviderSelection
from fallback.engine.builtin import BuiltinEngine
from fallback.request import SearchRequest
from fallback.search.ranking import Candidate, drop_covered
from fallback.settings import EngineSettings, MemorySearchSettings


def cand(chunk_id: str, start: int, end: int, path: str = "memory/a.md",
         source: str = "memory") -> Candidate:
    return Candidate(chunk_id=chunk_id, path=path, source=source, start_line=start,
                     end_line=end, snippet="", score=1.0)


def ids(cands: list[Candidate]) -> list[str]:
    return [c.chunk_id for c in cands]


def test_tail_chunk_inside_a_better_hit_is_dropped() -> None:
    # 14-18 shares 14, 15, 16 (3 of its 5 lines) with 1-16.
    assert ids(drop_covered([cand("full", 1, 16), cand("tail", 14, 18), cand("b", 3, 9, "memory/b.md")])) == [
        "full", "b"]


def test_neighbour_chunks_sharing_only_the_overlap_are_kept() -> None:
    # 14-29 shares 3 of its 16 lines with 1-16.
    assert ids(drop_covered([cand("one", 1, 16), cand("two", 14, 29)])) == ["one", "two"]


def test_long_chunk_after_a_short_one_inside_it_is_kept() -> None:
    # The better hit is the short tail: the long chunk still shows 13 new lines of 16.
    assert ids(drop_covered([cand("tail", 14, 18), cand("full", 1, 16)])) == ["tail", "full"]


def test_lines_shown_by_several_better_hits_add_up() -> None:
    # 8-12 has 5 lines: 8 and 9 in the first hit, 11 and 12 in the second: 4 of 5 are shown.
    assert ids(drop_covered([cand("x", 1, 9), cand("y", 11, 20), cand("z", 8, 12)])) == ["x", "y"]


def test_exactly_half_is_kept_and_other_files_and_sources_do_not_count() -> None:
    assert ids(drop_covered([cand("x", 1, 4), cand("half", 3, 6)])) == ["x", "half"]
    assert ids(drop_covered([cand("x", 1, 10), cand("other", 1, 10, "memory/b.md"),
                             cand("session", 1, 10, source="sessions")])) == ["x", "other", "session"]
    assert drop_covered([]) == []


@pytest.mark.anyio
async def test_keyword_search_shows_the_tail_chunk_lines_once(tmp_path: Path) -> None:
    # 18 lines of ~100 characters: the first 400-token chunk holds lines 1-16, the last one
    # lines 14-18 (its first three lines are the overlap). "lighthouse" is on lines 2, 4, 6, 8
    # and 15: the first chunk ranks first, and the tail chunk would show its line 15 again.
    lines = [f"Ann: line {i:02d} is small talk about the weather, the traffic, lunch and the long"
             f" afternoon meeting." for i in range(1, 19)]
    for i in (1, 3, 5, 7, 14):
        lines[i] = lines[i].replace("small talk", "the lighthouse")
    (tmp_path / "memory").mkdir()
    (tmp_path / "memory/2023-05-08.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (tmp_path / "memory/2023-05-09.md").write_text("Bob: we painted the lighthouse red.\n",
                                                    encoding="utf-8")
    engine = BuiltinEngine(EngineSettings.for_workspace(tmp_path, search=MemorySearchSettings(
        provider="none")), provider_selection=ProviderSelection(None, "none"))
    try:
        hits = (await engine.search(SearchRequest.of("lighthouse", max_results=5, min_score=0.0))).results
        chunks = (await engine._stores.open()).query(
            "SELECT start_line, end_line FROM chunks WHERE path = 'memory/2023-05-08.md'"
            " ORDER BY start_line")
    finally:
        await engine.close()
    assert [tuple(r) for r in chunks] == [(1, 16), (14, 18)]
    # Without the rule the tail chunk (14-18) would be a third hit.
    assert [(h.path, h.start_line, h.end_line) for h in hits] == [
        ("memory/2023-05-09.md", 1, 1), ("memory/2023-05-08.md", 1, 16)]
