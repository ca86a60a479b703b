"""The Mistral embedding provider (OpenAI-like wire at ``https://api.mistral.ai/v1``).

``POST {base}/embeddings`` with ``{"model", "input": [...]}`` and a bearer key from
``remote.apiKey`` or ``MISTRAL_API_KEY``; default model ``mistral-embed``.
"""

from __future__ import annotations

from collections.abc import Mapping

from fallback.embeddings import ENV_KEYS as PROVIDER_ENV_KEYS
from fallback.embeddings._http import resolve_endpoint
from fallback.embeddings.base import CallPolicy
from fallback.embeddings.openai import OpenAIProvider, remote_policy, strip_prefixes
from fallback.settings import MemorySearchSettings

__all__ = ["DEFAULT_BASE_URL", "DEFAULT_MODEL", "MistralProvider", "from_settings"]

DEFAULT_BASE_URL = "https://api.mistral.ai/v1"
DEFAULT_MODEL = "mistral-embed"
ENV_KEYS = PROVIDER_ENV_KEYS["mistral"]


class MistralProvider(OpenAIProvider):
    """Mistral ``/embeddings``."""

    provider_id = "mistral"


def from_settings(settings: MemorySearchSettings, *, env: Mapping[str, str],
                  policy: CallPolicy | None = None) -> MistralProvider:
    """Create the mistral provider (no network call).

    Raises:
        EmbeddingProviderUnavailableError: no API key.
    """
    remote = settings.remote
    endpoint = resolve_endpoint("mistral", remote, env=env, env_keys=ENV_KEYS,
                                default_base_url=DEFAULT_BASE_URL)
    model = strip_prefixes(settings.model, ("mistral/",)) or DEFAULT_MODEL
    return MistralProvider(endpoint=endpoint, model=model, policy=policy or remote_policy(settings))
