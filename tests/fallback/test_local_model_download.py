"""The local provider downloads its model on first use (stand-in hub on 127.0.0.1 serving the
real GGUF test model), then embeds with it; offline, search fails closed with the reason."""

from __future__ import annotations

import math
import socket
from pathlib import Path

import pytest

from fallback.embeddings import select_provider
from fallback.embeddings.local_gguf import LocalGgufProvider
from fallback.engine.builtin import BuiltinEngine
from fallback.errors import SearchUnavailableError
from fallback.request import SearchRequest
from fallback.settings import EngineSettings, MemorySearchSettings
from tests.conftest import TEST_MODEL_NAME
from tests.fallback.hub_server import HubFile, serve_hub

pytestmark = pytest.mark.local_model
URI = f"hf:test-org/all-MiniLM-L6-v2-GGUF/{TEST_MODEL_NAME}"


def cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


@pytest.mark.anyio
async def test_first_use_downloads_then_embeds(tmp_path: Path, local_model_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    settings = MemorySearchSettings.model_validate({"provider": "local", "local": {"modelPath": URI}})
    data = local_model_path.read_bytes()
    with serve_hub({URI.removeprefix("hf:"): HubFile(data)}) as hub:
        env = {"OPENCLAW_STATE_DIR": str(tmp_path / "state"), "HF_ENDPOINT": hub.url}
        provider = select_provider(settings, env=env).provider
        assert isinstance(provider, LocalGgufProvider) and provider.download is not None
        assert provider.model == URI  # the index identity names the model, not the cache path
        try:
            vector = await provider.embed_query("How do I configure the home router?")
        finally:
            await provider.aclose()
        fetched = len([r for r in hub.requests if r.path.startswith("/cdn/")])
    cached = tmp_path / "state" / "models" / "hf" / "test-org" / "all-MiniLM-L6-v2-GGUF" / TEST_MODEL_NAME
    assert provider.model_path == cached and cached.read_bytes() == data and fetched == 1
    assert provider.download is None
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == f"downloading {URI} (25.3 MB)" and lines[-1] == "  100% 25.3 MB of 25.3 MB"
    direct = LocalGgufProvider(model_path=local_model_path)
    try:
        reference = await direct.embed_query("How do I configure the home router?")
    finally:
        await direct.aclose()
    assert len(vector) == 384 and cosine(vector, reference) >= 0.999
    # auto now finds the cached file and needs no hub
    auto = select_provider(MemorySearchSettings.model_validate({"local": {"modelPath": URI}}),
                           env={"OPENCLAW_STATE_DIR": str(tmp_path / "state")})
    assert isinstance(auto.provider, LocalGgufProvider) and auto.provider.model_path == cached


@pytest.mark.anyio
async def test_offline_first_search_fails_closed_with_the_reason_when_strict(tmp_path: Path,
                                                                            local_model_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    ws = tmp_path / "ws"
    (ws / "memory").mkdir(parents=True)
    (ws / "MEMORY.md").write_text("# Memory\n\nThe router is an Omada ER605.\n")
    search = MemorySearchSettings.model_validate({"provider": "local",
                                                  "query": {"keywordFallback": False}})
    settings = EngineSettings.for_workspace(ws, state_dir=tmp_path / "state", search=search)
    env = {"OPENCLAW_STATE_DIR": str(tmp_path / "state"), "HF_ENDPOINT": f"http://127.0.0.1:{port}"}
    engine = BuiltinEngine(settings, provider_selection=select_provider(search, env=env))
    try:
        with pytest.raises(SearchUnavailableError) as info:
            await engine.search(SearchRequest.of("router"))
    finally:
        await engine.close()
    message = str(info.value)
    assert message.startswith(
        f"memory search unavailable: local: offline: cannot reach 127.0.0.1:{port} to download "
        "hf:CompendiumLabs/bge-small-en-v1.5-gguf/bge-small-en-v1.5-q8_0.gguf into "
        f"{tmp_path / 'state' / 'models'} (ConnectError)")
    assert not list((tmp_path / "state" / "models").rglob("*.gguf"))
