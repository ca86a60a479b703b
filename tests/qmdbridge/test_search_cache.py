"""The settings a one-shot search records for its fast path (qmdbridge/cli/search_cache.py) and when
they are used (qmdbridge/cli/fast_search.py): only for a search that needs no engine, only under
the same config, environment, flags and code."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

import pytest

from fallback.embeddings import AUTO_ENV_KEYS
from qmdbridge.cli import fast_search
from qmdbridge.cli.fast_search import CACHE_DIR_NAME, settings_key, settings_path
from qmdbridge.cli.main import build_parser
from qmdbridge.cli.search_cache import MAX_FILES, record_search_settings
from qmdbridge.config import load_config, resolve_agent


@pytest.fixture
def setup(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    ws = tmp_path / "ws"
    (ws / "memory").mkdir(parents=True)
    (ws / "memory" / "2026-01-05.md").write_text("# 2026-01-05\n\n- Kestrel is paused.\n")
    env = {k: v for k, v in os.environ.items() if k not in AUTO_ENV_KEYS and k != "QMDBRIDGE_CLI_CACHE"}
    env["OPENCLAW_STATE_DIR"] = str(tmp_path / "state")
    env["HOME"] = str(tmp_path / "home")
    (tmp_path / "state").mkdir()
    return ws, env


def _args(*argv: str) -> argparse.Namespace:
    return build_parser("search").parse_args(["search", *argv])


def _record(args: argparse.Namespace, env: dict[str, str], config: dict[str, Any] | None = None) -> bool:
    """What the CLI does after an in-process search: the key first, then the config."""
    cfg_file = Path(env["OPENCLAW_STATE_DIR"]) / "openclaw.json"
    if config is not None:
        cfg_file.write_text(json.dumps(config))
    key = settings_key(args, env)
    cfg = load_config(args.config, env=env)
    agent = resolve_agent(cfg, args.agent, workspace=args.workspace, env=env)
    return record_search_settings(args, cfg, agent, key=key, env=env)


def _recorded(args: argparse.Namespace, env: dict[str, str]) -> dict[str, Any] | None:
    return fast_search._recorded(args, env)


def try_fast_search(args: argparse.Namespace, env: dict[str, str]) -> int | None:
    """What ``main`` does without a daemon: the recorded settings, then the answer from them."""
    doc = fast_search.recorded_search(args, env)
    return None if doc is None else fast_search.answer_recorded(args, doc)


def test_a_keyword_only_builtin_search_is_recorded(setup: tuple[Path, dict[str, str]]) -> None:
    ws, env = setup
    args = _args("Kestrel", "--workspace", str(ws))
    assert _record(args, env, {"agents": {"defaults": {"memorySearch": {"provider": "none"}}}})
    doc = _recorded(args, env)
    assert doc is not None
    assert (doc["citations"], doc["keywordNotice"], doc["providerEnvKeys"], doc["cwd"]) == (
        "auto", False, [], None)
    settings = doc["settings"]
    state = Path(env["OPENCLAW_STATE_DIR"]).resolve()
    assert settings["dbPath"] == str(state / "memory" / "main.sqlite")
    assert settings["workspaceDir"] == str(ws.resolve())
    assert (settings["maxResults"], settings["minScore"], settings["halfLifeDays"]) == (6, 0.35, None)
    assert settings["identity"]["model"] == "fts-only"
    assert Path(settings_path(settings_key(args, env))).parent == state / CACHE_DIR_NAME
    assert (state / CACHE_DIR_NAME).stat().st_mode & 0o777 == 0o700


def test_auto_records_the_keys_that_would_give_it_a_provider(setup: tuple[Path, dict[str, str]]) -> None:
    ws, env = setup
    args = _args("Kestrel", "--workspace", str(ws))
    assert _record(args, env)  # no config: provider "auto", no key in the environment
    doc = _recorded(args, env)
    assert doc is not None and doc["keywordNotice"] is True
    assert doc["providerEnvKeys"] == list(AUTO_ENV_KEYS) == [
        "OPENAI_API_KEY", "GEMINI_API_KEY", "GOOGLE_API_KEY", "VOYAGE_API_KEY", "MISTRAL_API_KEY"]
    for name in AUTO_ENV_KEYS:  # set later: the search may have a provider now
        assert _recorded(args, {**env, name: "sk-test"}) is None
        assert _recorded(args, {**env, name: "  "}) is not None  # blank is unset for the providers
    # set now: the provider is in use, nothing is recorded (and a recorded file goes)
    assert not _record(args, {**env, "OPENAI_API_KEY": "sk-test"})
    assert not Path(settings_path(settings_key(args, env))).exists()


@pytest.mark.parametrize("config, flags", [
    ({"agents": {"defaults": {"memorySearch": {"provider": "openai"}}}}, []),
    ({"agents": {"defaults": {"memorySearch": {"local": {"modelPath": "/models/x.gguf"}}}}}, []),
    ({"agents": {"defaults": {"memorySearch": {"remote": {"apiKey": "sk-in-config"}}}}}, []),
    ({"agents": {"defaults": {"memorySearch": {
        "provider": "none", "sources": ["memory", "sessions"], "experimental": {"sessionMemory": True}}}}}, []),
    ({"agents": {"defaults": {"memorySearch": {
        "provider": "none", "query": {"rerank": {"provider": "http", "model": "m", "baseUrl": "http://127.0.0.1:9"}}}}}}, []),
    ({"memory": {"backend": "qmd"}, "agents": {"defaults": {"memorySearch": {"provider": "none"}}}}, []),
    ({"agents": {"defaults": {"memorySearch": {"provider": "none"}}}}, ["--backend", "qmd"]),
])
def test_a_search_that_needs_the_engine_is_not_recorded(setup: tuple[Path, dict[str, str]],
                                                        config: dict[str, Any], flags: list[str]) -> None:
    ws, env = setup
    (Path(env["OPENCLAW_STATE_DIR"]) / "openclaw.json").write_text(json.dumps(config))
    args = _args("Kestrel", "--workspace", str(ws), *flags)
    path = Path(settings_path(settings_key(args, env)))
    path.parent.mkdir(parents=True)
    path.write_text("{}")  # whatever was there for this key goes
    assert not _record(args, env)
    assert not path.exists()


def test_a_changed_config_home_flag_or_cwd_is_another_key(setup: tuple[Path, dict[str, str]], tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    ws, env = setup
    cfg = Path(env["OPENCLAW_STATE_DIR"]) / "openclaw.json"
    args = _args("Kestrel", "--workspace", str(ws))
    assert _record(args, env, {"memory": {"citations": "off"}})
    assert _recorded(args, env) is not None
    cfg.write_text(json.dumps({"memory": {"citations": "on"}}))  # same size, new mtime
    assert _recorded(args, env) is None
    assert _recorded(args, {**env, "HOME": str(tmp_path)}) is None
    assert _recorded(_args("Kestrel", "--workspace", str(ws), "--agent", "main"), env) is None
    assert _recorded(_args("Kestrel", "--workspace", str(ws), "--backend", "builtin"), env) is None

    # a workspace named relative to the cwd in the config: recorded with the cwd, used only there
    monkeypatch.chdir(ws.parent)
    rel = _args("Kestrel")
    assert _record(rel, env, {"agents": {"defaults": {"workspace": "ws"}}})
    doc = _recorded(rel, env)
    assert doc is not None and doc["cwd"] == str(ws.parent)
    assert doc["settings"]["workspaceDir"] == str(ws.resolve())
    monkeypatch.chdir(tmp_path / "state")
    assert _recorded(rel, env) is None
    # an absolute --workspace given relative to the cwd is resolved into the key instead
    monkeypatch.chdir(ws.parent)
    assert _record(_args("Kestrel", "--workspace", "ws"), env)
    assert _recorded(_args("Kestrel", "--workspace", "ws"), env)["cwd"] is None  # type: ignore[index]
    assert _recorded(_args("Kestrel", "--workspace", str(ws)), env) is not None  # the same key


def test_the_code_stamp_names_real_files(setup: tuple[Path, dict[str, str]]) -> None:
    _, env = setup
    stamp = settings_key(_args("x"), env)["code"]
    assert [row[0] for row in stamp] == list(fast_search.CODE_FILES)
    assert all(isinstance(size, int) and size > 0 and isinstance(mtime, int) for _, size, mtime in stamp)


def test_turned_off_or_unusable_files_leave_it_to_the_engine(setup: tuple[Path, dict[str, str]]) -> None:
    ws, env = setup
    args = _args("Kestrel", "--workspace", str(ws))
    off = {**env, "QMDBRIDGE_CLI_CACHE": "off"}
    assert not _record(args, off)
    assert not (Path(env["OPENCLAW_STATE_DIR"]) / CACHE_DIR_NAME).exists()
    assert _record(args, env)
    assert try_fast_search(args, off) is None
    path = Path(settings_path(settings_key(args, env)))
    good = json.loads(path.read_text())
    for broken in ("not json", json.dumps([1, 2]), json.dumps({**good, "settings": None}),
                   json.dumps({**good, "settings": {**good["settings"], "dbPath": None}}),
                   json.dumps({**good, "settings": {**good["settings"], "candidateMultiplier": "x"}}),
                   json.dumps({**good, "settings": {**good["settings"], "extraPaths": [[1]]}}),
                   json.dumps({**good, "citations": 1}), json.dumps({**good, "paths": [["/ws"]]}),
                   json.dumps({k: v for k, v in good.items() if k != "paths"})):
        path.write_text(broken)
        assert try_fast_search(args, env) is None


@pytest.mark.parametrize("argv", [
    ["Kestrel", "--explain"], ["Kestrel", "--session-key", "agent:main:main"], ["   "],
    ["Kestrel", "--max-results", "0"], ["Kestrel", "--min-score", "1.5"],
])
def test_these_searches_run_in_process(setup: tuple[Path, dict[str, str]], argv: list[str],
                                       capsys: pytest.CaptureFixture[str]) -> None:
    ws, env = setup
    assert _record(_args("Kestrel", "--workspace", str(ws)), env)
    assert try_fast_search(_args(*argv, "--workspace", str(ws)), env) is None
    assert capsys.readouterr() == ("", "")


def test_the_cache_folder_keeps_the_newest_files(setup: tuple[Path, dict[str, str]]) -> None:
    ws, env = setup
    folder = Path(env["OPENCLAW_STATE_DIR"]) / CACHE_DIR_NAME
    folder.mkdir()
    for i in range(MAX_FILES + 6):
        old = folder / f"old{i:02d}.json"
        old.write_text("{}")
        os.utime(old, ns=(i * 1_000_000_000, i * 1_000_000_000))
    args = _args("Kestrel", "--workspace", str(ws))
    assert _record(args, env)
    names = sorted(p.name for p in folder.iterdir())
    assert len(names) == MAX_FILES and Path(settings_path(settings_key(args, env))).name in names
    assert "old00.json" not in names and f"old{MAX_FILES + 5:02d}.json" in names


def test_settings_another_user_could_have_written_are_not_used(setup: tuple[Path, dict[str, str]],
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    ws, env = setup
    args = _args("Kestrel", "--workspace", str(ws), "-v")
    assert _record(args, env)
    path = Path(settings_path(settings_key(args, env)))
    folder = path.parent
    assert (folder.stat().st_mode & 0o777, path.stat().st_mode & 0o777) == (0o700, 0o600)
    assert _recorded(args, env) is not None
    os.chmod(folder, 0o777)  # anyone may have replaced the file
    assert _recorded(args, env) is None
    assert capsys.readouterr().err == (
        f"INFO qmdbridge.cli: one-shot search runs the engine: {folder} is writable by group or others\n")
    os.chmod(folder, 0o700)
    os.chmod(path, 0o666)
    assert _recorded(args, env) is None
    assert capsys.readouterr().err.endswith(f"{path} is writable by group or others\n")
    # the next in-process search puts it right: the folder 0700, the file 0600
    os.chmod(folder, 0o775)
    assert _record(args, env)
    assert (folder.stat().st_mode & 0o777, path.stat().st_mode & 0o777) == (0o700, 0o600)
    assert _recorded(args, env) is not None


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="chown needs root")
def test_settings_owned_by_another_user_are_not_used_nor_written(setup: tuple[Path, dict[str, str]]) -> None:
    ws, env = setup
    args = _args("Kestrel", "--workspace", str(ws))
    assert _record(args, env)
    path = Path(settings_path(settings_key(args, env)))
    os.chown(path, 65534, 65534)
    assert _recorded(args, env) is None
    os.chown(path, 0, 0)
    assert _recorded(args, env) is not None
    os.chown(path.parent, 65534, 65534)  # a folder of another user: neither read nor written
    assert _recorded(args, env) is None
    before = path.read_bytes()
    assert not _record(args, env)
    assert path.read_bytes() == before and path.stat().st_uid == 0


def test_a_permissive_umask_still_writes_a_private_file(setup: tuple[Path, dict[str, str]]) -> None:
    ws, env = setup
    args = _args("Kestrel", "--workspace", str(ws))
    old = os.umask(0)
    try:
        assert _record(args, env)
    finally:
        os.umask(old)
    path = Path(settings_path(settings_key(args, env)))
    assert (path.parent.stat().st_mode & 0o777, path.stat().st_mode & 0o777) == (0o700, 0o600)
    assert _recorded(args, env) is not None


def test_the_file_just_written_is_kept_when_the_clock_is_behind_the_others(
        setup: tuple[Path, dict[str, str]]) -> None:
    ws, env = setup
    folder = Path(env["OPENCLAW_STATE_DIR"]) / CACHE_DIR_NAME
    folder.mkdir(mode=0o700)
    future = (2**33) * 1_000_000_000  # year 2242: written while the clock was far ahead
    for i in range(MAX_FILES):
        other = folder / f"other{i:02d}.json"
        other.write_text("{}")
        os.utime(other, ns=(future, future))
    args = _args("Kestrel", "--workspace", str(ws))
    assert _record(args, env)
    names = {p.name for p in folder.iterdir()}
    assert len(names) == MAX_FILES and Path(settings_path(settings_key(args, env))).name in names
    assert _recorded(args, env) is not None


def test_a_config_saved_in_the_tick_its_key_was_taken_is_not_recorded(setup: tuple[Path, dict[str, str]]) -> None:
    ws, env = setup
    cfg_file = Path(env["OPENCLAW_STATE_DIR"]) / "openclaw.json"
    cfg_file.write_text(json.dumps({"memory": {"citations": "on"}}))
    args = _args("Kestrel", "--workspace", str(ws))
    key = settings_key(args, env)
    cfg = load_config(args.config, env=env)
    agent = resolve_agent(cfg, args.agent, workspace=args.workspace, env=env)
    changed_ms = cfg_file.stat().st_ctime_ns // 1_000_000
    # a same-size save right after the one the key saw would keep size, mtime and ctime
    assert not record_search_settings(args, cfg, agent, key=key, env=env, key_taken_ms=changed_ms)
    assert not Path(settings_path(key)).exists()
    assert record_search_settings(args, cfg, agent, key=key, env=env, key_taken_ms=changed_ms + 10_000)
    assert _recorded(args, env) is not None


def test_without_the_source_files_to_stamp_nothing_is_recorded_or_used(
        setup: tuple[Path, dict[str, str]], monkeypatch: pytest.MonkeyPatch) -> None:
    ws, env = setup
    args = _args("Kestrel", "--workspace", str(ws))
    # an install without the .py files (a zip, bytecode only) could not tell an upgrade
    monkeypatch.setattr(fast_search, "CODE_FILES", (*fast_search.CODE_FILES, "qmdbridge/gone.py"))
    assert not _record(args, env)
    assert not Path(settings_path(settings_key(args, env))).exists()
    path = Path(settings_path(settings_key(args, env)))
    monkeypatch.setattr(fast_search, "CODE_FILES", fast_search.CODE_FILES[:-1])
    assert _record(args, env)
    doc = json.loads(Path(settings_path(settings_key(args, env))).read_text())
    monkeypatch.setattr(fast_search, "CODE_FILES", (*fast_search.CODE_FILES, "qmdbridge/gone.py"))
    path.write_text(json.dumps({**doc, "key": settings_key(args, env)}))  # as if written so
    os.chmod(path, 0o600)
    assert _recorded(args, env) is None


def test_temporary_files_of_killed_writers_are_pruned(setup: tuple[Path, dict[str, str]]) -> None:
    ws, env = setup
    folder = Path(env["OPENCLAW_STATE_DIR"]) / CACHE_DIR_NAME
    folder.mkdir(mode=0o700)
    dead, live = folder / ".tmp-0123456789abcdef.part", folder / ".tmp-fedcba9876543210.part"
    dead.write_text('{"key": ')  # a writer killed mid-write, long ago
    os.utime(dead, ns=(1_600_000_000_000_000_000, 1_600_000_000_000_000_000))
    live.write_text('{"key": ')  # another writer's, being written now
    args = _args("Kestrel", "--workspace", str(ws))
    assert _record(args, env)
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        [live.name, Path(settings_path(settings_key(args, env))).name])
