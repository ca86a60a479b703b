"""The openai-compatible provider: any server speaking OpenAI's ``/embeddings`` wire.

``remote.baseUrl`` is required, the key is optional (``remote.apiKey``), and ``input_type`` is
sent per direction from ``queryInputType`` / ``documentInputType`` (falling back to
``inputType``). Source: spec 6.2 ([E3] ``input_type``).
"""

from __future__ import annotations

from collections.abc import Mapping

from fallback.embeddings._http import resolve_endpoint
from fallback.embeddings.base import CallPolicy
from fallback.embeddings.openai import OpenAIProvider, remote_policy
from fallback.errors import EmbeddingProviderUnavailableError
from fallback.settings import MemorySearchSettings

__all__ = ["OpenAICompatibleProvider", "from_settings"]


class OpenAICompatibleProvider(OpenAIProvider):
    """OpenAI wire against a configured endpoint (vLLM, LM Studio, TEI, LiteLLM ...)."""

    provider_id = "openai-compatible"


def from_settings(settings: MemorySearchSettings, *, env: Mapping[str, str],
                  policy: CallPolicy | None = None) -> OpenAICompatibleProvider:
    """Create the openai-compatible provider (no network call).

    Raises:
        EmbeddingProviderUnavailableError: ``remote.baseUrl`` or ``model`` is not set.
    """
    remote = settings.remote
    endpoint = resolve_endpoint("openai-compatible", remote, env=env,
                                env_keys=(), default_base_url=None, require_key=False)
    model = settings.model.strip()
    if not model:
        raise EmbeddingProviderUnavailableError("openai-compatible", "model is required")
    return OpenAICompatibleProvider(
        endpoint=endpoint, model=model, dimensions=settings.dimensions,
        query_input_type=settings.query_input_type or settings.input_type,
        document_input_type=settings.document_input_type or settings.input_type,
        policy=policy or remote_policy(settings))
