"""Config: JSON5 loading, defaults, clamping, per-agent merge, workspace rules and the one-line
errors (file, dotted key path, what was expected)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fallback.errors import ConfigError, UsageError
from qmdbridge.command_line import program_of
from qmdbridge.config import OpenClawConfig, load_config, parse_config, parse_duration_ms, resolve_agent


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "openclaw.json"
    p.write_text(text)
    return p


def test_defaults_match_the_specs(tmp_path: Path) -> None:
    env = {"OPENCLAW_STATE_DIR": str(tmp_path / "st")}
    agent = resolve_agent(OpenClawConfig(), env=env)
    assert agent.agent_id == "main"
    assert agent.workspace_dir == (tmp_path / "st" / "workspace").resolve()
    assert agent.engine.db_path == (tmp_path / "st" / "memory" / "main.sqlite").resolve()
    ms = agent.memory_search
    assert (ms.provider, ms.chunking.tokens, ms.chunking.overlap) == ("auto", 400, 80)
    assert (ms.query.max_results, ms.query.min_score) == (6, 0.35)
    assert (ms.query.hybrid.vector_weight, ms.query.hybrid.text_weight) == (0.7, 0.3)
    assert ms.query.hybrid.candidate_multiplier == 4
    assert (ms.query.hybrid.mmr.enabled, ms.query.hybrid.mmr.lambda_) == (False, 0.7)
    assert (ms.query.hybrid.temporal_decay.enabled, ms.query.hybrid.temporal_decay.half_life_days) == (False, 30)
    assert (ms.cache.enabled, ms.cache.max_entries) == (True, 50_000)
    assert ms.sources == ["memory"] and ms.max_file_bytes == 10 * 1024 * 1024
    q = agent.memory.qmd
    assert agent.memory.backend == "builtin" and agent.memory.citations == "auto"
    assert (q.search_mode, q.limits.max_results, q.limits.max_snippet_chars,
            q.limits.max_injected_chars, q.limits.timeout_ms) == ("search", 6, 700, 4000, 4000)
    assert (q.update.interval_ms, q.update.debounce_ms, q.update.embed_interval_ms) == (300_000, 15_000, 3_600_000)
    assert (q.update.command_timeout_ms, q.update.update_timeout_ms, q.update.embed_timeout_ms) == (30_000, 120_000, 120_000)
    assert q.scope.default == "deny" and q.scope.rules[0].match.chat_type == "direct"


def test_clamping_and_normalisation() -> None:
    cfg = parse_config({"agents": {"defaults": {"memorySearch": {
        "chunking": {"tokens": 0, "overlap": 50},
        "query": {"minScore": 3, "hybrid": {"vectorWeight": 0, "textWeight": 0, "candidateMultiplier": 99,
                                            "mmr": {"lambda": -1}, "temporalDecay": {"halfLifeDays": 0.5}}},
        "cache": {"maxEntries": 0},
        "sources": ["sessions", "memory", "memory"],
        "extraPaths": [" notes ", "notes", ""],
    }}}})
    ms = resolve_agent(cfg, env={}).memory_search
    assert (ms.chunking.tokens, ms.chunking.overlap) == (1, 0)
    assert ms.query.min_score == 1.0
    assert (ms.query.hybrid.vector_weight, ms.query.hybrid.text_weight) == (0.7, 0.3)
    assert ms.query.hybrid.candidate_multiplier == 20
    assert ms.query.hybrid.mmr.lambda_ == 0.0
    assert ms.query.hybrid.temporal_decay.half_life_days == 1
    assert ms.cache.max_entries == 1
    assert ms.sources == ["memory"]  # sessions need experimental.sessionMemory
    assert ms.extra_paths == ["notes"]


def test_sessions_source_needs_the_experimental_flag() -> None:
    cfg = parse_config({"agents": {"defaults": {"memorySearch": {
        "sources": ["memory", "sessions"], "experimental": {"sessionMemory": True}}}}})
    assert resolve_agent(cfg, env={}).memory_search.sources == ["memory", "sessions"]


def test_per_agent_override_and_workspace_rules(tmp_path: Path) -> None:
    cfg = parse_config({
        "agents": {
            "defaults": {"workspace": str(tmp_path / "base"),
                         "memorySearch": {"extraPaths": ["shared"], "query": {"maxResults": 9, "minScore": 0.2}}},
            "list": [{"id": "Main", "default": True, "memorySearch": {"extraPaths": ["mine"], "query": {"minScore": 0.5}}},
                     {"id": "coder"},
                     {"id": "ops", "workspace": str(tmp_path / "ops-ws")}],
        }})
    env = {"OPENCLAW_STATE_DIR": str(tmp_path / "st")}
    main = resolve_agent(cfg, env=env)
    assert main.agent_id == "main" and main.workspace_dir == (tmp_path / "base").resolve()
    assert main.memory_search.extra_paths == ["shared", "mine"]
    assert (main.memory_search.query.max_results, main.memory_search.query.min_score) == (9, 0.5)
    coder = resolve_agent(cfg, "coder", env=env)
    assert coder.workspace_dir == (tmp_path / "base" / "coder").resolve()
    assert coder.memory_search.extra_paths == ["shared"]
    assert resolve_agent(cfg, "ops", env=env).workspace_dir == (tmp_path / "ops-ws").resolve()
    assert resolve_agent(cfg, "ops", workspace=tmp_path / "cli", env=env).workspace_dir == (tmp_path / "cli").resolve()
    for blank in ("", "  "):  # not the current folder
        with pytest.raises(UsageError, match="workspace must not be empty"):
            resolve_agent(cfg, "ops", workspace=blank, env=env)
    # no agents.defaults.workspace: the state dir's (docs/cli.md, docs/configuration.md)
    bare = parse_config({"agents": {"list": [{"id": "main", "default": True}, {"id": "coder"}]}})
    assert [resolve_agent(bare, a, env=env).workspace_dir for a in ("main", "coder")] == [
        (tmp_path / "st" / "workspace").resolve(), (tmp_path / "st" / "workspace-coder").resolve()]


def test_store_path_template(tmp_path: Path) -> None:
    cfg = parse_config({"agents": {"defaults": {"memorySearch": {"store": {"path": str(tmp_path / "{agentId}.db")}}}}})
    assert resolve_agent(cfg, "Ops", env={}).engine.db_path == (tmp_path / "ops.db").resolve()


def test_json5_file_with_unknown_keys_loads(tmp_path: Path) -> None:
    p = _write(tmp_path, """{
      // a full OpenClaw config has many other sections
      gateway: { port: 18789 }, channels: { telegram: { enabled: true } },
      memory: { backend: 'qmd', citations: 'bogus', qmd: { command: '"/opt/QMD Tools/qmd" --x', futureKey: 1,
                update: { interval: '30s', embedInterval: 0 } } },
    }""")
    cfg = load_config(p)
    assert cfg.memory.backend == "qmd" and cfg.memory.citations == "auto"
    # read as auto, as the reference does, but never silently (status and doctor list it); so
    # is a key of memory.* no model has (other sections are not ours: no warning)
    assert cfg.warnings == ["memory.citations: 'bogus' is not auto, on or off; using auto",
                            "memory.qmd.futureKey: unknown key, ignored"]
    assert program_of(cfg.memory.qmd.command) == "/opt/QMD Tools/qmd"
    assert cfg.memory.qmd.update.interval_ms == 30_000 and cfg.memory.qmd.update.embed_interval_ms == 0
    assert cfg.source_file == str(p)


@pytest.mark.parametrize("text,key,expected", [
    ("{memory: {backend: 'sqlite'}}", "memory.backend", "(expected 'builtin', 'qmd' or 'none')"),
    ("{memory: {qmd: {limits: {timeoutMs: -5}}}}", "memory.qmd.limits.timeoutMs", "greater than 0"),
    ("{memory: {qmd: {update: {interval: 'soon'}}}}", "memory.qmd.update.interval", "a duration like"),
    ("{memory: {qmd: {paths: [{name: 'x'}]}}}", "memory.qmd.paths[0].path", "field required"),
    ("{agents: {defaults: {memorySearch: {chunking: {tokens: 'many'}}}}}",
     "agents.defaults.memorySearch.chunking.tokens", "valid integer"),
    ("{agents: {list: [{id: 'a', memorySearch: {provider: 'bogus'}}]}}",
     "agents.list[0].memorySearch.provider", "(expected 'auto', 'none', 'openai'"),
    ("{memory: []}", "memory", "an object"),
    ("{agents: {defaults: {memorySearch: {query: {timeoutMs: 5}}}}}",
     "agents.defaults.memorySearch.query.timeoutMs", "milliseconds from 100 to 600000"),
    ("{memory: {qmd: {update: {interval: -5}}}}", "memory.qmd.update.interval", "a non-negative duration"),
    ("{memory: {qmd: {update: {embedInterval: Infinity}}}}", "memory.qmd.update.embedInterval",
     "invalid value inf (expected a non-negative duration)"),
    ("{memory: {qmd: {limits: {timeoutMs: NaN}}}}", "memory.qmd.limits.timeoutMs",
     "invalid value nan (expected a finite number)"),
    ("{agents: {defaults: {memorySearch: {chunking: {tokens: -Infinity}}}}}",
     "agents.defaults.memorySearch.chunking.tokens", "(expected a finite number)"),
    ("{agents: {defaults: {workspace: 42}}}", "agents.defaults.workspace", "invalid value 42 (expected a path string)"),
])
def test_bad_values_name_file_key_and_expectation(tmp_path: Path, text: str, key: str, expected: str) -> None:
    p = _write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(p)
    err = info.value
    assert err.file == str(p) and err.key == key
    assert expected in str(err).lower()
    assert "\n" not in str(err)


def test_syntax_errors_and_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="invalid JSON5"):
        load_config(_write(tmp_path, "{memory: {backend: 'qmd',,}}"))
    with pytest.raises(ConfigError) as unclosed:
        load_config(_write(tmp_path, "{ agents: { defaults: {\n  memorySearch: { provider: tru } } } }\n"))
    assert str(unclosed.value).endswith("invalid JSON5: line 2, column 32: Unexpected \" \"")
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "missing.json5")
    bad = tmp_path / "latin1.json"
    bad.write_bytes(b"{memory: {backend: '\xe9'}}")
    with pytest.raises(ConfigError, match="not valid UTF-8 at byte 20"):
        load_config(bad)
    assert load_config(_write(tmp_path, "  \n")).memory.backend == "builtin"
    (tmp_path / "folder.json5").mkdir()
    with pytest.raises(ConfigError) as folder:
        load_config(tmp_path / "folder.json5")
    assert str(folder.value) == f"{tmp_path / 'folder.json5'}: cannot read config file: Is a directory"


def test_default_config_path_is_used_when_present(tmp_path: Path) -> None:
    env = {"OPENCLAW_STATE_DIR": str(tmp_path)}
    assert load_config(env=env).source_file is None
    _write(tmp_path, "{memory: {backend: 'none'}}")
    assert load_config(env=env).memory.backend == "none"


@pytest.mark.parametrize("value,ms", [("5m", 300_000), ("15", 900_000), ("0s", 0), ("250ms", 250),
                                      ("1.5h", 5_400_000), ("2d", 172_800_000), (0, 0), (10, 600_000)])
def test_durations(value: str | int, ms: int) -> None:
    assert parse_duration_ms(value) == ms


@pytest.mark.parametrize("value", ["", "5 minutes", "-1m", True])
def test_bad_durations(value: str | bool) -> None:
    with pytest.raises(ValueError):
        parse_duration_ms(value)


@pytest.mark.parametrize("bad", ["../../evil", "a/b", "a\\b", ".hidden", "x/../y"])
def test_agent_ids_cannot_escape_the_state_dir(bad: str) -> None:
    with pytest.raises(ConfigError, match="invalid agent id"):
        resolve_agent(OpenClawConfig(), bad, env={})


def test_agent_ids_are_normalised() -> None:
    assert resolve_agent(OpenClawConfig(), " Ops Bot ", env={}).agent_id == "ops-bot"


def test_comment_only_file_is_an_empty_config_and_bad_caps_are_refused(tmp_path: Path) -> None:
    assert load_config(_write(tmp_path, "// nothing configured yet\n/* really */\n")).memory.backend == "builtin"
    with pytest.raises(ConfigError) as info:
        load_config(_write(tmp_path, "{agents: {defaults: {memorySearch: {maxFileBytes: -1}}}}"))
    assert info.value.key == "agents.defaults.memorySearch.maxFileBytes"


def test_a_bad_agent_id_in_the_file_names_the_file_and_key(tmp_path: Path) -> None:
    listed = _write(tmp_path, '{agents: {list: [{id: "main"}, {id: "a/b"}]}}')
    with pytest.raises(ConfigError) as info:
        load_config(listed)
    assert (info.value.file, info.value.key) == (str(listed), "agents.list[1].id")
    assert str(info.value) == (f"{listed}: agents.list[1].id: invalid agent id 'a/b' "
                               "(expected a name without path separators or '..')")
    keyed = tmp_path / "entries.json5"
    keyed.write_text('{agents: {entries: {"../x": {workspace: "/tmp"}}}}')
    with pytest.raises(ConfigError) as info:
        load_config(keyed)
    assert (info.value.file, info.value.key) == (str(keyed), "agents.entries.../x")


def test_a_missing_required_key_is_named_as_missing(tmp_path: Path) -> None:
    # not "invalid value {'memorySearch': {}}": the value shown would be one the user never wrote
    p = _write(tmp_path, "{agents: {list: [{workspace: '/tmp/w'}]}}")
    with pytest.raises(ConfigError) as info:
        load_config(p)
    assert str(info.value) == f"{p}: agents.list[0].id: missing (expected field required)"


def test_an_openclaw_secret_ref_api_key_loads_and_keeps_searches_on_the_engine(tmp_path: Path) -> None:
    from fallback.settings import SecretRef
    from qmdbridge.cli.search_cache import provider_env_keys

    cfg = load_config(_write(tmp_path, '{agents: {defaults: {memorySearch: {remote: {apiKey: '
                                       '{source: "env", provider: "default", id: "MEMORY_KEY"}}}}}}'))
    agent = resolve_agent(cfg, workspace=tmp_path, env={"OPENCLAW_STATE_DIR": str(tmp_path / "st")})
    assert agent.memory_search.remote.api_key == SecretRef(source="env", provider="default", id="MEMORY_KEY")
    # the variable it names may be set by the next search: the one-shot shortcut never answers it
    assert provider_env_keys(agent, {}) is None
    cfg = load_config(_write(tmp_path, '{models: {providers: {voyage: {apiKey: '
                                       '{source: "env", provider: "default", id: "MEMORY_KEY"}}}}}'))
    agent = resolve_agent(cfg, workspace=tmp_path, env={"OPENCLAW_STATE_DIR": str(tmp_path / "st")})
    assert provider_env_keys(agent, {}) is None  # OpenClaw's models.providers key: the same


def test_an_unset_variable_as_a_models_providers_key_is_never_sent_as_the_key(tmp_path: Path) -> None:
    """``models.providers.<id>.apiKey: "${VAR}"`` with ``VAR`` unset becomes the SecretRef of
    ``VAR`` (as ``remote.apiKey`` does), so the literal ``${VAR}`` is never sent as a key."""
    from fallback.embeddings import select_provider
    from fallback.settings import SecretRef

    cfg = load_config(_write(tmp_path, '{models: {providers: {openai: {apiKey: "${MEMORY_OPENAI}"}}}}'),
                      env={})
    assert cfg.warnings == ["models.providers.openai.apiKey: ${MEMORY_OPENAI} is not set; left as written"]
    agent = resolve_agent(cfg, workspace=tmp_path, env={"OPENCLAW_STATE_DIR": str(tmp_path / "st")})
    assert agent.memory_search.model_providers["openai"].api_key == SecretRef(
        source="env", provider="default", id="MEMORY_OPENAI")
    openai = agent.memory_search.model_copy(update={"provider": "openai"})
    assert select_provider(openai, env={}).unavailable_reason == (
        "no API key found for openai (its models.providers apiKey names $MEMORY_OPENAI, which is not set)")


def test_variables_in_config_strings_are_substituted_as_openclaw_does(tmp_path: Path) -> None:
    path = _write(tmp_path, """{
      // OpenClaw's ${NAME} references: upper-case names, $${NAME} for the text itself
      agents: { defaults: {
        workspace: "${AGENT_HOME}/ws",
        memorySearch: { extraPaths: ["${NOTES}", "${lower}/x", "$${AGENT_HOME}"],
                        remote: { apiKey: "${EMBEDDINGS_API_KEY}", baseUrl: "${EMPTY}/v1" } },
      } },
    }""")
    env = {"OPENCLAW_STATE_DIR": str(tmp_path / "st"), "AGENT_HOME": str(tmp_path / "home"),
           "NOTES": "/srv/notes", "EMBEDDINGS_API_KEY": "sk-env", "EMPTY": ""}
    cfg = load_config(path, env=env)
    agent = resolve_agent(cfg, env=env)
    ms = agent.memory_search
    assert agent.workspace_dir == (tmp_path / "home" / "ws").resolve()
    assert [str(p) for p in ms.extra_paths] == ["/srv/notes", "${lower}/x", "${AGENT_HOME}"]
    assert (ms.remote.api_key, ms.remote.base_url) == ("sk-env", "${EMPTY}/v1")
    assert cfg.warnings == ["agents.defaults.memorySearch.remote.baseUrl: ${EMPTY} is not set; left as written"]


def test_an_api_key_that_names_an_unset_variable_reads_as_its_secret_ref(tmp_path: Path) -> None:
    from fallback.embeddings import select_provider
    from fallback.settings import SecretRef

    path = _write(tmp_path, '{agents: {defaults: {memorySearch: {provider: "openai", remote: '
                            '{apiKey: "${EMBEDDINGS_API_KEY}"}, query: {rerank: {apiKey: "${RERANK_KEY}"}}}}}}')
    cfg = load_config(path, env={})
    ms = resolve_agent(cfg, workspace=tmp_path, env={}).memory_search
    assert ms.remote.api_key == SecretRef(source="env", provider="default", id="EMBEDDINGS_API_KEY")
    assert ms.query.rerank.api_key == SecretRef(source="env", provider="default", id="RERANK_KEY")
    assert select_provider(ms, env={}).error == (
        "memory search unavailable: openai: no API key found for openai (remote.apiKey names "
        "$EMBEDDINGS_API_KEY, which is not set)")
    assert cfg.warnings == [
        "agents.defaults.memorySearch.remote.apiKey: ${EMBEDDINGS_API_KEY} is not set; left as written",
        "agents.defaults.memorySearch.query.rerank.apiKey: ${RERANK_KEY} is not set; left as written"]


def _number_keys(model: type, path: str) -> list[str]:
    """The dotted key path of every number setting of ``model`` and its nested models."""
    from types import UnionType
    from typing import Union, get_args, get_origin

    from fallback.settings import SettingsModel

    keys = []
    for name, field in model.model_fields.items():  # type: ignore[attr-defined]
        ann = field.annotation
        kinds = get_args(ann) if get_origin(ann) in (Union, UnionType) else (ann,)
        key = f"{path}.{field.alias or name}"
        if bool not in kinds and any(k in (int, float) for k in kinds):
            keys.append(key)
        keys += [k for kind in kinds if isinstance(kind, type) and issubclass(kind, SettingsModel)
                 for k in _number_keys(kind, key)]
    return keys


def test_true_or_false_for_a_number_setting_is_a_config_error_naming_it(tmp_path: Path) -> None:
    from fallback.settings import MemorySearchSettings
    from qmdbridge.config import CompactionSettings, MemoryConfig

    keys = [*_number_keys(MemoryConfig, "memory"),
            *_number_keys(MemorySearchSettings, "agents.defaults.memorySearch"),
            *_number_keys(CompactionSettings, "agents.defaults.compaction")]
    assert {"memory.qmd.limits.maxResults", "agents.defaults.memorySearch.query.maxResults",
            "agents.defaults.memorySearch.query.minScore", "agents.defaults.memorySearch.chunking.tokens",
            "agents.defaults.memorySearch.sync.sessions.deltaBytes"} <= set(keys)
    for key in keys:
        doc: dict[str, object] = {}
        *parents, last = key.split(".")
        node = doc
        for part in parents:
            node = node.setdefault(part, {})  # type: ignore[assignment]
        for value in (True, False):
            node[last] = value
            with pytest.raises(ConfigError) as info:
                parse_config(doc, file="c.json")
            assert (info.value.key, info.value.expected) == (key, "a number, not true or false")
    ms = resolve_agent(parse_config({"agents": {"defaults": {"memorySearch": {"query": {
        "maxResults": 6.0, "minScore": 1}}}}})).memory_search
    assert (ms.query.max_results, ms.query.min_score) == (6, 1.0)  # JSON5 numbers as written
