"""Unknown keys in ``memory`` and the search settings: a config warning naming the key path and
the close key of ours; every documented key, and OpenClaw's keys we do not read, pass quietly."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import json5
import pytest

from fallback.errors import ConfigError
from fallback.settings import MemorySearchSettings
from qmdbridge import MemoryManager
from qmdbridge.config import MemoryConfig, load_config, parse_config, resolve_agent
from qmdbridge.config_compat import unknown_keys

DOCS = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def _documented(section: str) -> dict[str, Any]:
    """The keys of one key-reference table of docs/configuration.md as a nested object (leaves
    ``None``): a dotted name is the row's key, a bare one after it a sibling (``topN``)."""
    table = DOCS.read_text().split(f"### `{section}`\n", 1)[1].split("\n## ", 1)[0].split("\n### ", 1)[0]
    tree: dict[str, Any] = {}
    for row in table.splitlines():
        names = re.findall(r"`([^`]+)`", row.split("|")[1]) if row.startswith("| `") else []
        parent: list[str] = []
        for name in names:
            parts = name.split(".") if "." in name or not parent else [*parent, name]
            parent = parts[:-1]
            node = tree
            for part in parts[:-1]:
                node = node.setdefault(part, {})
            node[parts[-1]] = None
    return tree


def test_every_documented_key_is_known() -> None:
    memory = _documented("memory")["memory"]
    search = _documented("memorySearch")
    assert {"backend", "qmd"} <= memory.keys() and {"provider", "query", "store"} <= search.keys()
    assert unknown_keys(MemoryConfig, memory, "memory", "memory") == []
    assert unknown_keys(MemorySearchSettings, search, "memory.search", "memorySearch") == []
    example = DOCS.read_text().split("```json5\n", 1)[1].split("```", 1)[0]
    assert parse_config(json5.loads(example)).warnings == []


def test_a_misspelt_key_is_warned_with_the_key_it_resembles() -> None:
    cfg = parse_config({
        "memory": {"backnd": "qmd", "qmd": {"update": {"intervall": "5m"},
                                            "paths": [{"path": "notes", "patern": "*.md"}]}},
        "agents": {"defaults": {"memorySearch": {"provder": "local", "extraPaths": [
            "a", {"path": "b", "glob": "*.md"}], "query": {"hybrid": {"mmr": {"lamda": 0.5}}}}},
                   "list": [{"id": "main", "memorySearch": {"chunking": {"token": 100}}}]}})
    assert cfg.warnings == [
        "agents.defaults.memorySearch.provder: unknown key, ignored (did you mean provider?)",
        "agents.defaults.memorySearch.extraPaths[1].glob: unknown key, ignored",
        "agents.defaults.memorySearch.query.hybrid.mmr.lamda: unknown key, ignored (did you mean lambda?)",
        "memory.backnd: unknown key, ignored (did you mean backend?)",
        "memory.qmd.update.intervall: unknown key, ignored (did you mean interval?)",
        "memory.qmd.paths[0].patern: unknown key, ignored (did you mean pattern?)"]
    assert cfg.agents[0].warnings == [
        "agents.list[0].memorySearch.chunking.token: unknown key, ignored (did you mean tokens?)"]
    # still read as before: the misspelt keys change nothing
    assert (cfg.memory.backend, cfg.memory.qmd.update.interval_ms) == ("builtin", 300_000)
    assert resolve_agent(cfg, env={}).memory_search.provider == "auto"


@pytest.mark.parametrize(("rule", "key", "error"), [
    ({"action": "allow", "match": {"chattype": "direct"}}, "memory.qmd.scope.rules[0].match",
     "{'chattype': 'direct'} (expected only the keys channel, chatType, keyPrefix, rawKeyPrefix, "
     "not 'chattype' (did you mean chatType?)"),
    ({"action": "allow", "mach": {"chatType": "direct"}}, "memory.qmd.scope.rules[0]",
     "{'action': 'allow', 'mach': {'chatType': 'direct'}} (expected only the keys action, match, "
     "not 'mach' (did you mean match?)"),
])
def test_a_misspelt_key_of_a_scope_rule_is_a_config_error(tmp_path: Path, rule: dict[str, Any],
                                                          key: str, error: str) -> None:
    """Ignored, the misspelt key left a rule matching every session: "allow direct chats"
    allowed group chats (the reference refuses such a config too)."""
    config = tmp_path / "openclaw.json"
    config.write_text(json5.dumps({"memory": {"qmd": {"scope": {"default": "deny", "rules": [rule]}}}}))
    with pytest.raises(ConfigError) as info:
        load_config(config)
    assert str(info.value) == (f"{config}: {key}: invalid value {error}: the rule would apply to "
                               "more sessions without it)")
    rule = {"action": "allow", "match": {"chatType": "direct", "keyPrefix": "discord:"}}
    config.write_text(json5.dumps({"memory": {"qmd": {"scope": {"default": "deny", "rules": [rule]}}}}))
    assert load_config(config).memory.qmd.scope.rules[0].match.key_prefix == "discord:"


def test_openclaw_keys_we_do_not_read_are_quiet() -> None:
    cfg = parse_config({
        "gateway": {"port": 18789}, "channels": {"telegram": {"enabled": True}},
        "memory": {"isolation": {"enabled": True}, "search": {"store": {"cache": {"enabled": True}}},
                   "qmd": {"searchTool": "query", "mcporter": {"enabled": True, "serverName": "qmd", "startDaemon": True},
                           "update": {"startup": "off", "startupDelayMs": 1000}}},
        "agents": {"defaults": {"model": {"primary": "openai/gpt-5.5"}},
                   "list": [{"id": "main", "name": "Main", "tools": {"allow": ["exec"]},
                             "memorySearch": {"store": {"cache": {"maxEntries": 5}},
                                              "local": {"contextSize": "auto"},
                                              "multimodal": {"enabled": False, "modalities": ["image"]}}}]}})
    assert (cfg.warnings, cfg.agents[0].warnings) == ([], [])


@pytest.mark.anyio
async def test_status_lists_the_warning_and_search_still_answers(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "MEMORY.md").write_text("# Memory\n\n- the kettle is blue\n")
    path = tmp_path / "openclaw.json"
    path.write_text("{memory: {search: {provider: 'none', querry: {maxResults: 2}}}}")
    agent = resolve_agent(load_config(path), workspace=ws,
                          env={"OPENCLAW_STATE_DIR": str(tmp_path / "state")})
    async with MemoryManager(agent) as memory:
        status = await memory.status()
        hits = await memory.search("kettle")
    assert status.to_json_dict()["configWarnings"] == [
        "memory.search.querry: unknown key, ignored (did you mean query?)"]
    assert [h.path for h in hits.results] == ["MEMORY.md"]
