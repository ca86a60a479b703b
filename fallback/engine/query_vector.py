"""A search's query embedding under its deadline (:func:`embed_query_within`, then a
:class:`PreparedProvider` that never calls the provider past it), and the warnings of a
degraded answer.
"""

from __future__ import annotations

import logging
import math
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING

import anyio

from fallback.embeddings.base import EmbeddingProvider
from fallback.errors import (
    EmbeddingDimensionsError,
    EmbeddingProviderError,
    EmbeddingProviderUnavailableError,
    SearchUnavailableError,
)
from fallback.index.embedding_step import BACKLOG_KEY
from fallback.store.db import META_KEY
from fallback.text.counts import counted

if TYPE_CHECKING:
    from fallback.store.seam import SearchStore

__all__ = ["IndexVectors", "PreparedProvider", "QUERY_CACHE_ENTRIES", "QueryVector", "QueryVectorCache",
           "backlog_reason", "check_query_vector", "embed_query_within",
           "failure_text", "on_provider_failure", "read_index_vectors"]

log = logging.getLogger("fallback.engine.builtin")

# Query embeddings of other texts (contrast backgrounds) an engine keeps across searches.
QUERY_CACHE_ENTRIES = 256


@dataclass(frozen=True)
class QueryVector:
    """The query embedding of one search: ``vector`` (``[]`` when the provider returned none,
    ``None`` on failure) and why there is none (``error``), or ``None``."""

    vector: list[float] | None
    error: EmbeddingProviderError | None = None


def failure_text(exc: EmbeddingProviderError, *, query: bool) -> str:
    """How a provider failure is named in the answer: an unavailable provider by its reason, a
    failed call as ``query embedding failed: <error>`` (``query``) or the error itself."""
    if isinstance(exc, EmbeddingProviderUnavailableError):
        return exc.reason
    return f"query embedding failed: {exc}" if query else str(exc)


async def embed_query_within(provider: EmbeddingProvider | None, text: str, *,
                             timeout_ms: int) -> tuple[QueryVector | None, float]:
    """``(query vector, or None without a provider; deadline as anyio clock time)`` of
    ``text`` embedded within ``timeout_ms`` (``query.timeoutMs``) after the provider's
    ``ensure_model()`` (a local model downloaded first, no deadline); a provider reporting a
    changed vector size is asked once more. A provider failure is the vector's ``error`` (past
    the deadline: ``query embedding timed out ...``)."""
    if provider is None:
        return None, anyio.current_time() + timeout_ms / 1000
    try:
        await provider.ensure_model()
    except EmbeddingProviderError as exc:
        return QueryVector(None, exc), anyio.current_time() + timeout_ms / 1000
    deadline = anyio.current_time() + timeout_ms / 1000
    with anyio.move_on_at(deadline):
        try:
            try:
                return QueryVector(await provider.embed_query(text)), deadline
            except EmbeddingDimensionsError:
                return QueryVector(await provider.embed_query(text)), deadline
        except EmbeddingProviderError as exc:
            return QueryVector(None, exc), deadline
    return QueryVector(None, EmbeddingProviderError(
        provider.provider_id,
        f"query embedding timed out after {timeout_ms} ms (query.timeoutMs)")), deadline


class QueryVectorCache:
    """Query embeddings of texts other than the query (``fallback/search/contrast.py``), kept
    across searches, least recently used dropped first beyond ``max_entries`` (>= 1)."""

    def __init__(self, max_entries: int = QUERY_CACHE_ENTRIES) -> None:
        self._max = max(1, max_entries)
        self._vectors: OrderedDict[tuple[str, str, str], list[float]] = OrderedDict()

    def get(self, key: tuple[str, str, str]) -> list[float] | None:
        """The vector cached for ``(provider key, model, text)`` (marked used), or ``None``."""
        vector = self._vectors.get(key)
        if vector is not None:
            self._vectors.move_to_end(key)
        return vector

    def put(self, key: tuple[str, str, str], vector: list[float]) -> None:
        """Cache ``vector`` for ``key``; the least recently used entry goes beyond the bound."""
        self._vectors[key] = list(vector)
        self._vectors.move_to_end(key)
        while len(self._vectors) > self._max:
            self._vectors.popitem(last=False)


