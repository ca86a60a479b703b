"""An embedding provider that rate-limits or hangs, against a real HTTP server on 127.0.0.1:
a long Retry-After is honoured by not calling, retries stay inside the caller's deadline, a
request that timed out is not repeated. Deadlines are asserted through the error raised."""

from __future__ import annotations

import anyio
import pytest

from fallback.embeddings import create_provider
from fallback.embeddings.base import CallPolicy
from fallback.errors import EmbeddingProviderError
from fallback.settings import MemorySearchSettings
from tests.fallback.embeddings_fake_server import Recorded, Reply, serve

pytestmark = pytest.mark.anyio

RATE_LIMITED = {"error": {"message": "Rate limit reached for requests"}}


def make(url: str, *, policy: CallPolicy | None = None):
    cfg = MemorySearchSettings.model_validate(
        {"provider": "openai-compatible", "model": "mini", "remote": {"baseUrl": url}})
    provider = create_provider("openai-compatible", cfg, env={})
    provider.policy = policy or CallPolicy(concurrency=1, query_timeout_s=5, batch_timeout_s=5,
                                           retry_base_s=0.01)
    return provider


async def test_retry_after_an_hour_fails_at_once_and_is_honoured() -> None:
    with serve(lambda req: Reply(429, RATE_LIMITED, {"Retry-After": "3600"})) as srv:
        p = make(srv.url)
        try:
            with pytest.raises(EmbeddingProviderError) as first:
                await p.embed_query("router")
            assert str(first.value) == ("openai-compatible embedding failed (HTTP 429): "
                                        "Rate limit reached for requests")
            assert first.value.retry_after_s == 3600.0
            with pytest.raises(EmbeddingProviderError) as again:
                await p.embed_batch(["a", "b"])
        finally:
            await p.aclose()
    assert len(srv.requests) == 1  # no retry in 8 s, and no call at all while Retry-After runs
    assert str(again.value).startswith(
        "openai-compatible embedding failed (HTTP 429): Rate limit reached for requests "
        "(rate limited: Retry-After asks to wait ")
    assert str(again.value).endswith(" s more; not called again until then)")
    assert again.value.retry_after_s is not None and 3590 < again.value.retry_after_s <= 3600


async def test_retry_waits_never_outlast_the_callers_deadline() -> None:
    with serve(lambda req: Reply(429, RATE_LIMITED, {"Retry-After": "5"})) as srv:
        p = make(srv.url)
        try:
            with anyio.move_on_after(1) as scope:  # a search with 1 s left
                with pytest.raises(EmbeddingProviderError) as info:
                    await p.embed_query("router")
        finally:
            await p.aclose()
    assert scope.cancelled_caught is False  # the error came first, not the deadline
    assert info.value.status == 429 and len(srv.requests) == 1
    # without a deadline the same 5 s wait is made (within the 8 s cap) and retried


async def test_short_retry_after_is_still_retried() -> None:
    def handler(req: Recorded) -> Reply:
        if len(srv.requests) == 1:
            return Reply(429, RATE_LIMITED, {"Retry-After": "0"})
        return Reply(200, {"data": [{"index": 0, "embedding": [1.0, 0.0]}]})

    with serve(handler) as srv:
        p = make(srv.url)
        try:
            with anyio.move_on_after(5):
                assert await p.embed_query("router") == [1.0, 0.0]
        finally:
            await p.aclose()
    assert len(srv.requests) == 2


async def test_a_provider_that_never_answers_is_asked_once() -> None:
    policy = CallPolicy(concurrency=1, query_timeout_s=2, batch_timeout_s=2, retry_base_s=0.01)
    with serve(lambda req: Reply(200, {"data": []}, delay_s=600)) as srv:
        p = make(srv.url, policy=policy)
        try:
            with pytest.raises(EmbeddingProviderError) as info:
                await p.embed_query("router")
        finally:
            await p.aclose()
        assert srv.wait_for_requests(1) == 1  # a retry would have been sent before the raise
    assert str(info.value) == ("openai-compatible embedding failed: memory embeddings query "
                               "timed out after 2s")
