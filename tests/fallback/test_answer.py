"""The one builder of a search answer's JSON (fallback/answer.py): the models' to_json_dict() is
built by it and still equals the models' own dump, every key present."""

from __future__ import annotations

from fallback.models import (
    ExplainFloor,
    ExplainKeyword,
    FallbackInfo,
     HitExplain,
    MemorySearchResult,
    ScopeDecision,
    SearchResponse,
)


def test_the_builder_gives_the_models_dump_key_for_key() -> None:
    hit = MemorySearchResult(path="memory/a.md", start_line=3, end_line=9, score=0.5, snippet="x",
                             snippet_start_line=4, snippet_end_line=5, source="sessions",
                             citation="memory/a.md#L4-L5", vector_score=0.25, text_score=0.75,
                             explain=HitExplain(mode="fts-only", keyword=ExplainKeyword(rank=1, bm25=-2.0,
                                                                                       text_score=1.0),
                                                floor=ExplainFloor(min_score=0.35, relaxed_floor=None, kept=True,
                                                                   reason="above"), rank=1))
    bare = MemorySearchResult(path="MEMORY.md", start_line=1, end_line=2, score=1.0, snippet="y")
    full = SearchResponse(backend="builtin", fallback=FallbackInfo(from_backend="qmd", reason="down"),
                          provider="none", model=None, mode="fts-only", citations="on",
                          results=[hit, bare], denied=ScopeDecision(allowed=False, reason="deny rule"),
                          warnings=["w"])
    for response in (full, SearchResponse(backend="none")):
        doc = response.to_json_dict()
        assert doc == response.model_dump(by_alias=True, mode="json")
        assert list(doc) == ["backend", "fallback", "provider", "model", "mode", "citations", "results",
                             "denied", "warnings", "corpus"]
    assert list(full.to_json_dict()["results"][1]) == [
        "path", "startLine", "endLine", "score", "snippet", "snippetStartLine", "snippetEndLine", "source",
        "citation", "vectorScore", "textScore", "explain"]
    assert full.to_json_dict()["results"][1]["snippetStartLine"] == 1
