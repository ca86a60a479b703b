"""One llama.cpp model loaded on first use and used by one thread at a time.

The local embedding provider and the local reranker hold their ``llama_cpp.Llama`` here: a
llama.cpp context is not thread-safe, so loading and every call run behind one lock.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

import anyio

__all__ = ["LLAMA_CPP_MISSING", "LlamaSlot"]

T = TypeVar("T")

LLAMA_CPP_MISSING = "llama-cpp-python is not installed (pip install 'qmdbridge[local]')"


class LlamaSlot:
    """A lazily loaded llama.cpp model behind one lock; ``load`` builds it (blocking, raising
    the caller's typed error) and is called again on the next use after a failure."""

    def __init__(self, load: Callable[[], Any]) -> None:
        self._load = load
        self._lock = threading.Lock()
        self._llama: Any = None

    async def call(self, fn: Callable[[Any], T]) -> T:
        """``fn(model)`` under the lock in a worker thread (abandoned, not waited for, when
        cancelled), loading the model first if needed; raises what ``load`` or ``fn`` raise."""
        def run() -> T:
            with self._lock:
                if self._llama is None:
                    self._llama = self._load()
                return fn(self._llama)

        return await anyio.to_thread.run_sync(run, abandon_on_cancel=True)

    async def aclose(self) -> None:
        """Drop the loaded model (it is reloaded on the next call); waits for a running call."""
        def release() -> None:
            with self._lock:
                llama, self._llama = self._llama, None
            if llama is not None:
                llama.close()

        await anyio.to_thread.run_sync(release)
