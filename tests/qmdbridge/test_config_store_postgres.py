"""``memorySearch.store`` for the postgres store: driver, dsn, schema, shareWith and deadlines,
in the defaults and per agent like every memorySearch key."""

from __future__ import annotations

from pathlib import Path

import pytest

from fallback.errors import ConfigError
from qmdbridge.config import parse_config, resolve_agent

DSN = "postgresql://agent:pa55-word@db.internal:5432/memory"


def config(tmp_path: Path) -> dict[str, object]:
    return {"agents": {
        "defaults": {"memorySearch": {"store": {"driver": "postgres", "dsn": DSN, "schema": "mem",
                                                "shareWith": ["Bob"]}}},
        "list": [{"id": "main", "default": True, "workspace": str(tmp_path / "main")},
                 {"id": "bob", "workspace": str(tmp_path / "bob"),
                  "memorySearch": {"store": {"shareWith": [], "statementTimeoutMs": 2500}}},
                 {"id": "solo", "workspace": str(tmp_path / "solo"),
                  "memorySearch": {"store": {"driver": "sqlite"}}}]}}


def test_store_keys_in_defaults_and_per_agent(tmp_path: Path) -> None:
    cfg = parse_config(config(tmp_path))
    env = {"OPENCLAW_STATE_DIR": str(tmp_path / "state")}
    main = resolve_agent(cfg, "main", env=env).memory_search.store
    bob = resolve_agent(cfg, "bob", env=env).memory_search.store
    solo = resolve_agent(cfg, "solo", env=env).memory_search.store
    assert (main.driver, main.dsn, main.schema_, main.share_with) == ("postgres", DSN, "mem", ["bob"])
    assert (main.connect_timeout_ms, main.statement_timeout_ms) == (5000, 10000)
    assert (bob.driver, bob.dsn, bob.schema_, bob.share_with) == ("postgres", DSN, "mem", [])
    assert bob.statement_timeout_ms == 2500
    assert (solo.driver, solo.dsn) == ("sqlite", DSN)
    assert "pa55-word" not in repr(main)


def test_unknown_driver_names_the_key(tmp_path: Path) -> None:
    data = config(tmp_path)
    data["agents"]["defaults"]["memorySearch"]["store"]["driver"] = "mysql"  # type: ignore[index]
    with pytest.raises(ConfigError) as caught:
        resolve_agent(parse_config(data), "main", env={"OPENCLAW_STATE_DIR": str(tmp_path)})
    assert caught.value.key == "agents.defaults.memorySearch.store.driver"
    assert "pa55-word" not in str(caught.value)


def test_a_postgres_driver_is_taken_without_a_config_warning(tmp_path: Path) -> None:
    cfg = parse_config(config(tmp_path))
    env = {"OPENCLAW_STATE_DIR": str(tmp_path / "state")}
    main = resolve_agent(cfg, "main", env=env)
    assert (main.memory_search.store.driver, main.config_warnings) == ("postgres", [])


def test_a_provider_on_the_postgres_store_is_taken_without_a_config_warning(tmp_path: Path) -> None:
    data = config(tmp_path)
    data["agents"]["defaults"]["memorySearch"]["provider"] = "openai"  # type: ignore[index]
    env = {"OPENCLAW_STATE_DIR": str(tmp_path / "state")}
    cfg = parse_config(data)
    main = resolve_agent(cfg, "main", env=env)
    assert (main.memory_search.provider, main.config_warnings) == ("openai", [])
    assert resolve_agent(cfg, "solo", env=env).config_warnings == []


def test_a_share_with_an_agent_the_config_does_not_have_is_a_config_warning(tmp_path: Path) -> None:
    data = config(tmp_path)
    data["agents"]["list"][1]["memorySearch"]["store"]["shareWith"] = [" Main ", "Reviewer", "bobb"]  # type: ignore[index]
    cfg = parse_config(data)
    env = {"OPENCLAW_STATE_DIR": str(tmp_path / "state")}
    its_agents = "(its agents: main, bob, solo); the share is recorded under that name"
    assert resolve_agent(cfg, "bob", env=env).config_warnings == [
        f"agents.list[1].memorySearch.store.shareWith: 'reviewer' is not an agent of this config {its_agents}",
        f"agents.list[1].memorySearch.store.shareWith: 'bobb' is not an agent of this config {its_agents}"]
    assert resolve_agent(cfg, "main", env=env).config_warnings == []  # shares with bob, listed
    # in the defaults: one warning, config-wide; with no agents listed the one agent is main
    alone = parse_config({"agents": {"defaults": {"memorySearch": {"store": {
        "driver": "postgres", "dsn": DSN, "shareWith": ["main", "ops"]}}}}})
    assert alone.warnings == ["agents.defaults.memorySearch.store.shareWith: 'ops' is not an agent"
                              " of this config (its agents: main); the share is recorded under that name"]
    assert resolve_agent(alone, None, env=env).config_warnings == alone.warnings


@pytest.mark.parametrize("schema", ["Memory", 'a"b', "9lives", "a" * 64])
def test_a_schema_that_is_not_a_lower_case_identifier_names_its_key_and_file(
        tmp_path: Path, schema: str) -> None:
    from qmdbridge.config import load_config

    path = tmp_path / "openclaw.json"
    data = config(tmp_path)
    data["agents"]["list"][1]["memorySearch"]["store"]["schema"] = schema  # type: ignore[index]
    path.write_text(__import__("json").dumps(data))
    with pytest.raises(ConfigError) as caught:
        resolve_agent(load_config(path, env={}), "bob", env={"OPENCLAW_STATE_DIR": str(tmp_path)})
    assert (caught.value.file, caught.value.key) == (str(path), "agents.list[1].memorySearch.store.schema")
    assert str(caught.value).endswith(
        f"invalid value {schema!r} (expected a lower-case SQL identifier (a-z, 0-9 and _, not"
        " starting with a digit, at most 63 characters), e.g. qmdbridge)")
    data["agents"]["list"][1]["memorySearch"]["store"]["schema"] = "a" * 63  # type: ignore[index]
    assert resolve_agent(parse_config(data), "bob", env={}).memory_search.store.schema_ == "a" * 63
