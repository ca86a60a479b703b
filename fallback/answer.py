"""The JSON document of a search answer, built by one pair of functions for every route.

``SearchResponse.to_json_dict()`` (``fallback/models.py``: the in-process CLI, the serve socket,
the MCP server and the daemon) and the one-shot read-only CLI search
(``qmdbridge/cli/fast_search.py``, which loads no pydantic) both build their ``--json``
document with :func:`answer_doc` and :func:`hit_doc`, so the keys, their order and their
defaults cannot differ by route. Standard library only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["answer_doc", "hit_doc"]


def hit_doc(*, path: str, start_line: int, end_line: int, score: float, snippet: str,
            snippet_start_line: int, snippet_end_line: int, source: str, citation: str | None,
            vector_score: float | None = None, text_score: float | None = None,
            explain: dict[str, Any] | None = None) -> dict[str, Any]:
    """One hit of an answer: camelCase keys, every key present (``null`` when unset).

    Args:
        path: the file's path as indexed.
        start_line / end_line: 1-based inclusive line range of the hit.
        score: relevance in ``[0, 1]``.
        snippet: the text shown (with the ``Source:`` footer when citations are shown).
        snippet_start_line / snippet_end_line: 1-based inclusive lines of the snippet.
        source: ``memory`` or ``sessions``.
        citation: ``path#La-Lb`` of the snippet's lines, or ``None``.
        vector_score / text_score: hybrid components, or ``None``.
        explain: the ranking trace as a JSON dict (``--explain``), or ``None``.
    """
    return {"path": path, "startLine": start_line, "endLine": end_line, "score": score,
            "snippet": snippet, "snippetStartLine": snippet_start_line,
            "snippetEndLine": snippet_end_line, "source": source, "citation": citation,
            "vectorScore": vector_score, "textScore": text_score, "explain": explain}


def answer_doc(*, backend: str, results: Sequence[dict[str, Any]],
               fallback: dict[str, Any] | None = None, provider: str | None = None,
               model: str | None = None, mode: str | None = None, citations: str = "auto",
               denied: dict[str, Any] | None = None,
               warnings: Sequence[str] = (), corpus: str = "all") -> dict[str, Any]:
    """A search answer: camelCase keys, every key present.

    Args:
        backend: the backend that answered (``builtin`` | ``qmd`` | ``none``).
        results: the hits as :func:`hit_doc` dicts, best first.
        fallback: ``{from, reason}`` when the configured backend could not answer, else ``None``.
        provider / model: the embedding provider and model (``none`` / ``None`` keyword-only).
        mode: the ranking that produced the hits (``fts-only``, ``hybrid`` ...), or ``None``.
        citations: the citations mode in effect (``auto`` | ``on`` | ``off``).
        denied: the scope decision when scope rules refused the search, else ``None``.
        warnings: non-fatal notes, one line each.
        corpus: the corpus searched (``memory`` | ``sessions`` | ``all`` | ``wiki``).
    """
    return {"backend": backend, "fallback": fallback, "provider": provider, "model": model,
            "mode": mode, "citations": citations, "results": list(results), "denied": denied,
            "warnings": list(warnings), "corpus": corpus}
