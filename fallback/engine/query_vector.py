"""A search's query embedding under its deadline, and the warnings of a degraded answer.

The builtin engine embeds the query before anything else a search does, within
``query.timeoutMs`` (:func:`embed_query_within`), then hands the ranking code a
:class:`PreparedProvider` whose ``embed_query`` returns that vector, so the query is embedded
once per search and the provider is never called past the deadline (the one other text a
search embeds, the background of its common terms, ``fallback/search/contrast.py``, goes
through the same deadline and a :class:`QueryVectorCache`). What the engine does when the provider failed
(fail closed, or answer from keyword search with a warning) is decided in
``fallback/engine/builtin.py``; the texts of those warnings live here.
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

__all__ = [
    "IndexVectors",
    "ensure_model",
    "failure_text",
    "PreparedProvider",
    "QUERY_CACHE_ENTRIES",
    "QueryVector",
    "QueryVectorCache",
    "backlog_reason",
    "check_query_vector",
    "dims_warning",
    "embed_query_within",
    "keyword_only_warning",
    "on_provider_failure",
    "pending_warning",
    "read_index_vectors",
]

log = logging.getLogger("fallback.engine.builtin")

# Query embeddings of other texts (contrast backgrounds) an engine keeps across searches.
QUERY_CACHE_ENTRIES = 256


@dataclass(frozen=True)
class QueryVector:
    """The query embedding of one search.

    Attributes:
        vector: the vector (``[]`` when the provider returned none), or ``None`` on failure.
        error: why there is no vector (provider error, rate limit, the deadline), or ``None``.
    """

    vector: list[float] | None
    error: EmbeddingProviderError | None = None


async def ensure_model(provider: EmbeddingProvider) -> EmbeddingProviderError | None:
    """Bring the provider's model in before a search's deadline starts: a local model that is
    downloaded on first use (``ensure_model()`` of the local provider) takes as long as the
    download does, with its own progress and errors, and is not a provider that hangs.

    Returns:
        ``None`` when the model is ready (or the provider has none to fetch), else the error
        (``ModelDownloadError``: offline, HTTP error, checksum).
    """
    fetch = getattr(provider, "ensure_model", None)
    if fetch is None:
        return None
    try:
        await fetch()
    except EmbeddingProviderError as exc:
        return exc
    return None


def failure_text(exc: EmbeddingProviderError, *, query: bool) -> str:
    """How a provider failure is named in the answer: a provider that cannot work at all
    (:class:`EmbeddingProviderUnavailableError`: no model, download failed) by its reason, a
    failed call as ``query embedding failed: <error>`` (``query``) or the error itself."""
    if isinstance(exc, EmbeddingProviderUnavailableError):
        return exc.reason
    return f"query embedding failed: {exc}" if query else str(exc)


async def embed_query_within(provider: EmbeddingProvider | None, text: str, *,
                             timeout_ms: int) -> tuple[QueryVector | None, float]:
    """Embed ``text`` within ``timeout_ms``, after :func:`ensure_model` (which has no deadline).

    A provider that reports a changed vector size (:class:`EmbeddingDimensionsError`) has
    adopted the new size, so the query is embedded once more at that size (the index check
    that follows sees the change).

    Args:
        provider: the embedding provider, or ``None`` (keyword-only: nothing to embed).
        text: the query.
        timeout_ms: the search's deadline (``query.timeoutMs``), in ms.

    Returns:
        ``(query vector or None without a provider, deadline)``: the deadline as anyio clock
        time, for the rest of the search. Never raises for a provider failure: past the
        deadline the error reads ``query embedding timed out after <timeout_ms> ms
        (query.timeoutMs)``.
    """
    fetch_error = None if provider is None else await ensure_model(provider)
    deadline = anyio.current_time() + timeout_ms / 1000
    if provider is None or fetch_error is not None:
        return (None if provider is None else QueryVector(None, fetch_error)), deadline
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
    """Query embeddings of texts other than the query itself (the background of
    ``fallback/search/contrast.py``), least recently used dropped first. The same few common
    terms (a chat's speaker names) come back query after query, so after the first search they
    cost no provider call.

    Args:
        max_entries: how many vectors are kept (>= 1).
    """

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
    """The provider as the ranking code sees it during one search: ``embed_query`` of the query
    answers the vector embedded beforehand (``[]`` = none: keyword-only ranking); any other
    text is embedded by the provider within what is left of the search's deadline (through
    ``cache`` when given); everything else is the provider's.

    Args:
        provider: the real provider.
        vector: the prepared query vector (``[]`` when there is none).
        query: the text ``vector`` was made for; ``None``: every text gets ``vector``.
        deadline: anyio clock time after which the provider is not called (``None``: no
            deadline but the provider's own timeouts).
        cache: embeddings of other texts kept across searches, or ``None``.
    """

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
        self.dims = provider.dims
        self.provider_key = provider.provider_key
        self.max_input_tokens = provider.max_input_tokens
        self.max_batch_bytes = provider.max_batch_bytes

    async def embed_query(self, text: str) -> list[float]:
        """The prepared vector (a copy) for the query; another ``text`` embedded as a query.

        Raises:
            EmbeddingProviderError: the provider failed on another text, or the deadline
                passed (``query embedding timed out (query.timeoutMs)``).
        """
        if self._query is None or text == self._query:
            return list(self._vector)
        key = (self.provider_key, self.model, text)
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

    async def embed_batch(self, texts: list[str]) -> list[list[float]]:
        """The provider's ``embed_batch``. Raises ``EmbeddingProviderError``."""
        return await self._provider.embed_batch(texts)

    async def aclose(self) -> None:
        """Nothing: the engine owns and closes the real provider."""


def keyword_only_warning(error: str) -> str:
    """The warning of an answer ranked by keywords only because the provider failed."""
    return f"{error}; results come from keyword search only"


def dims_warning(index_dims: int, query_dims: int, model: str) -> str:
    """The warning while the index is rebuilt for a provider whose vector size changed."""
    return (f"embedding dimensions changed ({index_dims} -> {query_dims}, model {model}): "
            "results come from keyword search only until the index is rebuilt")


def backlog_reason(pending: int, error: str | None) -> str:
    """``status().dirty_reason`` while chunks wait for their vectors."""
    return f"{counted(pending, 'chunk', 'wait')} for embeddings" + (f" ({error})" if error else "")


def pending_warning(pending: int, error: str | None) -> str:
    """The warning of a hybrid answer while some chunks have no vector yet."""
    return (f"{backlog_reason(pending, error)}: they are found by keyword search only until a "
            "later sync embeds them")


def on_provider_failure(provider_id: str, error: str, *, fail_closed: bool,
                        warnings: list[str]) -> None:
    """A provider failure seen by a search: fail closed, or add the keyword-only warning.

    Args:
        provider_id: the provider that failed.
        error: one line saying how.
        fail_closed: True for an explicitly configured provider without
            ``query.keywordFallback``.
        warnings: the answer's warnings (appended to).

    Raises:
        SearchUnavailableError: when ``fail_closed``.
    """
    if fail_closed:
        raise SearchUnavailableError(provider_id, error)
    log.warning("embedding provider failed, keyword results only: %s", error)
    warnings.append(keyword_only_warning(error))


@dataclass(frozen=True)
class IndexVectors:
    """What the index says about its vectors: ``dims`` (``vectorDims`` of the index meta, or
    ``None``), ``pending`` chunks without a vector and the provider ``error`` that left them."""

    dims: int | None
    pending: int
    error: str | None


def read_index_vectors(store: SearchStore) -> IndexVectors:
    """Read :class:`IndexVectors` from the index meta (blocking: call in a worker thread).

    Raises:
        IndexStoreError: the store cannot be read.
    """
    meta, backlog = store.get_meta_json(META_KEY), store.get_meta_json(BACKLOG_KEY)
    dims = meta.get("vectorDims") if isinstance(meta, dict) else None
    pending = backlog.get("pending") if isinstance(backlog, dict) else None
    error = backlog.get("error") if isinstance(backlog, dict) else None
    return IndexVectors(dims=dims if isinstance(dims, int) else None,
                        pending=pending if isinstance(pending, int) else 0,
                        error=error if isinstance(error, str) else None)


def check_query_vector(vector: list[float], index: IndexVectors, *, model: str,
                       warnings: list[str]) -> tuple[list[float], tuple[int, int] | None]:
    """The query vector a search may rank with, given the index (pure).

    Returns:
        ``(vector, None)``, with the backlog warning appended when chunks wait for vectors; or
        ``([], (index dims, query dims))`` with the :func:`dims_warning` when the vector's
        length is not the index's (keyword-only until the index is rebuilt).
    """
    if vector and index.dims is not None and len(vector) != index.dims:
        warnings.append(dims_warning(index.dims, len(vector), model))
        return [], (index.dims, len(vector))
    if vector and index.pending > 0:
        warnings.append(pending_warning(index.pending, index.error))
    return vector, None
