"""The one exception hierarchy of qmdbridge and its builtin engine.

Every error raised on purpose derives from :class:`MemorySearchError`::

    MemorySearchError
     +-- ConfigError, UsageError, PathRefusedError, MemoryFileNotFoundError
     +-- BackendUnavailableError         a backend cannot answer: the manager falls back
     |    +-- SearchUnavailableError     ... its configured embedding provider cannot work
     |    +-- BackendTimeoutError        ... past its deadline (also a TimeoutError)
     |    +-- QmdCommandError, QmdOutputError, QmdMcpError   (qmdbridge/qmd/errors.py)
     |    +-- PostgresUnavailableError, PostgresTimeoutError (fallback/store/postgres/errors.py)
     +-- IndexStoreError                 a store failure; subclasses Locked, ReadOnly, Corrupt,
     |                                   Full (fallback/store/errors.py) and PostgresStoreError
     +-- LockTimeoutError                an inter-process file lock stayed held (a TimeoutError)
     +-- EmbeddingProviderError          an embedding call failed
     |    +-- EmbeddingProviderUnavailableError  ... no provider (no key, no model)
     |    |    +-- ModelDownloadError            ... its model file cannot be downloaded
     |    +-- EmbeddingDimensionsError           ... vectors changed size under one model id
     +-- RerankerError                   the reranker failed (the search keeps the fused order)
     +-- ManagerClosedError              a closed MemoryManager was used

Foreign exceptions are translated in one place per library, with ``raise ... from exc``:
SQLite in ``fallback/store/errors.py``, ``psycopg`` in ``fallback/store/postgres/errors.py``,
subprocesses in ``qmdbridge/qmd/runner.py``, HTTP in ``fallback/embeddings/_http.py``.
"""

from __future__ import annotations

__all__ = ["BackendTimeoutError", "BackendUnavailableError", "ConfigError",
           "EmbeddingDimensionsError", "EmbeddingProviderError",
           "EmbeddingProviderUnavailableError", "IndexStoreError", "LockTimeoutError",
           "ManagerClosedError", "MemoryFileNotFoundError", "MemorySearchError",
           "ModelDownloadError", "PathRefusedError", "RerankerError", "SearchUnavailableError",
           "UsageError"]


class MemorySearchError(Exception):
    """Base class of every error qmdbridge raises on purpose."""


class ConfigError(MemorySearchError):
    """Raised when a config file cannot be parsed or a value is invalid: ``file`` (``None`` for
    values from code or flags), the dotted ``key`` (``memory.qmd.limits.timeoutMs``; ``None``: a
    syntax error) and what was ``expected``, in words."""

    def __init__(self, message: str, *, file: str | None = None, key: str | None = None,
                 expected: str | None = None) -> None:
        self.file = file
        self.key = key
        self.expected = expected
        where = (file or "<config>") + (f": {key}" if key else "")
        detail = message if not expected else f"{message} (expected {expected})"
        super().__init__(f"{where}: {detail}")


class UsageError(MemorySearchError):
    """Raised when a call is malformed: an empty query, a non-positive limit, and the like."""


class PathRefusedError(MemorySearchError):
    """Raised when ``memory_get`` is asked for a ``path`` that is not a memory file: a short
    ``reason`` (``symlink``, ``not markdown`` ...: ``fallback/sources/read_page.py``) and a
    ``hint`` saying what would allow it, or ``None``."""

    def __init__(self, path: str, reason: str, *, hint: str | None = None) -> None:
        self.path = path
        self.reason = reason
        self.hint = hint
        super().__init__(f"path refused: {path!r}: {reason}" + (f" ({hint})" if hint else ""))


class MemoryFileNotFoundError(MemorySearchError):
    """Raised when a ``path`` the memory rule allows names no file (``reason``: ``no such file``
    or ``a parent is not a folder``); ``memory_get`` answers an empty page, ``missing=True``."""

    def __init__(self, path: str, reason: str = "no such file") -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"no such memory file: {path!r}: {reason}")


class BackendUnavailableError(MemorySearchError):
    """Raised when a ``backend`` (``qmd``, ``builtin``) cannot answer, with a one-line
    ``reason``; the manager falls back on it. ``message`` replaces ``<backend> unavailable: <reason>``."""

    def __init__(self, backend: str, reason: str, *, message: str | None = None) -> None:
        self.backend = backend
        self.reason = reason
        super().__init__(message or f"{backend} unavailable: {reason}")


class SearchUnavailableError(BackendUnavailableError):
    """Raised when an explicitly configured embedding provider cannot work (search fails
    closed): ``memory search unavailable: <provider>: <reason>``."""

    def __init__(self, provider: str, reason: str) -> None:
        super().__init__("builtin", reason, message=f"memory search unavailable: {provider}: {reason}")
        self.provider = provider


