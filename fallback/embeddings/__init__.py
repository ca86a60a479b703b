"""Embedding providers: the registry, the ``auto`` order and provider selection.

Rules of :func:`select_provider` (spec 6.1, E2): ``none`` is keyword-only on purpose;
``auto`` tries :data:`AUTO_ORDER` and, when none can be created, is keyword-only (not an
error); an explicit provider that cannot be created tries ``fallback``, then sets ``error``
(``memory search unavailable: <provider>: <reason>``): it is never silently keyword-only.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from types import MappingProxyType
from typing import get_args

from fallback.embeddings.base import BaseProvider, CallPolicy, EmbeddingProvider, probe
from fallback.errors import EmbeddingProviderUnavailableError, SearchUnavailableError
from fallback.settings import MemorySearchSettings, ProviderName

__all__ = ["AUTO_ENV_KEYS", "AUTO_ORDER", "ENV_KEYS", "PROVIDERS", "BaseProvider", "CallPolicy",
           "EmbeddingProvider", "ProviderFactory", "ProviderSelection", "create_provider", "probe",
           "select_provider"]

ProviderFactory = Callable[..., EmbeddingProvider]
"""``factory(settings, *, env) -> EmbeddingProvider``; raises
``EmbeddingProviderUnavailableError`` when the provider cannot be created."""


def _create(name: str, settings: MemorySearchSettings, *, env: Mapping[str, str],
            **kwargs: object) -> EmbeddingProvider:
    """Provider ``name``'s factory, importing its module on its first call."""
    if name == "local":
        from fallback.embeddings.local_gguf import from_settings

        return from_settings(settings, env=env, **kwargs)  # type: ignore[arg-type]
    from fallback.embeddings.remote import from_settings as remote_from_settings

    return remote_from_settings(name, settings, env=env, **kwargs)  # type: ignore[arg-type]


# name -> factory; read-only (tests pass their own mapping to ``select_provider``).
PROVIDERS: Mapping[str, ProviderFactory] = MappingProxyType({
    name: partial(_create, name)
    for name in ("openai", "openai-compatible", "gemini", "voyage", "mistral", "ollama", "local")})

# The order ``auto`` tries (spec 6.1, E1/E2); ollama and openai-compatible are never guessed.
AUTO_ORDER: tuple[str, ...] = ("local", "openai", "gemini", "voyage", "mistral")

# The environment variables each remote provider reads its API key from (first set one wins).
ENV_KEYS: Mapping[str, tuple[str, ...]] = MappingProxyType({
    "openai": ("OPENAI_API_KEY",), "gemini": ("GEMINI_API_KEY", "GOOGLE_API_KEY"),
    "voyage": ("VOYAGE_API_KEY",), "mistral": ("MISTRAL_API_KEY",), "ollama": ("OLLAMA_API_KEY",),
})

# The API-key variables of the remote providers ``auto`` tries.
AUTO_ENV_KEYS: tuple[str, ...] = tuple(k for name in AUTO_ORDER for k in ENV_KEYS.get(name, ()))


@dataclass(frozen=True)
class ProviderSelection:
    """The outcome of :func:`select_provider`: the ``provider`` (None: keyword-only), the
    ``requested`` name, why it is not in use, and the ``failure`` a search raises when it must
    report itself unavailable (its text: :attr:`error`)."""

    provider: EmbeddingProvider | None
    requested: str
    unavailable_reason: str | None = None
    failure: SearchUnavailableError | None = None

    @property
    def error(self) -> str | None:
        """``memory search unavailable: <provider>: <reason>`` (``failure``'s text), or ``None``."""
        return None if self.failure is None else str(self.failure)


def create_provider(name: str, settings: MemorySearchSettings, *,
                    env: Mapping[str, str] | None = None,
                    registry: Mapping[str, ProviderFactory] | None = None) -> EmbeddingProvider:
    """Create provider ``name`` from ``settings`` (no network call). Raises
    ``EmbeddingProviderUnavailableError``: unknown name, missing key, missing model file..."""
    factories = PROVIDERS if registry is None else registry
    factory = factories.get(name)
    if factory is None and name in get_args(ProviderName):  # a name OpenClaw's config takes
        raise EmbeddingProviderUnavailableError(name, f"OpenClaw's {name} embeddings are not among "
                                                f"qmdbridge's providers ({', '.join(factories)})")
    if factory is None:
        raise EmbeddingProviderUnavailableError(name, f"unknown embedding provider {name!r}")
    return factory(settings, env=os.environ if env is None else env)


def _select_auto(settings: MemorySearchSettings, env: Mapping[str, str],
                 registry: Mapping[str, ProviderFactory] | None) -> ProviderSelection:
    missing_keys: list[str] = []
    other: list[str] = []
    for name in AUTO_ORDER:
        try:
            return ProviderSelection(create_provider(name, settings, env=env, registry=registry),
                                     settings.provider)
        except EmbeddingProviderUnavailableError as exc:
            if exc.missing_api_key:
                missing_keys.append(name)
            else:
                other.append(exc.reason)
    reasons = ([f"no API key found for {', '.join(missing_keys)}"] if missing_keys else []) + other
    return ProviderSelection(None, settings.provider, unavailable_reason="; ".join(reasons))


def select_provider(settings: MemorySearchSettings, *, env: Mapping[str, str] | None = None,
                    registry: Mapping[str, ProviderFactory] | None = None) -> ProviderSelection:
    """Pick the embedding provider for ``settings`` (rules in the module docstring; no
    network call, never raises for an unavailable provider); ``env`` defaults to
    ``os.environ``, ``registry`` to :data:`PROVIDERS`."""
    environ: Mapping[str, str] = os.environ if env is None else env
    requested = settings.provider
    if requested == "none":
        return ProviderSelection(None, requested, unavailable_reason="provider set to none")
    if requested == "auto":
        return _select_auto(settings, environ, registry)
    try:
        return ProviderSelection(create_provider(requested, settings, env=environ,
                                                 registry=registry), requested)
    except EmbeddingProviderUnavailableError as exc:
        reason = exc.reason
    detail = reason
    fallback = (settings.fallback or "none").strip()
    if fallback not in ("none", "", requested):  # the fallback selected as if it were configured
        chosen = select_provider(settings.model_copy(update={"provider": fallback, "fallback": "none"}),
                                 env=environ, registry=registry)
        if chosen.provider is not None:
            return ProviderSelection(chosen.provider, requested, unavailable_reason=reason)
        detail += f"; fallback {fallback}: {chosen.unavailable_reason}"
    return ProviderSelection(None, requested, unavailable_reason=reason,
                             failure=SearchUnavailableError(requested, detail))
