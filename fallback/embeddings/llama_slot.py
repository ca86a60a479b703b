"""One llama.cpp model loaded on first use and used by one thread at a time.

Both in-process model users, the local embedding provider (``local_gguf.py``) and the local
reranker (``fallback/search/rerank.py``), hold their ``llama_cpp.Llama`` in a :class:`LlamaSlot`:
the load runs on the first call, inside the lock, in a worker thread; every call runs behind the
same lock (a llama.cpp context is not thread-safe); :meth:`LlamaSlot.aclose` drops the model so
that the next call loads it again.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from functools import partial
from typing import Any, TypeVar

import anyio

__all__ = ["LLAMA_CPP_MISSING", "LlamaSlot"]

T = TypeVar("T")

LLAMA_CPP_MISSING = "llama-cpp-python is not installed (pip install 'qmdbridge[local]')"


class LlamaSlot:
    """A lazily loaded llama.cpp model behind one lock.

    Args:
        load: builds the model (blocking); it raises the caller's own typed error
            (``EmbeddingProviderError``, ``RerankerError``...) when the file or the library is
            missing, and is called again on the next use after a failure.
    """

    def __init__(self, load: Callable[[], Any]) -> None:
        self._load = load
        self._lock = threading.Lock()
        self._llama: Any = None

    def run(self, fn: Callable[[Any], T]) -> T:
        """``fn(model)`` under the lock, loading the model first if needed (blocking).

        Raises:
            whatever ``load`` or ``fn`` raise.
        """
        with self._lock:
            if self._llama is None:
                self._llama = self._load()
            return fn(self._llama)

    async def call(self, fn: Callable[[Any], T]) -> T:
        """:meth:`run` in a worker thread (abandoned, not waited for, when cancelled)."""
        return await anyio.to_thread.run_sync(partial(self.run, fn), abandon_on_cancel=True)

    async def aclose(self) -> None:
        """Drop the loaded model (it is reloaded on the next call); waits for a running call."""
        def release() -> None:
            with self._lock:
                llama, self._llama = self._llama, None
            if llama is not None:
                llama.close()

        await anyio.to_thread.run_sync(release)