class PreparedProvider:
    """The ``provider`` as the ranking sees it during one search (its ``QueryEmbedder``): the
    ``query`` text (``None``: every text) gets the ``vector`` embedded beforehand (``[]``:
    keyword-only ranking); any other text is embedded before the anyio clock ``deadline``
    (``None``: none), through ``cache`` across searches."""

    def __init__(self, provider: EmbeddingProvider, vector: list[float], *,
                 query: str | None = None, deadline: float | None = None,
                 cache: QueryVectorCache | None = None) -> None:
        self._provider = provider
        self._vector = list(vector)
        self._query = query
        self._deadline = deadline
        self._cache = cache
        self.provider_id = provider.provider_id
        self.model = provider.model

    async def embed_query(self, text: str) -> list[float]:
        """The prepared vector (a copy) for the query; another ``text`` embedded as a query.

        Raises ``EmbeddingProviderError``: the provider failed, or the deadline passed.
        """
        if self._query is None or text == self._query:
            return list(self._vector)
        key = (self._provider.provider_key, self.model, text)
        cached = self._cache.get(key) if self._cache is not None else None
        if cached is not None:
            return list(cached)
        vector: list[float] | None = None
        with anyio.move_on_at(self._deadline if self._deadline is not None else math.inf):
            vector = await self._provider.embed_query(text)
        if vector is None:
            raise EmbeddingProviderError(self.provider_id,
                                         "query embedding timed out (query.timeoutMs)")
        if self._cache is not None and vector:
            self._cache.put(key, vector)
        return list(vector)


def backlog_reason(pending: int, error: str | None) -> str:
    """``status().dirty_reason`` while chunks wait for their vectors."""
    return f"{counted(pending, 'chunk', 'wait')} for embeddings" + (f" ({error})" if error else "")


def on_provider_failure(provider_id: str, error: str, *, fail_closed: bool,
                        warnings: list[str]) -> None:
    """A provider failure (``error``, one line) seen by a search: fail closed, or append the
    keyword-only warning to ``warnings``.

    Raises ``SearchUnavailableError``: when ``fail_closed``.
    """
    if fail_closed:
        raise SearchUnavailableError(provider_id, error)
    log.warning("embedding provider failed, keyword results only: %s", error)
    warnings.append(f"{error}; results come from keyword search only")


@dataclass(frozen=True)
class IndexVectors:
    """The index's ``vectorDims`` (or ``None``), ``pending`` chunks without a vector and the
    provider ``error`` that left them."""

    dims: int | None
    pending: int
    error: str | None


def read_index_vectors(store: SearchStore) -> IndexVectors:
    """Read :class:`IndexVectors` from the index meta (blocking). Raises ``IndexStoreError``."""
    meta, backlog = store.get_meta_json(META_KEY), store.get_meta_json(BACKLOG_KEY)
    dims = meta.get("vectorDims") if isinstance(meta, dict) else None
    pending = backlog.get("pending") if isinstance(backlog, dict) else None
    error = backlog.get("error") if isinstance(backlog, dict) else None
    return IndexVectors(dims=dims if isinstance(dims, int) else None,
                        pending=pending if isinstance(pending, int) else 0,
                        error=error if isinstance(error, str) else None)


def check_query_vector(vector: list[float], index: IndexVectors, *, model: str,
                       warnings: list[str]) -> tuple[list[float], tuple[int, int] | None]:
    """The query vector a search may rank with, given the index: ``(vector, None)`` (with the
    backlog warning), or ``([], (index dims, query dims))`` with a warning that the answer is
    keyword-only until the index is rebuilt."""
    if vector and index.dims is not None and len(vector) != index.dims:
        warnings.append(f"embedding dimensions changed ({index.dims} -> {len(vector)}, model {model}): "
                        "results come from keyword search only until the index is rebuilt")
        return [], (index.dims, len(vector))
    if vector and index.pending > 0:
        warnings.append(f"{backlog_reason(index.pending, index.error)}: they are found by keyword "
                        "search only until a sync embeds them (run `qmdbridge index`)")
    return vector, None
