"""The provider the ranking code sees during a search (fallback/engine/query_vector.py): the query's
own vector as prepared, any other text embedded within the search's deadline and kept in the
engine's cache of query vectors."""

from __future__ import annotations

import anyio
import pytest

from fallback.embeddings.base import BaseProvider, compute_provider_key
from fallback.engine.query_vector import PreparedProvider, QueryVectorCache
from fallback.errors import EmbeddingProviderError

pytestmark = pytest.mark.anyio


class LengthProvider(BaseProvider):
    """Vector = (length of the text, 1); queries are counted; ``hold`` makes them wait for it."""

    provider_id = "test-length"

    def __init__(self) -> None:
        super().__init__(model="len-v1", provider_key=compute_provider_key("test-length", "len-v1"),
                         max_input_tokens=8192, normalize=False)
        self.queries: list[str] = []
        self.hold: anyio.Event | None = None

    async def _request_query(self, text: str) -> list[float]:
        self.queries.append(text)
        if self.hold is not None:
            await self.hold.wait()
        return [float(len(text)), 1.0]

    async def _request_batch(self, texts: list[str]) -> list[list[float]]:
        return [[float(len(t)), 1.0] for t in texts]


async def test_the_query_gets_its_prepared_vector_without_a_provider_call() -> None:
    provider = LengthProvider()
    prepared = PreparedProvider(provider, [0.5, 0.5], query="guest wifi")
    assert await prepared.embed_query("guest wifi") == [0.5, 0.5]
    assert provider.queries == []
    legacy = PreparedProvider(provider, [0.25, 0.75])  # no query text: every text gets the vector
    assert await legacy.embed_query("anything") == [0.25, 0.75]
    assert provider.queries == []


async def test_other_texts_are_embedded_once_and_then_come_from_the_cache() -> None:
    provider = LengthProvider()
    cache = QueryVectorCache()
    first = PreparedProvider(provider, [1.0, 0.0], query="q1", cache=cache)
    assert await first.embed_query("melanie") == [7.0, 1.0]
    second = PreparedProvider(provider, [0.0, 1.0], query="q2", cache=cache)  # the next search
    assert await second.embed_query("melanie") == [7.0, 1.0]
    assert await second.embed_query("caroline") == [8.0, 1.0]
    assert provider.queries == ["melanie", "caroline"]
    uncached = PreparedProvider(provider, [0.0, 1.0], query="q3")
    assert await uncached.embed_query("melanie") == [7.0, 1.0]
    assert provider.queries == ["melanie", "caroline", "melanie"]


async def test_another_text_past_the_deadline_fails_without_waiting_for_the_provider() -> None:
    provider = LengthProvider()
    provider.hold = anyio.Event()  # never set: the provider would wait forever
    cache = QueryVectorCache()
    prepared = PreparedProvider(provider, [1.0, 0.0], query="q", cache=cache,
                                deadline=anyio.current_time() + 0.05)
    with pytest.raises(EmbeddingProviderError, match=r"query embedding timed out \(query.timeoutMs\)"):
        await prepared.embed_query("melanie")
    assert provider.queries == ["melanie"]
    assert cache.get((provider.provider_key, provider.model, "melanie")) is None
    assert await prepared.embed_query("q") == [1.0, 0.0]  # the query's own vector is still there


def test_the_cache_drops_the_least_recently_used_vector() -> None:
    cache = QueryVectorCache(max_entries=2)
    cache.put(("k", "m", "a"), [1.0])
    cache.put(("k", "m", "b"), [2.0])
    assert cache.get(("k", "m", "a")) == [1.0]  # a is now the most recently used
    cache.put(("k", "m", "c"), [3.0])
    assert cache.get(("k", "m", "b")) is None
    assert (cache.get(("k", "m", "a")), cache.get(("k", "m", "c"))) == ([1.0], [3.0])
    assert cache.get(("other", "m", "a")) is None  # another provider's vector is another key
