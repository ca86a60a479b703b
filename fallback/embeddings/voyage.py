"""The Voyage AI embedding provider.

``POST {base}/embeddings`` (base ``https://api.voyageai.com/v1``) with ``{"model", "input",
"input_type"}``: ``query`` for queries, ``document`` for batches; bearer key from
``remote.apiKey`` or ``VOYAGE_API_KEY``; default model ``voyage-4-large``. Source: spec 6.2.
"""

from __future__ import annotations

from collections.abc import Mapping

from fallback.embeddings import ENV_KEYS as PROVIDER_ENV_KEYS
from fallback.embeddings._http import RemoteEndpoint, resolve_endpoint
from fallback.embeddings.base import CallPolicy
from fallback.embeddings.openai import OpenAIProvider, remote_policy, strip_prefixes
from fallback.settings import MemorySearchSettings

__all__ = ["DEFAULT_BASE_URL", "DEFAULT_MODEL", "VoyageProvider", "from_settings"]

DEFAULT_BASE_URL = "https://api.voyageai.com/v1"
DEFAULT_MODEL = "voyage-4-large"
ENV_KEYS = PROVIDER_ENV_KEYS["voyage"]


class VoyageProvider(OpenAIProvider):
    """Voyage ``/embeddings`` with ``input_type`` ``query`` / ``document``."""

    provider_id = "voyage"

    def __init__(self, *, endpoint: RemoteEndpoint, model: str,
                 policy: CallPolicy | None = None) -> None:
        """Args: see :class:`OpenAIProvider` (input types are fixed to query/document)."""
        super().__init__(endpoint=endpoint, model=model, query_input_type="query",
                         document_input_type="document", policy=policy)


def from_settings(settings: MemorySearchSettings, *, env: Mapping[str, str],
                  policy: CallPolicy | None = None) -> VoyageProvider:
    """Create the voyage provider (no network call); batch jobs when ``remote.batch.enabled``.

    Raises:
        EmbeddingProviderUnavailableError: no API key.
    """

    remote = settings.remote
    endpoint = resolve_endpoint("voyage", remote, env=env, env_keys=ENV_KEYS,
                                default_base_url=DEFAULT_BASE_URL)
    from fallback.embeddings.batch_jobs import BatchRunner, VoyageBatchJobs
    model = strip_prefixes(settings.model, ("voyage/",)) or DEFAULT_MODEL
    provider = VoyageProvider(endpoint=endpoint, model=model,
                              policy=policy or remote_policy(settings))
    if remote.batch.enabled:
        provider.batch_runner = BatchRunner(jobs=VoyageBatchJobs(http=provider.http, model=model),
                                            settings=remote.batch)
    return provider
