"""The embedding provider protocol and the pieces every provider shares (queries and
documents may be embedded differently, so there are two calls)."""

from __future__ import annotations

import hashlib
import json
import math
import random
import re
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

import anyio
import anyio.abc

from fallback.errors import EmbeddingDimensionsError, EmbeddingProviderError

if TYPE_CHECKING:
    from fallback.embeddings.batch_jobs import BatchRunner

__all__ = ["BATCH_TIMEOUT_S", "LOCAL_BATCH_TIMEOUT_S", "LOCAL_QUERY_TIMEOUT_S", "MAX_BATCH_BYTES",
           "QUERY_TIMEOUT_S", "BaseProvider", "CallPolicy", "EmbeddingProvider",
           "compute_provider_key", "group_by_bytes", "max_input_tokens_for",
           "probe", "retry_wait_s", "sanitize_vector"]

T_in = TypeVar("T_in")
T_out = TypeVar("T_out")


# Request batches hold at most this many UTF-8 bytes (spec 6.3; also the chunk-split cap of spec 3).
MAX_BATCH_BYTES = 8000
# Default parallel requests per embed_batch call (ollama and local use 1).
DEFAULT_CONCURRENCY = 4
# Per-call timeouts in seconds (spec 6.4): remote query/batch, local query/batch.
QUERY_TIMEOUT_S = 60.0
BATCH_TIMEOUT_S = 120.0
LOCAL_QUERY_TIMEOUT_S = 300.0
LOCAL_BATCH_TIMEOUT_S = 600.0
# Retry policy (spec 6.4, E2+): 3 calls in total, 500 ms doubling, jitter x[1, 1.2], cap 8 s.
RETRY_ATTEMPTS = 3
RETRY_BASE_S = 0.5
RETRY_MAX_S = 8.0
RETRY_JITTER = (1.0, 1.2)
# Vectors with a smaller L2 magnitude are left as they are instead of being normalised.
MIN_NORM = 1e-10

# Provider input limits in tokens (spec 3 table), then per-provider defaults.
_KNOWN_MAX_INPUT_TOKENS = {
    ("openai", "text-embedding-3-small"): 8192, ("openai", "text-embedding-3-large"): 8192,
    ("openai", "text-embedding-ada-002"): 8191, ("gemini", "text-embedding-004"): 2048,
    ("voyage", "voyage-3"): 32000, ("voyage", "voyage-3-lite"): 16000, ("voyage", "voyage-code-3"): 32000,
}
_DEFAULT_MAX_INPUT_TOKENS = {"gemini": 2048, "local": 2048}
FALLBACK_MAX_INPUT_TOKENS = 8192

# Headers that carry credentials: never part of the provider key (spec 4.3).
_SECRET_HEADERS = frozenset({"authorization", "x-goog-api-key"})

# Error text that means "this request was too big; a smaller batch may pass" (spec 6.4, E2+).
_SPLITTABLE_RE = re.compile(
    r"maximum context length|max input length|too many inputs|batch size is invalid"
    r"|request header fields too large|payload too large|request entity too large",
    re.IGNORECASE,
)
_SPLITTABLE_STATUS = frozenset({413, 431})


def max_input_tokens_for(provider_id: str, model: str) -> int:
    """Input limit of a provider/model in tokens (spec section 3 table)."""
    return _KNOWN_MAX_INPUT_TOKENS.get((provider_id, model),
                                       _DEFAULT_MAX_INPUT_TOKENS.get(provider_id, FALLBACK_MAX_INPUT_TOKENS))


