"""The optional reranker stage: a cross-encoder scores (query, chunk) pairs and reorders the best
fused candidates.

:class:`Reranker` is either provider: :class:`HttpReranker` speaks the Cohere-compatible
``POST {baseUrl}/v1/rerank``, :class:`LocalGgufReranker` runs a GGUF reranker through
llama-cpp-python with rank pooling. :func:`rerank_stage` never fails the search, and the
reranked head keeps the set of its fused scores (docs/configuration.md, "Reranking").
"""

from __future__ import annotations

import ctypes
import logging
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

from fallback.embeddings._http import HttpClient
from fallback.embeddings.base import retry_wait_s
from fallback.embeddings.llama_slot import LLAMA_CPP_MISSING, LlamaSlot
from fallback.errors import EmbeddingProviderError, RerankerError
from fallback.settings import RerankSettings, SecretRef, read_api_key

if TYPE_CHECKING:
    from fallback.search.explain import SearchTrace
    from fallback.search.ranking import Candidate

__all__ = [
    "HttpReranker",
    "LocalGgufReranker",
    "Reranker",
    "apply_rerank_scores",
    "parse_rerank_response",
    "rerank_stage",
    "reranker_from_settings",
]

log = logging.getLogger(__name__)

# Calls in total per rerank request (one retry: the stage runs inside a search's latency budget).
HTTP_RETRY_ATTEMPTS = 2
# First back-off wait in seconds before the retry (the server's Retry-After wins, capped at 8 s).
HTTP_RETRY_BASE_S = 0.25
# A local (query, chunk) pair is cut to this many tokens: a 400-token chunk plus a short query
# fits, and the context stays small on a 2-core machine.
LOCAL_MAX_PAIR_TOKENS = 1024
# The GGUF pooling type that marks a reranker (llama.cpp ``LLAMA_POOLING_TYPE_RANK``).
GGUF_POOLING_RANK = "4"


def apply_rerank_scores(cands: list[Candidate], scores: Sequence[float | None], *,
                        top_n: int) -> list[Candidate]:
    """New candidates of ``cands`` (best first) with the first ``top_n`` (>= 1) reordered by
    reranker ``scores`` (pure): the head sorted by score descending (``None`` and non-finite
    last, ties in fused order) takes its fused scores best-first; the tail follows unchanged.

    Raises ``ValueError``: ``scores`` does not match the head.
    """
    head, tail = cands[:top_n], cands[top_n:]
    if len(scores) != len(head):
        raise ValueError(f"{len(scores)} reranker scores for {len(head)} candidates")

    def key(i: int) -> tuple[int, float, int]:
        s = scores[i]
        usable = s is not None and math.isfinite(s)
        return (0 if usable else 1, -(s if usable and s is not None else 0.0), i)

    order = sorted(range(len(head)), key=key)
    slots = sorted((c.score for c in head), reverse=True)
    return [replace(head[i], score=slots[pos]) for pos, i in enumerate(order)] + list(tail)


async def rerank_stage(reranker: Reranker, settings: RerankSettings, query: str,
                       cands: list[Candidate], *, trace: SearchTrace | None,
                       warnings: list[str]) -> list[Candidate]:
    """The pipeline's reranker stage: score the chunk text of the first ``query.rerank.topN``
    candidates with ``reranker`` and reorder them (:func:`apply_rerank_scores`), recorded in
    ``trace``. A ``RerankerError``, a reply of the wrong length or the stage's deadline (retries
    included) keep ``cands`` as they are, with a warning appended to ``warnings``.
    """
    head = cands[:settings.top_n]
    if not head:
        return list(cands)
    timeout_ms = settings.effective_timeout_ms
    try:
        with anyio.fail_after(timeout_ms / 1000):
            scores = await reranker.score(query, [c.snippet for c in head])
        if len(scores) != len(head):
            raise RerankerError(reranker.provider_id,
                                f"{len(scores)} scores for {len(head)} documents")
    except (TimeoutError, RerankerError) as exc:
        reason = (str(exc) if isinstance(exc, RerankerError)
                  else f"{reranker.provider_id} reranker timed out after {timeout_ms}ms")
        log.info("rerank skipped, fused order kept: %s", reason)  # the warning is in the answer
        warnings.append(f"rerank skipped, fused order kept: {reason}")
        return list(cands)
    reordered = apply_rerank_scores(cands, scores, top_n=settings.top_n)
    if trace is not None:
        trace.rerank(cands, reordered, scores={c.chunk_id: s for c, s in zip(head, scores, strict=True)},
                     provider=reranker.provider_id, model=reranker.model)
    return reordered


