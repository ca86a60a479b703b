"""The embedding provider protocol and the pieces every provider shares.

A provider turns texts into vectors. Queries and documents may be embedded differently
(``input_type``/task types), so there are two calls. Vectors are lists of floats; providers
that return unnormalised vectors (local GGUF, ollama) L2-normalise them here.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

__all__ = ["EmbeddingProvider"]


@runtime_checkable
class EmbeddingProvider(Protocol):
    """One embedding provider.

    Attributes:
        provider_id: registry name: ``openai``, ``openai-compatible``, ``gemini``, ``voyage``,
            ``mistral``, ``ollama`` or ``local``.
        model: model id as sent to the provider (prefixes like ``openai/`` stripped).
        dims: vector length when known (configured or learned from the first call), else None.
        provider_key: sha256 hex of the endpoint fingerprint (spec 4.3: provider, base URL,
            model, headers without auth); part of the index identity and the cache key.
        max_input_tokens: the provider's input limit in tokens (spec section 3 table).
        max_batch_bytes: request batches hold at most this many UTF-8 bytes (8,000).
    """

    provider_id: str
    model: str
    dims: int | None
    provider_key: str
    max_input_tokens: int
    max_batch_bytes: int

    async def embed_query(self, text: str) -> list[float]:
        """Embed one search query. Raises ``EmbeddingProviderError``."""
        ...

    async def embed_batch(self, texts: list[str]) -> list[list[float]]:
        """Embed documents; result ``i`` belongs to ``texts[i]`` (``[]`` when missing).

        Splits into byte-bounded request batches, retries transient failures and halves
        batches the provider rejects as too large. Raises ``EmbeddingProviderError``.
        """
        ...

    async def aclose(self) -> None:
        """Release HTTP clients or the loaded model."""
        ...
