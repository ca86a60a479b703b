"""A deterministic embedding provider for engine, index and store tests.

Its vector of a text is ``[count of "alpha", count of "beta"]`` (case-insensitive), so a test
can say which chunks are near a query without a model. A ``BaseProvider`` whose calls answer
at once (no retries, timeouts or batching).
"""

from __future__ import annotations

import anyio

from fallback.embeddings.base import BaseProvider
from fallback.errors import EmbeddingProviderError

__all__ = ["CountProvider"]


class CountProvider(BaseProvider):
    """Vectors ``[count of "alpha", count of "beta"]``.

    Args:
        model: the model id (a different one changes the index identity).
        fail_query / fail_batch: raise ``EmbeddingProviderError`` from ``embed_query`` /
            ``embed_batch``, as a dead provider does.
        gated: once a test sets :attr:`blocking`, ``embed_batch`` sets :attr:`entered` and
            waits for :attr:`gate` (a test holds a sync in the middle of embedding).

    Attributes:
        batch_calls: ``embed_batch`` calls so far (failed ones too).
        texts_embedded: texts embedded so far by successful batch calls.
    """

    provider_id = "test-count"
    dims: int | None = 2
    provider_key = "key-1"
    max_input_tokens = 8192
    max_batch_bytes = 8000

    def __init__(self, *, model: str = "count-v1", fail_query: bool = False,
                 fail_batch: bool = False, gated: bool = False) -> None:
        self.model = model
        self.fail_query = fail_query
        self.fail_batch = fail_batch
        self.batch_calls = 0
        self.texts_embedded = 0
        self.blocking = False
        self.gate = anyio.Event()
        self.entered = anyio.Event()
        self._gated = gated

    @staticmethod
    def vector(text: str) -> list[float]:
        """The vector of ``text``: ``[count of "alpha", count of "beta"]``."""
        low = text.lower()
        return [float(low.count("alpha")), float(low.count("beta"))]

    async def embed_query(self, text: str) -> list[float]:
        """The query's vector; raises ``EmbeddingProviderError`` with ``fail_query``."""
        if self.fail_query:
            raise EmbeddingProviderError(self.provider_id, "fetch failed")
        return self.vector(text)

    async def embed_batch(self, texts: list[str]) -> list[list[float]]:
        """The texts' vectors; raises ``EmbeddingProviderError`` with ``fail_batch``."""
        self.batch_calls += 1
        if self._gated and self.blocking:
            self.entered.set()
            await self.gate.wait()
        if self.fail_batch:
            raise EmbeddingProviderError(self.provider_id, "connection refused")
        self.texts_embedded += len(texts)
        return [self.vector(t) for t in texts]

    async def aclose(self) -> None:
        """Nothing to release."""
