"""The HTTP embedding providers: one table of what sets each apart, three wire formats.

:data:`SPECS` holds what sets each provider apart, one row each. Wires (Source: spec 6.2 and
each provider's embeddings API): **OpenAI** (openai, openai-compatible, mistral, voyage)
``POST {base}/embeddings``; **Gemini** ``models/<model>:embedContent`` for queries and
``:batchEmbedContents`` for documents, the key in ``x-goog-api-key``; **Ollama** one
``POST {base}/api/embeddings`` per text, vectors L2-normalised.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from fallback.embeddings import ENV_KEYS
from fallback.embeddings._http import HttpClient
from fallback.embeddings.base import BaseProvider, CallPolicy, compute_provider_key
from fallback.errors import EmbeddingProviderError, EmbeddingProviderUnavailableError
from fallback.settings import MemorySearchSettings, RemoteSettings, SecretRef, read_api_key

__all__ = ["SPECS", "GeminiProvider", "OllamaProvider", "OpenAIWireProvider", "RemoteEndpoint",
           "RemoteSpec", "from_settings", "resolve_endpoint"]


@dataclass(frozen=True)
class RemoteSpec:
    """What sets one HTTP provider apart (a row of :data:`SPECS`): its wire, default base URL
    and model (None / ``""``: the config must set them), the routing prefixes stripped from the
    model id, whether it needs an API key, its parallel requests per ``embed_batch``, whether
    ``dimensions`` is sent, and ``input_type`` for queries and documents (None: not sent;
    ``"configured"``: ``queryInputType`` / ``documentInputType``, else ``inputType``)."""

    wire: Literal["openai", "gemini", "ollama"]
    base_url: str | None
    model: str
    prefixes: tuple[str, ...]
    require_key: bool = True
    concurrency: int = 4
    dimensions: bool = False
    input_types: tuple[str, str] | Literal["configured"] | None = None


SPECS: Mapping[str, RemoteSpec] = {
    "openai": RemoteSpec("openai", "https://api.openai.com/v1", "text-embedding-3-small",
                         ("openai/",), dimensions=True),
    "openai-compatible": RemoteSpec("openai", None, "", (), require_key=False, dimensions=True,
                                    input_types="configured"),
    "mistral": RemoteSpec("openai", "https://api.mistral.ai/v1", "mistral-embed", ("mistral/",)),
    "voyage": RemoteSpec("openai", "https://api.voyageai.com/v1", "voyage-4-large", ("voyage/",),
                         input_types=("query", "document")),
    "gemini": RemoteSpec("gemini", "https://generativelanguage.googleapis.com/v1beta",
                         "gemini-embedding-001", ("models/", "gemini/", "google/")),
    "ollama": RemoteSpec("ollama", "http://127.0.0.1:11434", "nomic-embed-text", ("ollama/",),
                         require_key=False, concurrency=1),
}


@dataclass(frozen=True)
class RemoteEndpoint:
    """Where and how to reach a remote provider: ``base_url`` (no trailing slash), the
    ``api_key`` (or None) and the configured extra ``headers``."""

    base_url: str
    api_key: str | None
    headers: Mapping[str, str]


def resolve_endpoint(provider_id: str, remote: RemoteSettings, *, env: Mapping[str, str],
                     entry: RemoteSettings | None = None) -> RemoteEndpoint:
    """The endpoint of provider ``provider_id``: the key from ``memorySearch.remote``, else the
    variables of :data:`~fallback.embeddings.ENV_KEYS`, else ``entry`` (its OpenClaw
    ``models.providers`` entry); the base URL from ``remote``, else ``entry``, else the spec's
    default; ``entry``'s headers overlaid with ``remote``'s. Raises
    ``EmbeddingProviderUnavailableError``: no key (``missing_api_key``) or base URL needed."""
    spec, entry = SPECS[provider_id], entry or RemoteSettings()
    key = read_api_key(remote.api_key, env) or next(
        (env[name].strip() for name in ENV_KEYS.get(provider_id, ()) if env.get(name, "").strip()),
        None) or read_api_key(entry.api_key, env)
    if spec.require_key and not key:
        why = "; ".join(r for ref, at in ((remote.api_key, "remote.apiKey"),
                                          (entry.api_key, "its models.providers apiKey"))
                        if isinstance(ref, SecretRef) and (r := ref.unread_reason(env, key=at)))
        raise EmbeddingProviderUnavailableError(
            provider_id, f"no API key found for {provider_id}" + (f" ({why})" if why else ""),
            missing_api_key=True)
    url = (remote.base_url or "").strip() or (entry.base_url or "").strip() or spec.base_url
    if not url:
        raise EmbeddingProviderUnavailableError(provider_id, "remote.baseUrl is required")
    return RemoteEndpoint(base_url=url.rstrip("/"), api_key=key, headers={**entry.headers, **remote.headers})


class _HttpProvider(BaseProvider):
    """A provider behind one :class:`HttpClient` (closed by :meth:`aclose`)."""

    def __init__(self, provider_id: str, endpoint: RemoteEndpoint, *, model: str,
                 auth_header: str = "authorization", extra: Mapping[str, object] | None = None,
                 **kwargs: Any) -> None:
        self.provider_id = provider_id
        super().__init__(model=model, provider_key=compute_provider_key(
            provider_id, model, base_url=endpoint.base_url, headers=endpoint.headers, extra=extra),
            **kwargs)
        self.endpoint = endpoint
        key = endpoint.api_key
        auth = {} if not key else {auth_header: key if auth_header != "authorization" else f"Bearer {key}"}
        # the key redacted from messages; the longer request deadline as httpx's backstop
        self.http = HttpClient(provider_id=provider_id, base_url=endpoint.base_url,
                               headers={**endpoint.headers, **auth}, secrets=[key or ""],
                               timeout_s=max(self.policy.query_timeout_s, self.policy.batch_timeout_s))

    async def aclose(self) -> None:
        """Close the HTTP client."""
        await self.http.aclose()


class OpenAIWireProvider(_HttpProvider):
    """OpenAI's ``/embeddings`` wire: ``dimensions`` is sent and expected when given,
    ``input_type`` per direction when given; results are placed by ``data[i].index``."""

    def __init__(self, provider_id: str, endpoint: RemoteEndpoint, *, model: str,
                 dimensions: int | None = None, query_input_type: str | None = None,
                 document_input_type: str | None = None, policy: CallPolicy | None = None) -> None:
        super().__init__(provider_id, endpoint, model=model, dims=dimensions, policy=policy,
                         extra={"dimensions": dimensions, "queryInputType": query_input_type,
                                "documentInputType": document_input_type})
        self.dimensions = dimensions
        self.input_types = (query_input_type, document_input_type)

    async def _post(self, texts: list[str], input_type: str | None) -> list[list[float]]:
        payload: dict[str, Any] = {"model": self.model, "input": texts}
        if self.dimensions is not None:
            payload["dimensions"] = self.dimensions
        if input_type:
            payload["input_type"] = input_type
        body = await self.http.post_json("embeddings", payload)
        data = body.get("data") if isinstance(body, dict) else None
        if not isinstance(data, list):
            raise EmbeddingProviderError(self.provider_id, "response has no 'data' list")
        out: list[list[float]] = [[] for _ in texts]
        for pos, item in enumerate(data):  # placed by "index" (its position when it has none)
            index = item.get("index", pos) if isinstance(item, dict) else None
            vector = item.get("embedding") if isinstance(item, dict) else None
            if isinstance(index, int) and 0 <= index < len(texts) and isinstance(vector, list):
                out[index] = vector
        if missing := sum(not v for v in out):  # else the chunks would wait for a vector forever
            raise EmbeddingProviderError(self.provider_id, f"response has no embedding for {missing} "
                                                           f"of {len(texts)} inputs")
        return out

    async def _request_query(self, text: str) -> list[float]:
        return (await self._post([text], self.input_types[0]))[0]

    async def _request_batch(self, texts: list[str]) -> list[list[float]]:
        return await self._post(texts, self.input_types[1])


def _vector(provider_id: str, holder: Any, key: str) -> list[float]:
    """``holder[key]`` as a vector: ``[]`` when absent; an error when it is not a list."""
    value = holder.get(key) if isinstance(holder, dict) else None
    if value is not None and not isinstance(value, list):
        raise EmbeddingProviderError(provider_id, f"response {key!r} is not a list")
    return value or []


class GeminiProvider(_HttpProvider):
    """Gemini ``embedContent`` / ``batchEmbedContents`` (``model_path`` is ``models/<model>``;
    ``output_dimensionality`` is sent as ``outputDimensionality`` and is the expected length)."""

    def __init__(self, endpoint: RemoteEndpoint, *, model: str,
                 output_dimensionality: int | None = None, policy: CallPolicy | None = None) -> None:
        super().__init__("gemini", endpoint, model=model, dims=output_dimensionality,
                         policy=policy, auth_header="x-goog-api-key",
                         extra={"outputDimensionality": output_dimensionality})
        self.output_dimensionality = output_dimensionality
        self.model_path = f"models/{model}"

    def _body(self, text: str, task_type: str, **model: str) -> dict[str, Any]:
        body: dict[str, Any] = {**model, "content": {"parts": [{"text": text}]}, "taskType": task_type}
        if self.output_dimensionality is not None:
            body["outputDimensionality"] = self.output_dimensionality
        return body

    async def _request_query(self, text: str) -> list[float]:
        if not text.strip():
            return []
        body = await self.http.post_json(f"{self.model_path}:embedContent",
                                         self._body(text, "RETRIEVAL_QUERY"))
        return _vector(self.provider_id, body.get("embedding") if isinstance(body, dict) else None,
                       "values")

    async def _request_batch(self, texts: list[str]) -> list[list[float]]:
        payload = {"requests": [self._body(t, "RETRIEVAL_DOCUMENT", model=self.model_path)
                                for t in texts]}
        body = await self.http.post_json(f"{self.model_path}:batchEmbedContents", payload)
        items = body.get("embeddings") if isinstance(body, dict) else None
        if not isinstance(items, list):
            raise EmbeddingProviderError(self.provider_id, "response has no 'embeddings' list")
        out = [_vector(self.provider_id, item, "values") for item in items[:len(texts)]]
        return out + [[] for _ in range(len(texts) - len(out))]


class OllamaProvider(_HttpProvider):
    """Ollama ``/api/embeddings``: one request per text, normalised vectors."""

    def __init__(self, endpoint: RemoteEndpoint, *, model: str,
                 policy: CallPolicy | None = None) -> None:
        super().__init__("ollama", endpoint, model=model, normalize=True,
                         policy=policy or CallPolicy.remote(concurrency=1))

    async def _request_query(self, text: str) -> list[float]:
        body = await self.http.post_json("api/embeddings", {"model": self.model, "prompt": text})
        return _vector(self.provider_id, body, "embedding")

    async def _request_batch(self, texts: list[str]) -> list[list[float]]:
        return [await self._request_query(text) for text in texts]


def from_settings(provider_id: str, settings: MemorySearchSettings, *, env: Mapping[str, str],
                  policy: CallPolicy | None = None) -> BaseProvider:
    """Create the HTTP provider ``provider_id`` of :data:`SPECS` (no network call); openai,
    voyage and gemini get a batch-job runner when ``remote.batch.enabled``. Raises
    ``EmbeddingProviderUnavailableError``: no API key, ``remote.baseUrl`` or ``model`` needed."""
    spec, remote = SPECS[provider_id], settings.remote
    endpoint = resolve_endpoint(provider_id, remote, env=env, entry=settings.model_providers.get(provider_id))
    name = settings.model.strip()  # without its routing prefix (``openai/x`` -> ``x``)
    model = next((name[len(p):] for p in spec.prefixes if name.startswith(p)), name) or spec.model
    if not model:
        raise EmbeddingProviderUnavailableError(provider_id, "model is required")
    policy = policy or CallPolicy.remote(
        concurrency=remote.non_batch_concurrency or spec.concurrency,
        batch_timeout_s=settings.sync.embedding_batch_timeout_seconds)
    provider: _HttpProvider
    if spec.wire == "gemini":
        provider = GeminiProvider(endpoint, model=model, policy=policy,
                                  output_dimensionality=settings.output_dimensionality
                                  or settings.dimensions)
    elif spec.wire == "ollama":
        provider = OllamaProvider(endpoint, model=model, policy=policy)
    else:
        types: tuple[str | None, str | None] = (None, None)
        if spec.input_types == "configured":
            types = (settings.query_input_type or settings.input_type,
                     settings.document_input_type or settings.input_type)
        elif spec.input_types is not None:
            types = spec.input_types
        provider = OpenAIWireProvider(provider_id, endpoint, model=model, policy=policy,
                                      dimensions=settings.dimensions if spec.dimensions else None,
                                      query_input_type=types[0], document_input_type=types[1])
    if remote.batch.enabled and provider_id in ("openai", "voyage", "gemini"):
        from fallback.embeddings import batch_jobs

        jobs: batch_jobs.BatchJobApi = (
            batch_jobs.GeminiBatchJobs(http=provider.http, model_path=f"models/{model}")
            if provider_id == "gemini" else batch_jobs.VoyageBatchJobs(http=provider.http, model=model)
            if provider_id == "voyage" else batch_jobs.OpenAIBatchJobs(
                http=provider.http, model=model, dimensions=settings.dimensions))
        provider.batch_runner = batch_jobs.BatchRunner(jobs=jobs, settings=remote.batch)
    return provider
