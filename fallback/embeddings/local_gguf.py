"""The local provider: a GGUF embedding model run in-process by llama-cpp-python.

``local.modelPath`` is a file path, an ``hf:<owner>/<repo>/<file>.gguf`` URI downloaded into the
model cache on first use, or nothing with ``provider: "local"`` (the default model, downloaded
the same way); ``auto`` never downloads. The model is loaded lazily in a worker thread
(:class:`~fallback.embeddings.llama_slot.LlamaSlot`); vectors are L2-normalised, and texts
longer than the model's context are truncated by llama.cpp.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import anyio

from fallback.embeddings import model_fetch
from fallback.embeddings.base import BaseProvider, CallPolicy, compute_provider_key
from fallback.embeddings.llama_slot import LLAMA_CPP_MISSING, LlamaSlot
from fallback.embeddings.model_fetch import DEFAULT_MODEL, ModelRef, ModelSpec
from fallback.errors import EmbeddingProviderError, EmbeddingProviderUnavailableError
from fallback.settings import MemorySearchSettings

__all__ = ["LLAMA_CPP_MISSING", "LocalGgufProvider", "ModelDownload", "ModelSource",
           "from_settings", "is_llama_cpp_installed", "resolve_model_source"]

NO_LOCAL_MODEL = "no local model configured"
# The spec-3 limit for local models (llama.cpp truncates to the model's own context).
LOCAL_MAX_INPUT_TOKENS = 2048


def is_llama_cpp_installed() -> bool:
    """True when ``llama_cpp`` can be imported (checked without importing it)."""
    return importlib.util.find_spec("llama_cpp") is not None


@dataclass(frozen=True)
class ModelDownload:
    """A ``model`` (a known :class:`ModelSpec` or a bare ``hf:`` ref) to download into
    ``cache_dir`` from the hub at ``base_url`` before first use."""

    model: ModelSpec | ModelRef
    cache_dir: Path
    base_url: str


@dataclass(frozen=True)
class ModelSource:
    """Where the local provider's GGUF file is (``path``, maybe not downloaded yet), its
    identity ``name`` (the ``hf:`` URI or the path), the pending ``download`` and the
    ``query_prefix`` put before search queries."""

    path: Path
    name: str
    download: ModelDownload | None = None
    query_prefix: str = ""


def resolve_model_source(model_path: str | None, *, explicit: bool, cache_dir: Path,
                         base_url: str = model_fetch.DEFAULT_HF_ENDPOINT) -> ModelSource:
    """Where the GGUF model of ``local.modelPath`` comes from (rules in the module docstring),
    cached in ``cache_dir`` from the hub ``base_url``; ``explicit`` for ``provider: "local"``
    (may download), else (``auto``) only a file on disk or an already cached URI qualifies.

    Raises ``EmbeddingProviderUnavailableError``: nothing usable (the reason says what to set).
    """
    raw = (model_path or "").strip()
    if not raw and not explicit:
        raise EmbeddingProviderUnavailableError("local", NO_LOCAL_MODEL)
    if not raw or raw.startswith(model_fetch.HF_URI_PREFIX):
        try:
            found = model_fetch.find_model(raw) if raw else DEFAULT_MODEL
        except ValueError as exc:
            raise EmbeddingProviderUnavailableError("local", f"local.modelPath: {exc}") from None
        spec, ref = (found, found.ref) if isinstance(found, ModelSpec) else (None, found)
        path = ref.cache_path(cache_dir)
        cached = path.is_file()
        if not cached and not explicit:
            raise EmbeddingProviderUnavailableError(
                "local", f"local.modelPath {raw} is not downloaded yet; set provider: \"local\" to "
                         f"download it on first use, or run `qmdbridge models pull {raw}`")
        return ModelSource(path=path, name=ref.uri,
                           download=None if cached else ModelDownload(found, cache_dir, base_url),
                           query_prefix=spec.query_prefix if spec is not None else "")
    if raw.startswith(("http:", "https:")):
        raise EmbeddingProviderUnavailableError(
            "local", f"local.modelPath {raw} is a URL; give a file path or an "
                     "hf:<owner>/<repo>/<file>.gguf URI (downloaded on first use)")
    path = Path(raw).expanduser().resolve()
    if not path.is_file():
        raise EmbeddingProviderUnavailableError("local", f"local model file not found: {path}")
    return ModelSource(path=path, name=str(path))


class LocalGgufProvider(BaseProvider):
    """llama-cpp-python embeddings of a GGUF model."""

    provider_id = "local"

    def __init__(self, *, model_path: Path, model: str | None = None,
                 policy: CallPolicy | None = None, download: ModelDownload | None = None,
                 query_prefix: str = "") -> None:
        """``model_path``: the GGUF file (it may wait for ``download`` before the first
        embedding, outside ``policy``'s timeouts); ``model``: the id in the index identity
        (default: the path); ``query_prefix``: put before search queries, not chunks."""
        name = model or str(model_path)
        super().__init__(model=name, normalize=True, max_input_tokens=LOCAL_MAX_INPUT_TOKENS,
                         policy=policy or CallPolicy.local(),
                         provider_key=compute_provider_key(self.provider_id, name))
        self.model_path = model_path
        self.download = download
        self.query_prefix = query_prefix
        self._download_lock = anyio.Lock()
        self._model = LlamaSlot(self._load)

    async def ensure_model(self) -> Path:
        """Download the model into the cache when it is not there yet (no deadline; a
        cancelled download resumes next time); returns the file. Raises ``ModelDownloadError``."""
        async with self._download_lock:
            if self.download is not None and not self.model_path.is_file():
                d = self.download
                result = await anyio.to_thread.run_sync(partial(
                    model_fetch.fetch_model, d.model, d.cache_dir, base_url=d.base_url,
                    on_progress=model_fetch.stderr_progress(d.model.uri)), abandon_on_cancel=True)
                self.model_path = result.path
            self.download = None
            return self.model_path

    def model_problem(self) -> str | None:
        """``local model <hf: URI> is not downloaded yet (<cache path>)``, else ``None``."""
        d = self.download
        if d is None or self.model_path.is_file():
            return None
        return f"local model {d.model.uri} is not downloaded yet ({self.model_path})"

    async def embed_query(self, text: str) -> list[float]:
        """Embed a search query (with :attr:`query_prefix`), downloading the model first if
        needed. Raises ``EmbeddingProviderError`` (``ModelDownloadError`` for a download)."""
        await self.ensure_model()
        return await super().embed_query(self.query_prefix + text)

    async def embed_batch(self, texts: list[str]) -> list[list[float]]:
        """Embed chunks, downloading the model first if needed. Raises
        ``EmbeddingProviderError`` (``ModelDownloadError`` for a download)."""
        if texts:
            await self.ensure_model()
        return await super().embed_batch(texts)

    def _load(self) -> Any:
        try:
            from llama_cpp import Llama
        except ImportError as exc:
            raise EmbeddingProviderUnavailableError("local", LLAMA_CPP_MISSING) from exc
        try:
            return Llama(model_path=str(self.model_path), embedding=True, verbose=False)
        except (ValueError, RuntimeError, OSError) as exc:
            raise EmbeddingProviderError(
                "local", f"cannot load embedding model {self.model_path}: {exc}") from exc

    async def _request_batch(self, texts: list[str]) -> list[list[float]]:
        def embed(llama: Any) -> list[list[float]]:
            try:
                vectors = llama.embed(list(texts), normalize=True, truncate=True)
            except (ValueError, RuntimeError) as exc:
                raise EmbeddingProviderError("local", f"llama.cpp embedding failed: {exc}") from exc
            return [list(v) for v in vectors]

        return await self._model.call(embed)  # a query is a batch of one (BaseProvider)

    async def aclose(self) -> None:
        """Drop the loaded model (it is reloaded on the next call)."""
        await self._model.aclose()


def from_settings(settings: MemorySearchSettings, *, env: Mapping[str, str],
                  policy: CallPolicy | None = None) -> LocalGgufProvider:
    """Create the local provider (no network call: a download waits for the first embedding;
    ``env`` gives the model cache and the hub). Raises ``EmbeddingProviderUnavailableError``:
    no usable model (:func:`resolve_model_source`), or llama-cpp-python missing."""
    source = resolve_model_source(
        settings.local.model_path, explicit="local" in (settings.provider, settings.fallback.strip()),
        cache_dir=model_fetch.default_cache_dir(settings.local.model_cache_dir, env),
        base_url=model_fetch.hub_base_url(env))
    if not is_llama_cpp_installed():
        raise EmbeddingProviderUnavailableError("local", LLAMA_CPP_MISSING)
    return LocalGgufProvider(
        model_path=source.path, model=settings.model.strip() or source.name,
        download=source.download, query_prefix=source.query_prefix,
        policy=policy or CallPolicy.local(
            batch_timeout_s=settings.sync.embedding_batch_timeout_seconds))
