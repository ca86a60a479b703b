"""The local provider: a GGUF embedding model run in-process by llama-cpp-python.

The model file (``local.modelPath``, ``~`` expanded) is loaded lazily, in a worker thread, on
the first call; every call runs in a worker thread (``anyio.to_thread.run_sync``) behind one
lock, because a llama.cpp context is not thread-safe. Vectors are L2-normalised. Texts longer
than the model's context are cut by llama.cpp (``truncate=True``: the first ``n_batch`` tokens,
512 for the test model) instead of failing. ``hf:`` and ``http(s):`` model URIs are not
downloaded: such a provider is reported unavailable.
"""

from __future__ import annotations

import importlib.util
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio

from fallback.embeddings.base import BaseProvider, CallPolicy, compute_provider_key
from fallback.errors import EmbeddingProviderError, EmbeddingProviderUnavailableError
from fallback.settings import MemorySearchSettings

__all__ = [
    "LLAMA_CPP_MISSING",
    "LocalGgufProvider",
    "from_settings",
    "is_llama_cpp_installed",
    "resolve_model_path",
]

LLAMA_CPP_MISSING = "llama-cpp-python is not installed (pip install 'qmdbridge[local]')"
NO_LOCAL_MODEL = "no local model configured"
# The spec-3 limit for local models; the model's own context (512 tokens for all-MiniLM-L6-v2)
# is enforced by truncation inside llama.cpp.
LOCAL_MAX_INPUT_TOKENS = 2048


def is_llama_cpp_installed() -> bool:
    """True when ``llama_cpp`` can be imported (checked without importing it)."""
    return importlib.util.find_spec("llama_cpp") is not None


def resolve_model_path(model_path: str | None) -> Path:
    """The local model file from ``local.modelPath`` (``~`` expanded, made absolute).

    Raises:
        EmbeddingProviderUnavailableError: not configured, a remote URI (``hf:``, ``http(s):``;
            nothing is downloaded here), or no such file.
    """
    raw = (model_path or "").strip()
    if not raw:
        raise EmbeddingProviderUnavailableError("local", NO_LOCAL_MODEL)
    if raw.startswith(("hf:", "http:", "https:")):
        raise EmbeddingProviderUnavailableError(
            "local", f"local.modelPath {raw} is a remote URI and cannot be downloaded here; "
                     "download the GGUF file and set local.modelPath to its path")
    path = Path(raw).expanduser().resolve()
    if not path.is_file():
        raise EmbeddingProviderUnavailableError("local", f"local model file not found: {path}")
    return path


class LocalGgufProvider(BaseProvider):
    """llama-cpp-python embeddings of a GGUF model.

    Attributes:
        model_path: absolute path of the GGUF file.
    """

    provider_id = "local"

    def __init__(self, *, model_path: Path, model: str | None = None,
                 policy: CallPolicy | None = None) -> None:
        """Args:
            model_path: the GGUF file (must exist; see :func:`resolve_model_path`).
            model: model id for the index identity (default: the file path).
            policy: timeouts (default 300 s query / 600 s batch) and retries.
        """
        name = model or str(model_path)
        super().__init__(model=name, normalize=True, max_input_tokens=LOCAL_MAX_INPUT_TOKENS,
                         policy=policy or CallPolicy.local(),
                         provider_key=compute_provider_key(self.provider_id, name))
        self.model_path = model_path
        self._lock = threading.Lock()
        self._llama: Any = None

    def _load_locked(self) -> Any:
        if self._llama is None:
            try:
                from llama_cpp import Llama
            except ImportError as exc:
                raise EmbeddingProviderUnavailableError("local", LLAMA_CPP_MISSING) from exc
            try:
                self._llama = Llama(model_path=str(self.model_path), embedding=True,
                                    verbose=False)
            except (ValueError, RuntimeError, OSError) as exc:
                raise EmbeddingProviderError(
                    "local", f"cannot load embedding model {self.model_path}: {exc}") from exc
        return self._llama

    def _embed_sync(self, texts: list[str]) -> list[list[float]]:
        with self._lock:
            llama = self._load_locked()
            try:
                vectors = llama.embed(texts, normalize=True, truncate=True)
            except (ValueError, RuntimeError) as exc:
                raise EmbeddingProviderError("local", f"llama.cpp embedding failed: {exc}") from exc
        return [list(v) for v in vectors]

    async def _request_query(self, text: str) -> list[float]:
        vectors = await anyio.to_thread.run_sync(self._embed_sync, [text], abandon_on_cancel=True)
        return vectors[0] if vectors else []

    async def _request_batch(self, texts: list[str]) -> list[list[float]]:
        return await anyio.to_thread.run_sync(self._embed_sync, list(texts),
                                              abandon_on_cancel=True)

    async def aclose(self) -> None:
        """Drop the loaded model (it is reloaded on the next call)."""
        def release() -> None:
            with self._lock:
                llama, self._llama = self._llama, None
            if llama is not None:
                llama.close()

        await anyio.to_thread.run_sync(release)


def from_settings(settings: MemorySearchSettings, *, env: Mapping[str, str],
                  policy: CallPolicy | None = None) -> LocalGgufProvider:
    """Create the local provider (the model is loaded on the first call, not here).

    ``env`` is unused (kept for the common factory signature). The batch timeout honours
    ``sync.embeddingBatchTimeoutSeconds``.

    Raises:
        EmbeddingProviderUnavailableError: no usable model path, or llama-cpp-python missing.
    """
    path = resolve_model_path(settings.local.model_path)
    if not is_llama_cpp_installed():
        raise EmbeddingProviderUnavailableError("local", LLAMA_CPP_MISSING)
    return LocalGgufProvider(
        model_path=path, model=settings.model.strip() or None,
        policy=policy or CallPolicy.local(
            batch_timeout_s=settings.sync.embedding_batch_timeout_seconds))
