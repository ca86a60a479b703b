"""The local GGUF provider with the real all-MiniLM-L6-v2 model (llama-cpp-python).

Skipped when the model or llama-cpp-python is missing, except under CI (env ``CI`` set),
where a missing prerequisite fails the test instead.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from fallback.embeddings import probe, select_provider
from fallback.embeddings.base import CallPolicy
from fallback.embeddings.local_gguf import LocalGgufProvider
from fallback.errors import EmbeddingProviderError
from fallback.settings import MemorySearchSettings

MODEL_NAME = "all-MiniLM-L6-v2.Q8_0.gguf"
# Texts and measured cosines from shared/models/README.md.
Q = "How do I configure the home router?"
R = "Router: Omada ER605, AdGuard at 192.168.10.2"
U = "Series A fundraising memo"

pytestmark = pytest.mark.local_model


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def model_path(local_model_path: Path) -> Path:
    """The real GGUF test model (``tests/conftest.py``: skips without it, fails in CI)."""
    return local_model_path


def cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


@pytest.mark.anyio
async def test_real_model_vectors(model_path: Path) -> None:
    settings = MemorySearchSettings.model_validate(
        {"provider": "local", "local": {"modelPath": str(model_path)}})
    sel = select_provider(settings, env={})
    provider = sel.provider
    assert isinstance(provider, LocalGgufProvider) and sel.error is None
    try:
        q1 = await provider.embed_query(Q)
        q2 = await provider.embed_query(Q)
        batch = await provider.embed_batch([Q, R, U])
        single_r = await provider.embed_query(R)
        assert provider.dims == 384
        assert len(q1) == 384 and all(len(v) == 384 for v in batch)
        for vector in (q1, *batch):
            assert math.isclose(math.sqrt(sum(x * x for x in vector)), 1.0, abs_tol=1e-5)
        assert cosine(q1, q2) >= 0.999
        assert cosine(batch[0], q1) >= 0.999 and cosine(batch[1], single_r) >= 0.999
        q_r, q_u = cosine(batch[0], batch[1]), cosine(batch[0], batch[2])
        assert q_r > q_u
        assert q_r == pytest.approx(0.4354, abs=0.02) and q_u == pytest.approx(-0.0238, abs=0.02)
        assert await probe(provider) == (True, None)
    finally:
        await provider.aclose()


@pytest.mark.anyio
async def test_long_text_is_cut_not_failed(model_path: Path) -> None:
    provider = LocalGgufProvider(model_path=model_path)
    try:
        long_text = "router configuration notes " * 600  # ~1,800 tokens > 512 context
        vectors = await provider.embed_batch([long_text, "short", ""])
        assert [len(v) for v in vectors] == [384, 384, 384]
    finally:
        await provider.aclose()


@pytest.mark.anyio
async def test_bad_model_file_is_an_embedding_error(tmp_path: Path, model_path: Path) -> None:
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"not a gguf file")
    provider = LocalGgufProvider(model_path=broken, policy=CallPolicy(concurrency=1,
                                                                      retry_base_s=0.01))
    try:
        with pytest.raises(EmbeddingProviderError) as info:
            await provider.embed_query("x")
    finally:
        await provider.aclose()
    assert str(info.value).startswith(f"local embedding failed: cannot load embedding model {broken}")
    assert not info.value.retryable
