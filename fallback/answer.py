"""The JSON document of a search answer, built by one pair of functions for every route
(``SearchResponse.to_json_dict()`` and the one-shot CLI search, which loads no pydantic)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["answer_doc", "hit_doc"]


def hit_doc(*, path: str, start_line: int, end_line: int, score: float, snippet: str,
            snippet_start_line: int, snippet_end_line: int, source: str, citation: str | None,
            vector_score: float | None = None, text_score: float | None = None,
            explain: dict[str, Any] | None = None) -> dict[str, Any]:
    """One hit of an answer: camelCase keys, every key present (``null`` when unset); the
    fields are those of :class:`fallback.models.MemorySearchResult`."""
    return {"path": path, "startLine": start_line, "endLine": end_line, "score": score,
            "snippet": snippet, "snippetStartLine": snippet_start_line,
            "snippetEndLine": snippet_end_line, "source": source, "citation": citation,
            "vectorScore": vector_score, "textScore": text_score, "explain": explain}


def answer_doc(*, backend: str, results: Sequence[dict[str, Any]],
               fallback: dict[str, Any] | None = None, provider: str | None = None,
               model: str | None = None, mode: str | None = None, citations: str = "auto",
               denied: dict[str, Any] | None = None,
               warnings: Sequence[str] = (), corpus: str = "all") -> dict[str, Any]:
    """A search answer: camelCase keys, every key present; the fields are those of
    :class:`fallback.models.SearchResponse`, ``results`` as :func:`hit_doc` dicts."""
    return {"backend": backend, "fallback": fallback, "provider": provider, "model": model,
            "mode": mode, "citations": citations, "results": list(results), "denied": denied,
            "warnings": list(warnings), "corpus": corpus}
