"""Config as OpenClaw 2026.9 writes it (memory.search, agents.entries), both layouts at once,
and the warnings for clamped numbers (logged once, shown by status)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from fallback.errors import ConfigError
from qmdbridge import MemoryManager
from qmdbridge.config import load_config, parse_config, resolve_agent

# A config in the layout of OpenClaw 2026.9: search settings in memory.search, agents in the
# agents.entries map (several agents need agents.ownership "explicit"), per-agent search
# overrides in agents.entries.<id>.memory.search.
CURRENT_LAYOUT = """{
  // written by OpenClaw 2026.9
  gateway: { port: 18789 },
  memory: {
    backend: "builtin",
    citations: "on",
    search: {
      provider: "none",
      extraPaths: ["notes"],
      query: { maxResults: 9, minScore: 0.2, hybrid: { mmr: { enabled: true } } },
      chunking: { tokens: 300, overlap: 40 },
    },
  },
  agents: {
    ownership: "explicit",
    defaults: { model: { primary: "openai/gpt-5.5" } },
    entries: {
      ops: { workspace: "OPS_WS" },
      main: {
        workspace: "MAIN_WS",
        memory: { search: { extraPaths: ["journal"], query: { minScore: 0.1 } } },
      },
    },
  },
}
"""


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "openclaw.json"
    path.write_text(text)
    return path


def test_current_layout_resolves_like_the_classic_one(tmp_path: Path) -> None:
    text = CURRENT_LAYOUT.replace("OPS_WS", str(tmp_path / "ops")).replace("MAIN_WS", str(tmp_path / "main"))
    cfg = load_config(_write(tmp_path, text))
    assert cfg.warnings == []
    assert [(a.id, a.key_path) for a in cfg.agents] == [("ops", "agents.entries.ops"),
                                                        ("main", "agents.entries.main")]
    env = {"OPENCLAW_STATE_DIR": str(tmp_path / "state")}
    main = resolve_agent(cfg, env=env)  # agents.entries.main is the default agent
    assert (main.agent_id, main.workspace_dir) == ("main", (tmp_path / "main").resolve())
    ms = main.memory_search
    assert (ms.provider, ms.extra_paths, ms.query.max_results, ms.query.min_score) == (
        "none", ["notes", "journal"], 9, 0.1)
    assert (ms.chunking.tokens, ms.chunking.overlap, ms.query.hybrid.mmr.enabled) == (300, 40, True)
    ops = resolve_agent(cfg, "ops", env=env)
    assert (ops.workspace_dir, ops.memory_search.extra_paths, ops.memory_search.query.min_score) == (
        (tmp_path / "ops").resolve(), ["notes"], 0.2)
    assert cfg.memory.citations == "on"


@pytest.mark.anyio
async def test_a_current_layout_config_searches_its_extra_paths(tmp_path: Path) -> None:
    main_ws = tmp_path / "main"
    (main_ws / "journal").mkdir(parents=True)
    (main_ws / "journal" / "trip.md").write_text("# Trip\n\nThe ferry to Hydra leaves at 07:40.\n")
    text = CURRENT_LAYOUT.replace("OPS_WS", str(tmp_path / "ops")).replace("MAIN_WS", str(main_ws))
    agent = resolve_agent(load_config(_write(tmp_path, text)),
                          env={"OPENCLAW_STATE_DIR": str(tmp_path / "state")})
    async with MemoryManager(agent) as memory:
        response = await memory.search("ferry Hydra")
    assert [(h.path, h.start_line, h.end_line) for h in response.results] == [("journal/trip.md", 1, 3)]


def test_errors_name_the_current_layout_key_paths(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config({"memory": {"search": {"provider": "bogus"}}})
    assert info.value.key == "memory.search.provider"
    with pytest.raises(ConfigError) as info:
        parse_config({"agents": {"entries": {"ops": {"memory": {"search": {"chunking": {"tokens": "many"}}}}}}})
    assert info.value.key == "agents.entries.ops.memory.search.chunking.tokens"
    with pytest.raises(ConfigError) as info:
        parse_config({"agents": {"entries": {"ops": "not an object"}}})
    assert info.value.key == "agents.entries.ops"
    with pytest.raises(ConfigError) as info:
        parse_config({"agents": {"entries": ["main"]}})
    assert (info.value.key, info.value.expected) == ("agents.entries", "an object")


def test_both_layouts_set_the_new_one_wins_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="qmdbridge.config")
    cfg = parse_config({
        "memory": {"search": {"query": {"maxResults": 9}, "extraPaths": ["new-notes"]}},
        "agents": {
            "defaults": {"memorySearch": {"query": {"maxResults": 4, "minScore": 0.5},
                                          "extraPaths": ["old-notes"], "provider": "none"}},
            "list": [{"id": "ops", "workspace": "/old", "memorySearch": {"model": "a"}}],
            "entries": {"ops": {"workspace": "/new", "memory": {"search": {"model": "b"}}}},
        }})
    assert cfg.warnings == [
        "memory.search and agents.defaults.memorySearch both set extraPaths, query.maxResults; "
        "memory.search wins (agents.defaults.memorySearch is the layout before OpenClaw 2026.9)",
        "agents.entries.ops and agents.list[0] both set workspace, memory.search.model; "
        "agents.entries.ops wins (agents.list[0] is the layout before OpenClaw 2026.9)"]
    assert [r.getMessage() for r in caplog.records] == [f"config: {w}" for w in cfg.warnings]
    ops = resolve_agent(cfg, "ops", env={})
    ms = ops.memory_search
    assert (ms.query.max_results, ms.query.min_score, ms.extra_paths, ms.provider, ms.model) == (
        9, 0.5, ["new-notes"], "none", "b")
    assert str(ops.workspace_dir) == "/new"
    assert ops.config_warnings == cfg.warnings


def test_a_repeated_agent_id_is_warned_and_the_first_entry_is_used() -> None:
    cfg = parse_config({"agents": {"list": [{"id": "main", "workspace": "/a"},
                                            {"id": "Main", "workspace": "/b"}]}})
    assert cfg.warnings == ["agents.list[1] repeats the id of agents.list[0] ('Main'); only "
                            "agents.list[0] is used"]
    agent = resolve_agent(cfg, "Main", env={})
    assert (str(agent.workspace_dir), agent.config_warnings) == ("/a", cfg.warnings)


def test_two_agents_marked_default_are_warned_and_the_first_is_the_default() -> None:
    cfg = parse_config({"agents": {"list": [{"id": "ops", "workspace": "/ops"},
                                            {"id": "a", "default": True, "workspace": "/a"},
                                            {"id": "b", "default": True, "workspace": "/b"}]}})
    assert cfg.warnings == ["agents.list[2].default: agents.list[1] is already marked default; "
                            "the first one marked is the default agent"]
    agent = resolve_agent(cfg, env={})
    assert (agent.agent_id, str(agent.workspace_dir)) == ("a", "/a")


def test_a_provider_naming_an_openclaw_models_provider_speaks_its_api() -> None:
    cfg = parse_config({
        "models": {"providers": {
            "ollama-5080": {"api": "ollama", "baseUrl": "http://gpu-box.local:11435", "apiKey": "ollama-local",
                            "models": [{"id": "qwen3-embedding:0.6b"}]},
            "vllm": {"api": "openai-completions", "baseUrl": "http://10.0.0.5:8000/v1"},
            "claude": {"api": "anthropic-messages", "baseUrl": "https://api.anthropic.com"}}},
        "agents": {"defaults": {"memorySearch": {"provider": "ollama-5080", "model": "qwen3-embedding:0.6b"}},
                   "list": [{"id": "main"},
                            {"id": "ops", "memorySearch": {"provider": "vllm", "remote": {"apiKey": "k"}}}]}})
    main = resolve_agent(cfg, "main", env={}).memory_search
    assert (main.provider, main.model, main.remote.base_url, main.remote.api_key) == (
        "ollama", "qwen3-embedding:0.6b", "http://gpu-box.local:11435", "ollama-local")
    ops = resolve_agent(cfg, "ops", env={}).memory_search
    assert (ops.provider, ops.remote.base_url, ops.remote.api_key) == (
        "openai-compatible", "http://10.0.0.5:8000/v1", "k")
    assert cfg.warnings == []
    with pytest.raises(ConfigError, match="memorySearch.provider: invalid value 'claude'"):
        parse_config({"models": {"providers": {"claude": {"api": "anthropic-messages"}}},
                      "agents": {"defaults": {"memorySearch": {"provider": "claude"}}}})


def test_an_entry_with_both_search_keys_prefers_memory_search() -> None:
    cfg = parse_config({"agents": {"list": [
        {"id": "main", "memorySearch": {"query": {"maxResults": 3}},
         "memory": {"search": {"query": {"maxResults": 5}}}}]}})
    assert cfg.warnings == [
        "agents.list[0].memory.search and agents.list[0].memorySearch both set query.maxResults; "
        "agents.list[0].memory.search wins (agents.list[0].memorySearch is the layout before "
        "OpenClaw 2026.9)"]
    assert resolve_agent(cfg, env={}).memory_search.query.max_results == 5


def test_clamped_numbers_are_warned_once_with_their_key_path(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="qmdbridge.config")
    cfg = parse_config({
        "memory": {"search": {"chunking": {"tokens": 0}, "query": {"minScore": 3,
                   "hybrid": {"candidateMultiplier": 99, "mmr": {"lambda": -1},
                              "vectorWeight": 0.6, "textWeight": 0.6}}}},
        "agents": {"entries": {
            "main": {},
            "ops": {"memory": {"search": {"cache": {"maxEntries": 0},
                                          "query": {"hybrid": {"vectorWeight": 2}}}}}}}})
    assert cfg.warnings == [
        "memory.search.chunking.tokens: 0 is out of range; using 1",
        "memory.search.query.minScore: 3 is out of range; using 1",
        "memory.search.query.hybrid.candidateMultiplier: 99 is out of range; using 20",
        "memory.search.query.hybrid.mmr.lambda: -1 is out of range; using 0"]
    ops_notes = ["agents.entries.ops.memory.search.cache.maxEntries: 0 is out of range; using 1",
                 "agents.entries.ops.memory.search.query.hybrid.vectorWeight: 2 is out of range; using 0.625"]
    env = {"OPENCLAW_STATE_DIR": "/tmp/unused-state"}
    assert resolve_agent(cfg, "ops", env=env).config_warnings == [*cfg.warnings, *ops_notes]
    assert resolve_agent(cfg, "main", env=env).config_warnings == cfg.warnings
    assert resolve_agent(cfg, "main", env=env).config_warnings == cfg.warnings
    # logged when the config was parsed, once each, not again per resolved agent
    assert [r.getMessage() for r in caplog.records] == [f"config: {w}" for w in [*cfg.warnings, *ops_notes]]


def test_in_range_values_and_normalised_weights_are_not_warned() -> None:
    cfg = parse_config({"agents": {"defaults": {"memorySearch": {
        "chunking": {"tokens": 400, "overlap": 80}, "query": {"minScore": 0.2,
        "hybrid": {"vectorWeight": 0.5, "textWeight": 0.5}}}}}})
    assert cfg.warnings == []


@pytest.mark.anyio
async def test_status_shows_config_warnings(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    path = _write(tmp_path, "{memory: {search: {provider: 'none', chunking: {tokens: -5}}}}")
    agent = resolve_agent(load_config(path), workspace=ws,
                          env={"OPENCLAW_STATE_DIR": str(tmp_path / "state")})
    async with MemoryManager(agent) as memory:
        status = await memory.status()
    assert status.config_warnings == ["memory.search.chunking.tokens: -5 is out of range; using 1"]
    assert status.to_json_dict()["configWarnings"] == status.config_warnings


@pytest.mark.anyio
async def test_openclaw_models_providers_give_the_remote_providers_their_key_url_and_headers() -> None:
    """OpenClaw reads a remote embedding provider's key from ``models.providers.<id>.apiKey``
    (``google`` for gemini) after the environment's, and its ``baseUrl``/``headers`` under
    ``remote``'s: ``provider: "auto"`` finds openai by it and sends that key, URL and header."""
    from fallback.embeddings import select_provider
    from tests.fallback.embeddings_fake_server import Recorded, Reply, serve

    def reply(req: Recorded) -> Reply:
        if req.path.endswith(":embedContent"):
            return Reply(200, {"embedding": {"values": [0.6, 0.8]}})
        return Reply(200, {"data": [{"index": 0, "embedding": [0.6, 0.8]}]})

    with serve(reply) as srv:
        def search(**memory_search: object) -> object:
            cfg = parse_config({
                "models": {"providers": {
                    "openai": {"baseUrl": f"{srv.url}/v1", "apiKey": "sk-from-models", "models": [],
                               "headers": {"OpenAI-Organization": "org-1", "X-Team": "a"}},
                    "google": {"baseUrl": srv.url, "apiKey": {"source": "env", "id": "MY_GOOGLE_KEY"}}}},
                "agents": {"defaults": {"memorySearch": memory_search}}})
            assert cfg.warnings == []
            return resolve_agent(cfg, env={}).memory_search

        env = {"MY_GOOGLE_KEY": "g-from-ref"}
        for settings, environ in ((search(provider="auto", remote={"headers": {"X-Team": "b"}}), env),
                                  (search(provider="openai"), {"OPENAI_API_KEY": "sk-env"}),
                                  (search(provider="gemini"), env)):
            provider = select_provider(settings, env=environ).provider
            assert provider is not None
            try:
                assert await provider.embed_query("hello") == [0.6, 0.8]
            finally:
                await provider.aclose()
        none_left = select_provider(search(provider="gemini"), env={}).unavailable_reason
    auto, explicit, gemini = srv.requests
    assert (auto.path, auto.headers["authorization"], auto.json["model"]) == (
        "/v1/embeddings", "Bearer sk-from-models", "text-embedding-3-small")
    assert (auto.headers["openai-organization"], auto.headers["x-team"]) == ("org-1", "b")
    assert explicit.headers["authorization"] == "Bearer sk-env"  # the environment's key first
    assert (gemini.path, gemini.headers["x-goog-api-key"]) == (
        "/models/gemini-embedding-001:embedContent", "g-from-ref")
    assert none_left == ("no API key found for gemini (its models.providers apiKey names "
                         "$MY_GOOGLE_KEY, which is not set)")