def parse_rerank_response(body: Any, count: int, *, provider: str = "http") -> list[float | None]:
    """The ``count`` scores (one per document sent, in order; ``None`` when missing) of a
    ``/v1/rerank`` answer (JSON ``body``): its ``results`` (Cohere, Jina, llama.cpp server) or
    ``data`` (Voyage) list of ``{index, relevance_score}``.

    Raises ``RerankerError`` (naming ``provider``): not that shape, an index out of range or
    repeated, a score that is not a finite number.
    """
    items = body.get("results", body.get("data")) if isinstance(body, dict) else None
    if not isinstance(items, list):
        raise RerankerError(provider, "response has no results list")
    scores: list[float | None] = [None] * count
    for item in items:
        index = item.get("index") if isinstance(item, dict) else None
        value = item.get("relevance_score") if isinstance(item, dict) else None
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < count:
            raise RerankerError(provider, f"result index {index!r} is not one of 0..{count - 1}")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise RerankerError(provider, f"result {index} has no finite relevance_score")
        if scores[index] is not None:
            raise RerankerError(provider, f"result index {index} appears twice")
        scores[index] = float(value)
    return scores


class HttpReranker:
    """A Cohere-compatible rerank server (Cohere, Jina, llama.cpp ``llama-server --rerank``)
    at ``base_url`` (requests go to ``{base_url}/v1/rerank``), sent ``model``."""

    provider_id = "http"

    def __init__(self, *, base_url: str, model: str, api_key: str | None = None,
                 timeout_ms: int = 5_000, unavailable: str | None = None) -> None:
        """``api_key`` is sent as a bearer token (redacted from errors); ``timeout_ms`` bounds
        one request; 429, 5xx and transport errors are retried (:data:`HTTP_RETRY_ATTEMPTS`);
        ``unavailable``: why no request can be sent (an unset key variable), raised by each call."""
        self.model = model
        self._unavailable = unavailable
        self.base_url = base_url.rstrip("/")
        headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = HttpClient(provider_id="rerank", base_url=self.base_url, headers=headers,
                                secrets=(api_key,) if api_key else (),
                                timeout_s=timeout_ms / 1000)

    async def score(self, query: str, documents: list[str]) -> list[float | None]:
        """POST the documents to ``/v1/rerank``; scores in document order. Raises
        ``RerankerError``: an HTTP error (after the retries), a transport error, a bad response."""
        if not documents:
            return []
        if self._unavailable is not None:
            raise RerankerError(self.provider_id, self._unavailable)
        payload = {"model": self.model, "query": query, "documents": documents,
                   "top_n": len(documents)}
        for attempt in range(1, HTTP_RETRY_ATTEMPTS + 1):
            try:
                body = await self._http.post_json("/v1/rerank", payload)
                break
            except EmbeddingProviderError as exc:
                if not exc.retryable or attempt == HTTP_RETRY_ATTEMPTS:
                    reason = f"HTTP {exc.status}: {exc.detail}" if exc.status is not None else exc.detail
                    raise RerankerError(self.provider_id, reason, status=exc.status) from exc
                await anyio.sleep(retry_wait_s(attempt, retry_after_s=exc.retry_after_s,
                                               base_s=HTTP_RETRY_BASE_S))
        return parse_rerank_response(body, len(documents), provider=self.provider_id)

    async def aclose(self) -> None:
        """Close the HTTP client (safe to call twice)."""
        await self._http.aclose()


def _meta(llama: Any, key: str) -> str | None:
    value = llama.metadata.get(key)
    return value if isinstance(value, str) else None


