"""The OpenAI embedding provider, and the OpenAI wire format other providers reuse.

Wire: ``POST {baseUrl}/embeddings`` with ``{"model", "input": [...], "dimensions"?}`` and a
bearer key; the response's ``data[i].embedding`` (ordered by ``data[i].index``) belongs to
input ``i``. A query is a batch of one. Source: spec 6.2 and the OpenAI embeddings API.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fallback.embeddings import ENV_KEYS as PROVIDER_ENV_KEYS
from fallback.embeddings._http import HttpClient, RemoteEndpoint, resolve_endpoint
from fallback.embeddings.base import BaseProvider, CallPolicy, compute_provider_key
from fallback.errors import EmbeddingProviderError
from fallback.settings import MemorySearchSettings

__all__ = [
    "DEFAULT_BASE_URL",
    "DEFAULT_MODEL",
    "OpenAIProvider",
    "from_settings",
    "parse_openai_embeddings",
    "strip_prefixes",
]

DEFAULT_BASE_URL = "https://api.openai.com/v1"
DEFAULT_MODEL = "text-embedding-3-small"
ENV_KEYS = PROVIDER_ENV_KEYS["openai"]


def strip_prefixes(model: str, prefixes: tuple[str, ...]) -> str:
    """``model`` without the first matching routing prefix (``openai/x`` -> ``x``)."""
    name = model.strip()
    for prefix in prefixes:
        if name.startswith(prefix):
            return name[len(prefix):]
    return name


def parse_openai_embeddings(provider_id: str, body: Any, count: int) -> list[list[float]]:
    """Vectors of an OpenAI-style response: ``data[i].embedding`` placed at ``data[i].index``.

    Entries without an embedding become ``[]``; the result has ``count`` entries.
    Raises ``EmbeddingProviderError`` when the body has no ``data`` list.
    """
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(data, list):
        raise EmbeddingProviderError(provider_id, "response has no 'data' list")
    out: list[list[float]] = [[] for _ in range(count)]
    for pos, item in enumerate(data):
        if not isinstance(item, dict):
            continue
        index = item.get("index", pos)
        vector = item.get("embedding")
        if isinstance(index, int) and 0 <= index < count and isinstance(vector, list):
            out[index] = vector
    return out


class OpenAIProvider(BaseProvider):
    """OpenAI ``/embeddings`` (also the base of openai-compatible, mistral and voyage).

    Attributes:
        http: the provider's :class:`HttpClient`.
        dimensions: value sent as ``dimensions`` (None = not sent).
        query_input_type / document_input_type: value sent as ``input_type`` for queries /
            documents (None = not sent).
    """

    provider_id = "openai"

    def __init__(self, *, endpoint: RemoteEndpoint, model: str, dimensions: int | None = None,
                 query_input_type: str | None = None, document_input_type: str | None = None,
                 policy: CallPolicy | None = None) -> None:
        """Args:
            endpoint: base URL, key (sent as ``Authorization: Bearer``) and extra headers.
            model: model id (prefixes already stripped).
            dimensions: requested output size; also the expected vector length.
            query_input_type / document_input_type: ``input_type`` per direction.
            policy: concurrency, timeouts and retries.
        """
        extra = {"dimensions": dimensions, "queryInputType": query_input_type,
                 "documentInputType": document_input_type}
        super().__init__(model=model, dims=dimensions, policy=policy,
                         provider_key=compute_provider_key(
                             self.provider_id, model, base_url=endpoint.base_url,
                             headers=endpoint.headers, extra=extra))
        self.endpoint = endpoint
        self.dimensions = dimensions
        self.query_input_type = query_input_type
        self.document_input_type = document_input_type
        self.http = HttpClient.for_endpoint(self.provider_id, endpoint, auth=self._auth_headers(),
                                            policy=self.policy)

    def _auth_headers(self) -> dict[str, str]:
        return {"authorization": f"Bearer {self.endpoint.api_key}"} if self.endpoint.api_key else {}

    def _payload(self, texts: list[str], input_type: str | None) -> dict[str, Any]:
        payload: dict[str, Any] = {"model": self.model, "input": texts}
        if self.dimensions is not None:
            payload["dimensions"] = self.dimensions
        if input_type:
            payload["input_type"] = input_type
        return payload

    async def _request_query(self, text: str) -> list[float]:
        body = await self.http.post_json("embeddings", self._payload([text], self.query_input_type))
        return parse_openai_embeddings(self.provider_id, body, 1)[0]

    async def _request_batch(self, texts: list[str]) -> list[list[float]]:
        body = await self.http.post_json("embeddings",
                                         self._payload(texts, self.document_input_type))
        return parse_openai_embeddings(self.provider_id, body, len(texts))

    async def aclose(self) -> None:
        """Close the HTTP client."""
        await self.http.aclose()


def remote_policy(settings: MemorySearchSettings, *, default_concurrency: int = 4) -> CallPolicy:
    """Remote call policy from settings (``remote.nonBatchConcurrency``,
    ``sync.embeddingBatchTimeoutSeconds``)."""
    return CallPolicy.remote(
        concurrency=settings.remote.non_batch_concurrency or default_concurrency,
        batch_timeout_s=settings.sync.embedding_batch_timeout_seconds)


def from_settings(settings: MemorySearchSettings, *, env: Mapping[str, str],
                  policy: CallPolicy | None = None) -> OpenAIProvider:
    """Create the openai provider (no network call).

    Key from ``remote.apiKey`` or ``OPENAI_API_KEY``; base URL ``remote.baseUrl`` or
    ``https://api.openai.com/v1``; model ``model`` (``openai/`` stripped) or
    ``text-embedding-3-small``; ``dimensions`` passed through. Uses the batch-job API when
    ``remote.batch.enabled``.

    Raises:
        EmbeddingProviderUnavailableError: no API key.
    """

    remote = settings.remote
    endpoint = resolve_endpoint("openai", remote, env=env, env_keys=ENV_KEYS,
                                default_base_url=DEFAULT_BASE_URL)
    from fallback.embeddings.batch_jobs import BatchRunner, OpenAIBatchJobs
    model = strip_prefixes(settings.model, ("openai/",)) or DEFAULT_MODEL
    provider = OpenAIProvider(endpoint=endpoint, model=model, dimensions=settings.dimensions,
                              policy=policy or remote_policy(settings))
    if remote.batch.enabled:
        provider.batch_runner = BatchRunner(
            jobs=OpenAIBatchJobs(http=provider.http, model=model, dimensions=settings.dimensions),
            settings=remote.batch)
    return provider
