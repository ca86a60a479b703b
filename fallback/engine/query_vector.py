"""A search's query embedding under its deadline, and the warnings of a degraded answer.

The builtin engine embeds the query before anything else a search does, within
``query.timeoutMs`` (:func:`embed_query_within`), then hands the ranking code a
:class:`PreparedProvider` whose ``embed_query`` returns that vector, so the provider is called
once per search and never past the deadline. What the engine does when the provider failed
(fail closed, or answer from keyword search with a warning) is decided in
``fallback/engine/builtin.py``; the texts of those warnings live here.
"""

from __future__ import annotations

import logging
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

if TYPE_CHECKING:
    from fallback.store.db import Store

__all__ = [
    "IndexVectors",
    "ensure_model",
    "failure_text",
    "PreparedProvider",
    "QueryVector",
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


class PreparedProvider:
    """The provider as the ranking code sees it during one search: ``embed_query`` answers
    the vector embedded beforehand (``[]`` = none: keyword-only ranking); everything else is
    the provider's.

    Args:
        provider: the real provider.
        vector: the prepared query vector (``[]`` when there is none).
    """

    def __init__(self, provider: EmbeddingProvider, vector: list[float]) -> None:
        self._provider = provider
        self._vector = list(vector)
        self.provider_id = provider.provider_id
        self.model = provider.model
        self.dims = provider.dims
        self.provider_key = provider.provider_key
        self.max_input_tokens = provider.max_input_tokens
        self.max_batch_bytes = provider.max_batch_bytes

    async def embed_query(self, text: str) -> list[float]:
        """The prepared vector (a copy); ``text`` is the query it was made for."""
        return list(self._vector)

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
    return f"{pending} chunks wait for embeddings" + (f" ({error})" if error else "")


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


def read_index_vectors(store: Store) -> IndexVectors:
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