class BackendTimeoutError(BackendUnavailableError, TimeoutError):
    """Raised when a backend call runs past its deadline: ``<summary> timed out after
    <timeout_ms>ms (<setting>); <hint>``. ``summary``: the call (``qmd search foo --json -n 6``);
    ``timeout_ms``: the deadline, in ms; ``setting``: its config key; ``hint``: what may have
    made it slow (``setting`` and ``hint``: ``None`` when unknown)."""

    def __init__(self, backend: str, summary: str, timeout_ms: int, *,
                 setting: str | None = None, hint: str | None = None) -> None:
        self.timeout_ms, self.summary, self.setting, self.hint = timeout_ms, summary, setting, hint
        super().__init__(backend, f"{summary} timed out after {timeout_ms}ms"
                         + (f" ({setting})" if setting else "") + (f"; {hint}" if hint else ""))


class IndexStoreError(MemorySearchError):
    """Raised when the store fails (subclasses in ``fallback/store/errors.py``) at ``db_path``."""

    def __init__(self, message: str, *, db_path: str | None = None) -> None:
        self.db_path = db_path
        super().__init__(f"{message}" + (f" ({db_path})" if db_path else ""))


class LockTimeoutError(MemorySearchError, TimeoutError):
    """Raised when an inter-process file lock (``fallback/fs/lock.py``) at ``path`` is still held
    when the wait budget (``timeout_ms``, in ms) runs out; ``holder_pid``: the live holder's
    recorded pid, or ``None``."""

    def __init__(self, path: str, timeout_ms: int, holder_pid: int | None) -> None:
        self.path, self.timeout_ms, self.holder_pid = path, timeout_ms, holder_pid
        who = f"another process (pid {holder_pid})" if holder_pid is not None else "another process"
        super().__init__(f"{who} holds the lock {path}; waiting for it timed out after {timeout_ms} ms")


class EmbeddingProviderError(MemorySearchError):
    """Raised when an embedding call of ``provider`` (``openai``, ``local`` ...) fails; the
    message always contains "embedding", ``detail`` is it without the ``<provider> embedding
    failed`` prefix. ``status``: the HTTP status (``None`` for transport or local errors);
    ``retryable`` for 429, 5xx and transport errors; ``retry_after_s``: the server's
    Retry-After in seconds, when sent."""

    def __init__(self, provider: str, message: str, *, status: int | None = None,
                 retryable: bool = False, retry_after_s: float | None = None) -> None:
        self.provider = provider
        self.status = status
        self.retryable = retryable
        self.retry_after_s = retry_after_s
        self.detail = message
        prefix = f"{provider} embedding failed"
        if status is not None:
            prefix += f" (HTTP {status})"
        super().__init__(f"{prefix}: {message}")


class EmbeddingProviderUnavailableError(EmbeddingProviderError):
    """Raised when an embedding provider cannot be created: a one-line ``reason`` (``no API key
    found for openai``); ``missing_api_key`` when that is the only problem (``auto`` skips it)."""

    def __init__(self, provider: str, reason: str, *, missing_api_key: bool = False) -> None:
        super().__init__(provider, reason)
        self.reason = reason
        self.missing_api_key = missing_api_key
        Exception.__init__(self, f"{provider} embedding provider unavailable: {reason}")


class ModelDownloadError(EmbeddingProviderUnavailableError):
    """Raised when a GGUF model (``uri``: ``hf:<owner>/<repo>/<file>``) cannot be downloaded
    into the model cache; the reason starts with ``offline:`` when the hub was unreachable."""

    def __init__(self, uri: str, reason: str) -> None:
        super().__init__("local", reason)
        self.uri = uri


class EmbeddingDimensionsError(EmbeddingProviderError):
    """Raised when a provider's vectors change length under the same model id; the provider
    has adopted the new length (``got``, was ``expected``) and the index rebuilds."""

    def __init__(self, provider: str, *, expected: int, got: int, model: str) -> None:
        super().__init__(provider, f"embedding has {got} dimensions, expected {expected} "
                                   f"(model {model})")
        self.expected = expected
        self.got = got


class RerankerError(MemorySearchError):
    """Raised when the reranker stage (``provider`` ``http`` or ``local``) cannot score the
    candidates, the search keeping the fused order: a one-line ``reason`` (``HTTP 500: model
    overloaded``) and the HTTP ``status`` or ``None``."""

    def __init__(self, provider: str, reason: str, *, status: int | None = None) -> None:
        self.provider = provider
        self.reason = reason
        self.status = status
        super().__init__(f"{provider} reranker failed: {reason}")


class ManagerClosedError(MemorySearchError):
    """Raised when a closed MemoryManager or engine is used."""
