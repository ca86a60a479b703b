"""The Ollama embedding provider: one ``POST /api/embeddings`` per text.

Wire: ``{"model", "prompt"}`` -> ``{"embedding": [...]}`` at ``remote.baseUrl`` or
``http://127.0.0.1:11434``; optional bearer key (``remote.apiKey`` or ``OLLAMA_API_KEY``).
Requests run one at a time by default, and vectors are sanitised and L2-normalised.
Ollama is supported but never picked by ``auto``. Source: spec 6.2.
"""

from __future__ import annotations

from collections.abc import Mapping

from fallback.embeddings import ENV_KEYS as PROVIDER_ENV_KEYS
from fallback.embeddings._http import HttpClient, RemoteEndpoint, resolve_endpoint
from fallback.embeddings.base import BaseProvider, CallPolicy, compute_provider_key
from fallback.embeddings.openai import remote_policy, strip_prefixes
from fallback.errors import EmbeddingProviderError
from fallback.settings import MemorySearchSettings

__all__ = ["DEFAULT_BASE_URL", "DEFAULT_MODEL", "OllamaProvider", "from_settings"]

DEFAULT_BASE_URL = "http://127.0.0.1:11434"
DEFAULT_MODEL = "nomic-embed-text"
ENV_KEYS = PROVIDER_ENV_KEYS["ollama"]


class OllamaProvider(BaseProvider):
    """Ollama ``/api/embeddings`` (normalised vectors, one request per text).

    Attributes:
        http: the provider's :class:`HttpClient`.
    """

    provider_id = "ollama"

    def __init__(self, *, endpoint: RemoteEndpoint, model: str,
                 policy: CallPolicy | None = None) -> None:
        """Args:
            endpoint: base URL, optional key (sent as bearer) and extra headers.
            model: model name as Ollama knows it.
            policy: concurrency (default 1), timeouts and retries.
        """
        super().__init__(model=model, normalize=True,
                         policy=policy or CallPolicy.remote(concurrency=1),
                         provider_key=compute_provider_key(
                             self.provider_id, model, base_url=endpoint.base_url,
                             headers=endpoint.headers))
        self.endpoint = endpoint
        auth = {"authorization": f"Bearer {endpoint.api_key}"} if endpoint.api_key else {}
        self.http = HttpClient.for_endpoint(self.provider_id, endpoint, auth=auth,
                                            policy=self.policy)

    async def _request_query(self, text: str) -> list[float]:
        body = await self.http.post_json("api/embeddings", {"model": self.model, "prompt": text})
        vector = body.get("embedding") if isinstance(body, dict) else None
        if vector is None:
            return []
        if not isinstance(vector, list):
            raise EmbeddingProviderError(self.provider_id, "response 'embedding' is not a list")
        return vector

    async def _request_batch(self, texts: list[str]) -> list[list[float]]:
        return [await self._request_query(text) for text in texts]

    async def aclose(self) -> None:
        """Close the HTTP client."""
        await self.http.aclose()


def from_settings(settings: MemorySearchSettings, *, env: Mapping[str, str],
                  policy: CallPolicy | None = None) -> OllamaProvider:
    """Create the ollama provider (no network call; never raises for a missing key)."""
    remote = settings.remote
    endpoint = resolve_endpoint("ollama", remote, env=env, env_keys=ENV_KEYS,
                                default_base_url=DEFAULT_BASE_URL, require_key=False)
    model = strip_prefixes(settings.model, ("ollama/",)) or DEFAULT_MODEL
    return OllamaProvider(endpoint=endpoint, model=model,
                          policy=policy or remote_policy(settings, default_concurrency=1))
