"""The Google Gemini embedding provider.

Queries: ``POST {base}/models/<model>:embedContent`` with ``taskType: RETRIEVAL_QUERY``;
documents: ``POST {base}/models/<model>:batchEmbedContents`` with one request per text and
``taskType: RETRIEVAL_DOCUMENT``; ``outputDimensionality`` when configured. The key goes in the
``x-goog-api-key`` header (``remote.apiKey``, ``GEMINI_API_KEY`` or ``GOOGLE_API_KEY``). A blank
query returns ``[]`` without a request. Source: spec 6.2 and Google's Gemini embeddings API.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fallback.embeddings import ENV_KEYS as PROVIDER_ENV_KEYS
from fallback.embeddings._http import HttpClient, RemoteEndpoint, resolve_endpoint
from fallback.embeddings.base import BaseProvider, CallPolicy, compute_provider_key
from fallback.embeddings.openai import remote_policy, strip_prefixes
from fallback.errors import EmbeddingProviderError
from fallback.settings import MemorySearchSettings

__all__ = ["DEFAULT_BASE_URL", "DEFAULT_MODEL", "GeminiProvider", "from_settings"]

DEFAULT_BASE_URL = "https://generativelanguage.googleapis.com/v1beta"
DEFAULT_MODEL = "gemini-embedding-001"
ENV_KEYS = PROVIDER_ENV_KEYS["gemini"]
MODEL_PREFIXES = ("models/", "gemini/", "google/")


def _values(provider_id: str, item: Any) -> list[float]:
    if not isinstance(item, dict):
        return []
    values = item.get("values")
    if values is not None and not isinstance(values, list):
        raise EmbeddingProviderError(provider_id, "response embedding 'values' is not a list")
    return values or []


class GeminiProvider(BaseProvider):
    """Gemini ``embedContent`` / ``batchEmbedContents``.

    Attributes:
        http: the provider's :class:`HttpClient` (sends ``x-goog-api-key``).
        output_dimensionality: sent as ``outputDimensionality`` (None = not sent).
        model_path: ``models/<model>``.
    """

    provider_id = "gemini"

    def __init__(self, *, endpoint: RemoteEndpoint, model: str,
                 output_dimensionality: int | None = None, policy: CallPolicy | None = None) -> None:
        """Args:
            endpoint: base URL, key and extra headers.
            model: model id without prefixes.
            output_dimensionality: requested output size; also the expected vector length.
            policy: concurrency, timeouts and retries.
        """
        super().__init__(model=model, dims=output_dimensionality, policy=policy,
                         provider_key=compute_provider_key(
                             self.provider_id, model, base_url=endpoint.base_url,
                             headers=endpoint.headers,
                             extra={"outputDimensionality": output_dimensionality}))
        self.endpoint = endpoint
        self.output_dimensionality = output_dimensionality
        self.model_path = f"models/{model}"
        auth = {"x-goog-api-key": endpoint.api_key} if endpoint.api_key else {}
        self.http = HttpClient.for_endpoint(self.provider_id, endpoint, auth=auth,
                                            policy=self.policy)

    def _request(self, text: str, task_type: str, *, with_model: bool) -> dict[str, Any]:
        body: dict[str, Any] = {"content": {"parts": [{"text": text}]}, "taskType": task_type}
        if with_model:
            body = {"model": self.model_path, **body}
        if self.output_dimensionality is not None:
            body["outputDimensionality"] = self.output_dimensionality
        return body

    async def _request_query(self, text: str) -> list[float]:
        if not text.strip():
            return []
        body = await self.http.post_json(f"{self.model_path}:embedContent",
                                         self._request(text, "RETRIEVAL_QUERY", with_model=False))
        return _values(self.provider_id, body.get("embedding") if isinstance(body, dict) else None)

    async def _request_batch(self, texts: list[str]) -> list[list[float]]:
        payload = {"requests": [self._request(t, "RETRIEVAL_DOCUMENT", with_model=True)
                                for t in texts]}
        body = await self.http.post_json(f"{self.model_path}:batchEmbedContents", payload)
        items = body.get("embeddings") if isinstance(body, dict) else None
        if not isinstance(items, list):
            raise EmbeddingProviderError(self.provider_id, "response has no 'embeddings' list")
        out = [_values(self.provider_id, item) for item in items[:len(texts)]]
        return out + [[] for _ in range(len(texts) - len(out))]

    async def aclose(self) -> None:
        """Close the HTTP client."""
        await self.http.aclose()


def from_settings(settings: MemorySearchSettings, *, env: Mapping[str, str],
                  policy: CallPolicy | None = None) -> GeminiProvider:
    """Create the gemini provider (no network call); batch jobs when ``remote.batch.enabled``.

    ``outputDimensionality`` comes from ``outputDimensionality`` or ``dimensions``.

    Raises:
        EmbeddingProviderUnavailableError: no API key.
    """

    remote = settings.remote
    endpoint = resolve_endpoint("gemini", remote, env=env, env_keys=ENV_KEYS,
                                default_base_url=DEFAULT_BASE_URL)
    from fallback.embeddings.batch_jobs import BatchRunner, GeminiBatchJobs
    model = strip_prefixes(settings.model, MODEL_PREFIXES) or DEFAULT_MODEL
    provider = GeminiProvider(endpoint=endpoint, model=model,
                              output_dimensionality=settings.output_dimensionality
                              or settings.dimensions,
                              policy=policy or remote_policy(settings))
    if remote.batch.enabled:
        provider.batch_runner = BatchRunner(
            jobs=GeminiBatchJobs(http=provider.http, model_path=provider.model_path),
            settings=remote.batch)
    return provider