def compute_provider_key(provider_id: str, model: str, *, base_url: str | None = None,
                         headers: Mapping[str, str] | None = None,
                         extra: Mapping[str, object] | None = None) -> str:
    """sha256 hex of the provider's endpoint fingerprint: compact JSON of provider, base URL,
    model, headers (sorted, credentials dropped, so a key rotation keeps the index) and the
    ``extra`` entries that are not None.

    Source: OpenClaw ``computeProviderKey`` (spec 4.3).
    """
    data: dict[str, object] = {"provider": provider_id}
    if base_url is not None:
        data["baseUrl"] = base_url
    data["model"] = model
    if base_url is not None or headers:
        pairs = sorted(((k, v) for k, v in (headers or {}).items()
                        if k.lower() not in _SECRET_HEADERS), key=lambda kv: kv[0].lower())
        data["headers"] = [[k, v] for k, v in pairs]
    for key, value in (extra or {}).items():
        if value is not None:
            data[key] = value
    blob = json.dumps(data, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def sanitize_vector(values: Sequence[float], *, normalize: bool) -> list[float]:
    """``values`` as floats, non-finite entries 0, L2-normalised with ``normalize`` (unless
    the magnitude is below :data:`MIN_NORM`). Source: spec 6.2."""
    out = [float(v) if math.isfinite(v) else 0.0 for v in values]
    if normalize:
        magnitude = math.sqrt(math.fsum(v * v for v in out))
        if magnitude >= MIN_NORM:
            out = [v / magnitude for v in out]
    return out


def group_by_bytes(texts: Sequence[str], *, max_bytes: int = MAX_BATCH_BYTES) -> list[list[int]]:
    """Indices of ``texts`` in order, grouped into batches of at most ``max_bytes`` UTF-8
    bytes (a larger text alone). Source: spec 6.3 step 2."""
    groups: list[list[int]] = []
    current: list[int] = []
    size = 0
    for i, text in enumerate(texts):
        n = len(text.encode("utf-8"))
        if current and size + n > max_bytes:
            groups.append(current)
            current, size = [], 0
        current.append(i)
        size += n
    if current:
        groups.append(current)
    return groups


def retry_wait_s(attempt: int, *, retry_after_s: float | None = None, base_s: float = RETRY_BASE_S,
                 jitter: float | None = None) -> float:
    """Seconds to wait before retry ``attempt`` (1-based): Retry-After when given, else
    ``base_s * 2**(attempt-1)`` times a jitter in [1, 1.2]; capped at 8 s. Source: spec 6.4."""
    if retry_after_s is not None:
        return max(0.0, min(float(retry_after_s), RETRY_MAX_S))
    factor = random.uniform(*RETRY_JITTER) if jitter is None else jitter
    return min(base_s * (2 ** (attempt - 1)) * factor, RETRY_MAX_S)


@dataclass(frozen=True)
class CallPolicy:
    """How a provider runs its requests: parallel requests per ``embed_batch``, per-attempt
    deadlines in seconds, calls in total per request, and the first back-off wait in seconds."""

    concurrency: int = DEFAULT_CONCURRENCY
    query_timeout_s: float = QUERY_TIMEOUT_S
    batch_timeout_s: float = BATCH_TIMEOUT_S
    retry_attempts: int = RETRY_ATTEMPTS
    retry_base_s: float = RETRY_BASE_S

    @classmethod
    def remote(cls, *, concurrency: int | None = None,
               batch_timeout_s: float | None = None) -> CallPolicy:
        """Remote defaults (4 parallel, 60 s / 120 s), with optional overrides."""
        return cls(concurrency=max(1, concurrency or DEFAULT_CONCURRENCY),
                   batch_timeout_s=batch_timeout_s or BATCH_TIMEOUT_S)

    @classmethod
    def local(cls, *, batch_timeout_s: float | None = None) -> CallPolicy:
        """Local GGUF defaults (1 at a time, 300 s / 600 s)."""
        return cls(concurrency=1, query_timeout_s=LOCAL_QUERY_TIMEOUT_S,
                   batch_timeout_s=batch_timeout_s or LOCAL_BATCH_TIMEOUT_S)


class BaseProvider:
    """Every embedding provider (``provider_id``, ``model``, ``dims`` when known, its
    :func:`compute_provider_key`, input limit in tokens, batch limit in UTF-8 bytes) and the
    machinery they share: batching, retries, halving, timeouts, checks.

    A subclass sets ``provider_id`` and implements ``_request_batch(texts)`` (and optionally
    ``_request_query``), one request each; this class adds timeouts, retries (never past the
    caller's anyio deadline; a Retry-After beyond 8 s makes calls fail at once until it ends),
    halving of batches rejected as too large, byte-bounded grouping and dimension checks.

    Source: simonw/llm ``EmbeddingModel``; OpenClaw ``embedBatchWithRetry`` (spec 6.3, 6.4).
    """

    provider_id: str = ""
    max_batch_bytes: int = MAX_BATCH_BYTES

    def __init__(self, *, model: str, provider_key: str, dims: int | None = None,
                 max_input_tokens: int | None = None, normalize: bool = False,
                 policy: CallPolicy | None = None) -> None:
        """``dims``: the configured vector length (None: learned from the first vector);
        ``max_input_tokens`` defaults to :func:`max_input_tokens_for`; ``normalize``: L2."""
        self.model = model
        self.provider_key = provider_key
        self.dims = dims
        self.max_input_tokens = max_input_tokens or max_input_tokens_for(self.provider_id, model)
        self.normalize = normalize
        self.policy = policy or CallPolicy()
        self.batch_runner: BatchRunner | None = None  # batch jobs embed_batch uses when enabled
        self._configured_dims = dims
        # (monotonic time before which no request is sent, the 429 that asked for it)
        self._rate_limit: tuple[float, EmbeddingProviderError] | None = None

    def model_problem(self) -> str | None:
        """Why the provider cannot embed, known without a call (a model file not downloaded
        yet), or ``None``."""
        return None

    async def ensure_model(self) -> object:
        """Bring the model in before a search's deadline starts (a local model is downloaded
        on first use); nothing to do here. Raises ``EmbeddingProviderError``."""

    async def _request_query(self, text: str) -> list[float]:
        """One query request; subclasses override. Default: a batch of one."""
        vectors = await self._request_batch([text])
        return vectors[0] if vectors else []

    async def _request_batch(self, texts: list[str]) -> list[list[float]]:
        """One document request for ``texts``; subclasses must override."""
        raise NotImplementedError

    async def embed_query(self, text: str) -> list[float]:
        """Embed one search query: the sanitised vector (``[]`` when none came back).
        Raises ``EmbeddingProviderError``."""
        vector = await self._with_retry(self._request_query, text, kind="query",
                                        timeout_s=self.policy.query_timeout_s)
        return self._check([vector])[0]

    async def embed_batch(self, texts: list[str]) -> list[list[float]]:
        """Embed documents (through the batch-job runner when it is enabled); result ``i``
        belongs to ``texts[i]`` (``[]`` when missing). Raises ``EmbeddingProviderError``."""
        if not texts:
            return []
        if self.batch_runner is not None and self.batch_runner.enabled:
            vectors = await self.batch_runner.run(list(texts))
            if vectors is not None:
                return self._check(vectors, count=len(texts))
        results: list[list[float]] = [[] for _ in texts]
        errors: list[EmbeddingProviderError] = []
        limiter = anyio.CapacityLimiter(max(1, self.policy.concurrency))

        async def run_group(indices: list[int], tg: anyio.abc.TaskGroup) -> None:
            async with limiter:
                if errors:
                    return
                try:
                    vectors = await self._embed_group([texts[i] for i in indices])
                except EmbeddingProviderError as exc:
                    errors.append(exc)
                    tg.cancel_scope.cancel()
                    return
            for pos, i in enumerate(indices):
                results[i] = vectors[pos] if pos < len(vectors) else []

        async with anyio.create_task_group() as tg:
            for indices in group_by_bytes(texts, max_bytes=self.max_batch_bytes):
                tg.start_soon(run_group, indices, tg)
        if errors:
            raise errors[0]
        return self._check(results)

    async def _embed_group(self, texts: list[str]) -> list[list[float]]:
        try:
            return await self._with_retry(self._request_batch, texts, kind="batch",
                                          timeout_s=self.policy.batch_timeout_s)
        except EmbeddingProviderError as exc:
            # rejected as too large (413/431 or a size message): halves may pass
            if len(texts) > 1 and (exc.status in _SPLITTABLE_STATUS or _SPLITTABLE_RE.search(str(exc))):
                mid = len(texts) // 2
                return await self._embed_group(texts[:mid]) + await self._embed_group(texts[mid:])
            raise

    def _check_not_rate_limited(self) -> None:
        """Raise while the provider's last ``Retry-After`` (beyond the 8 s retry cap) runs."""
        blocked = self._rate_limit
        if blocked is None:
            return
        until, last = blocked
        left = until - time.monotonic()
        if left <= 0:
            self._rate_limit = None
            return
        raise EmbeddingProviderError(
            self.provider_id, f"{last.detail} (rate limited: Retry-After asks to wait "
                              f"{math.ceil(left)} s more; not called again until then)",
            status=last.status, retryable=True, retry_after_s=left)

    async def _with_retry(self, call: Callable[[T_in], Awaitable[T_out]], arg: T_in, *, kind: str,
                          timeout_s: float) -> T_out:
        """One request with retries (:func:`retry_wait_s`) within the caller's deadline; a
        timed-out request is not retried (the next sync tries again), nor one whose Retry-After
        passes the 8 s cap (calls then fail at once until it ends)."""
        self._check_not_rate_limited()
        attempt = 1
        while True:
            try:
                with anyio.fail_after(timeout_s):
                    return await call(arg)
            except TimeoutError as exc:
                raise EmbeddingProviderError(
                    self.provider_id, f"memory embeddings {kind} timed out after {timeout_s:g}s",
                    retryable=False) from exc
            except EmbeddingProviderError as exc:
                after = exc.retry_after_s
                if exc.retryable and after is not None and after > RETRY_MAX_S:
                    self._rate_limit = (time.monotonic() + after, exc)
                    raise
                wait_s = retry_wait_s(attempt, retry_after_s=after, base_s=self.policy.retry_base_s)
                left = anyio.current_effective_deadline() - anyio.current_time()
                if not exc.retryable or attempt >= self.policy.retry_attempts or wait_s >= left:
                    raise
            await anyio.sleep(wait_s)
            attempt += 1

    def _check(self, vectors: list[list[float]], *, count: int | None = None) -> list[list[float]]:
        """Sanitise vectors and enforce one dimensionality; pad to ``count`` with ``[]``.
        Raises ``EmbeddingProviderError`` (not numbers, or not the configured ``dimensions``),
        ``EmbeddingDimensionsError`` (not the learned length, which is adopted first)."""
        out: list[list[float]] = []
        for vector in vectors:
            try:
                clean = sanitize_vector(vector, normalize=self.normalize) if vector else []
            except TypeError:
                raise EmbeddingProviderError(self.provider_id, "response embedding is not a list of "
                                             f"numbers (model {self.model})") from None
            if clean:
                if self.dims is None:
                    self.dims = len(clean)
                elif len(clean) != self.dims and self._configured_dims is not None:
                    raise EmbeddingProviderError(
                        self.provider_id,
                        f"embedding has {len(clean)} dimensions, expected {self.dims} "
                        f"(model {self.model})")
                elif len(clean) != self.dims:
                    expected, self.dims = self.dims, len(clean)
                    raise EmbeddingDimensionsError(self.provider_id, expected=expected,
                                                   got=len(clean), model=self.model)
            out.append(clean)
        if count is not None:
            out = (out + [[] for _ in range(count)])[:count]
        return out

    async def aclose(self) -> None:
        """Release resources (subclasses close HTTP clients or drop the loaded model)."""


# The provider type the engine and the index take.
EmbeddingProvider = BaseProvider


async def probe(provider: EmbeddingProvider | None) -> tuple[bool, str | None]:
    """Check that ``provider`` can embed ``["ping"]`` (spec 11): ``(True, None)``, or
    ``(False, message)`` (also for ``provider=None``)."""
    if provider is None:
        return False, "No embedding provider available (FTS-only mode)"
    try:
        vectors = await provider.embed_batch(["ping"])
    except EmbeddingProviderError as exc:
        return False, str(exc)
    if not vectors or not vectors[0]:
        return False, f"{provider.provider_id} embedding probe returned no vector"
    return True, None