class LocalGgufReranker:
    """A GGUF reranker (bge-reranker-v2-m3, Qwen3-Reranker ...) run in-process, loaded on the
    first call with rank pooling; a file whose metadata does not declare rank pooling
    (``<arch>.pooling_type = 4``) is refused before any decode (an embedding model has no
    classification head). A pair is laid out as llama.cpp's server does: the model's
    ``rerank`` chat template, else ``[BOS] query [EOS] [SEP] document [EOS]``, cut to 1,024
    tokens (or the trained context); its score is the rank-pooled output. Calls run one at a
    time. ``model`` is the path as configured, ``model_path`` with ``~`` expanded.
    """

    provider_id = "local"

    def __init__(self, *, model_path: str) -> None:
        self.model = model_path
        self.model_path = Path(model_path).expanduser()
        self._model = LlamaSlot(self._load)
        self._template: str | None = None
        self._max_tokens = LOCAL_MAX_PAIR_TOKENS

    def _load(self) -> Any:
        if not self.model_path.is_file():
            raise RerankerError(self.provider_id,
                                f"reranker model file not found: {self.model_path}")
        try:
            import llama_cpp
        except ImportError as exc:
            raise RerankerError(self.provider_id, LLAMA_CPP_MISSING) from exc
        try:
            llama = llama_cpp.Llama(model_path=str(self.model_path), embedding=True,
                                    pooling_type=llama_cpp.LLAMA_POOLING_TYPE_RANK,
                                    n_ctx=LOCAL_MAX_PAIR_TOKENS, n_batch=LOCAL_MAX_PAIR_TOKENS,
                                    n_ubatch=LOCAL_MAX_PAIR_TOKENS, verbose=False)
        except (ValueError, RuntimeError, OSError) as exc:
            raise RerankerError(self.provider_id,
                                f"cannot load reranker model {self.model_path}: {exc}") from exc
        arch = _meta(llama, "general.architecture") or "?"
        pooling = _meta(llama, f"{arch}.pooling_type")
        if pooling != GGUF_POOLING_RANK:
            llama.close()
            raise RerankerError(
                self.provider_id,
                f"{self.model_path.name} is not a reranker model ({arch}.pooling_type is "
                f"{pooling or 'unset'}, a reranker GGUF declares {GGUF_POOLING_RANK} = rank); "
                "set query.rerank.model to a cross-encoder GGUF such as bge-reranker-v2-m3")
        self._template = _meta(llama, "tokenizer.chat_template.rerank")
        # A pair never exceeds the model's trained context (BERT-style models have 512 positions).
        trained = int(llama_cpp.llama_model_n_ctx_train(llama.model))
        self._max_tokens = min(LOCAL_MAX_PAIR_TOKENS, trained) if trained > 0 else LOCAL_MAX_PAIR_TOKENS
        return llama

    def _pair_tokens(self, llama: Any, query: str, document: str) -> list[int]:
        import llama_cpp

        if self._template:
            text = self._template.replace("{query}", query).replace("{document}", document)
            return list(llama.tokenize(text.encode("utf-8"), add_bos=False,
                                       special=True))[:self._max_tokens]
        vocab = llama_cpp.llama_model_get_vocab(llama.model)
        eos = llama_cpp.llama_vocab_eos(vocab)
        eos = eos if eos >= 0 else llama_cpp.llama_vocab_sep(vocab)
        add_eos = bool(llama_cpp.llama_vocab_get_add_eos(vocab))
        q = list(llama.tokenize(query.encode("utf-8"), add_bos=False, special=False))
        d = list(llama.tokenize(document.encode("utf-8"), add_bos=False, special=False))
        head = ([llama_cpp.llama_vocab_bos(vocab)] if llama_cpp.llama_vocab_get_add_bos(vocab) else [])
        head += q + ([eos] if add_eos else [])
        head += [llama_cpp.llama_vocab_sep(vocab)] if llama_cpp.llama_vocab_get_add_sep(vocab) else []
        tail = [eos] if add_eos else []
        room = max(0, self._max_tokens - len(head) - len(tail))
        return (head + d[:room] + tail)[:self._max_tokens]

    def _decode_pair(self, llama: Any, tokens: list[int]) -> float:
        """One pair through the model: every token an output (rank pooling reads them), the
        pooled rank of sequence 0 as the score."""
        import llama_cpp

        tokens = tokens[:self._max_tokens]
        memory = llama_cpp.llama_get_memory(llama.ctx)
        if memory:
            llama_cpp.llama_memory_clear(memory, True)
        batch = llama_cpp.llama_batch_init(len(tokens), 0, 1)
        try:
            for i, tok in enumerate(tokens):
                batch.token[i] = tok
                batch.pos[i] = i
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = 0
                batch.logits[i] = 1
            batch.n_tokens = len(tokens)
            rc = llama_cpp.llama_decode(llama.ctx, batch)
        finally:
            llama_cpp.llama_batch_free(batch)
        if rc != 0:
            raise RerankerError(self.provider_id, f"llama.cpp decode failed (code {rc})")
        ptr = llama_cpp.llama_get_embeddings_seq(llama.ctx, 0)
        if not ptr:
            raise RerankerError(self.provider_id, "llama.cpp returned no rank score")
        value = float(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float))[0])
        if not math.isfinite(value):
            raise RerankerError(self.provider_id, "the model gave a non-finite score")
        return value

    async def score(self, query: str, documents: list[str]) -> list[float | None]:
        """Score each (query, document) pair with the model (loaded on first use). Raises
        ``RerankerError``: no file or llama-cpp-python, not a reranker GGUF, llama.cpp failed."""
        if not documents:
            return []
        return await self._model.call(lambda llama: [
            self._decode_pair(llama, self._pair_tokens(llama, query, doc)) for doc in documents])

    async def aclose(self) -> None:
        """Drop the loaded model (it is reloaded on the next call)."""
        await self._model.aclose()


# A reranker provider: ``provider_id`` (``http`` or ``local``), ``model``, ``score(query,
# documents)`` and ``aclose()``.
Reranker = HttpReranker | LocalGgufReranker


def reranker_from_settings(settings: RerankSettings,
                           env: Mapping[str, str] | None = None) -> Reranker | None:
    """The configured reranker, or ``None`` when ``query.rerank.provider`` is unset; nothing is
    loaded or contacted here (problems surface as ``RerankerError`` on the first call, an
    ``apiKey`` SecretRef whose variable, read from ``env`` (default ``os.environ``), is unset
    among them)."""
    if settings.provider == "http":
        e = os.environ if env is None else env
        ref = settings.api_key if isinstance(settings.api_key, SecretRef) else None
        return HttpReranker(base_url=settings.base_url or "", model=settings.model,
                            api_key=read_api_key(settings.api_key, e),
                            timeout_ms=settings.effective_timeout_ms,
                            unavailable=ref.unread_reason(e, key="query.rerank.apiKey") if ref else None)
    if settings.provider == "local":
        return LocalGgufReranker(model_path=settings.model)
    return None
