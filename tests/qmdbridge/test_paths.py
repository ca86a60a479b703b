"""Tests for qmdbridge.paths: the per-agent qmd home, model link, child env, `--index` pinning."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from fallback.errors import UsageError
from qmdbridge.paths import QmdHome, child_env, ensure_home, qmd_home, user_models_dir
from qmdbridge.qmd.runner import run_command


def test_home_layout(tmp_path: Path) -> None:
    home = qmd_home(tmp_path / "state", "main")
    q = tmp_path / "state" / "agents" / "main" / "qmd"
    assert home == QmdHome(
        qmd_dir=q, xdg_config=q / "xdg-config", xdg_cache=q / "xdg-cache",
        config_dir=q / "xdg-config" / "qmd", index_yml=q / "xdg-config" / "qmd" / "index.yml",
        index_db=q / "xdg-cache" / "qmd" / "index.sqlite",
        models_dir=q / "xdg-cache" / "qmd" / "models", sessions_dir=q / "sessions",
        write_lock=tmp_path / "state" / "agents" / "main" / "qmd-write.lock",
        embed_lock=tmp_path / "state" / "qmd" / "embed.lock", breaker=q / "breaker.json",
        startup_breaker=q / "startup-breaker.json", reconciled=q / "reconciled.json",
        probe_cache=tmp_path / "state" / "qmd" / "probe-cache.json")
    assert not q.exists()


@pytest.mark.parametrize("agent_id", ["", ".", "..", "a/b", "a\\b", "a\x00b"])
def test_bad_agent_id(tmp_path: Path, agent_id: str) -> None:
    with pytest.raises(UsageError, match="invalid agent id for a qmd home"):
        qmd_home(tmp_path, agent_id)


def test_ensure_home_creates_folders_and_links_xdg_models(tmp_path: Path) -> None:
    models = tmp_path / "user-cache" / "qmd" / "models"
    models.mkdir(parents=True)
    home = qmd_home(tmp_path / "state", "ops")
    parent = {"XDG_CACHE_HOME": str(tmp_path / "user-cache"), "HOME": str(tmp_path / "nohome")}
    assert ensure_home(home, parent_env=parent) == []
    for folder in (home.config_dir, home.xdg_cache / "qmd", home.sessions_dir,
                   home.write_lock.parent, home.embed_lock.parent):
        assert folder.is_dir()
    assert home.models_dir.is_symlink()
    assert os.readlink(home.models_dir) == str(models)
    assert ensure_home(home, parent_env=parent) == []  # idempotent
    assert os.readlink(home.models_dir) == str(models)


def test_models_link_from_home_cache(tmp_path: Path) -> None:
    models = tmp_path / "u" / ".cache" / "qmd" / "models"
    models.mkdir(parents=True)
    home = qmd_home(tmp_path / "state", "main")
    assert ensure_home(home, parent_env={"HOME": str(tmp_path / "u")}) == []
    assert os.readlink(home.models_dir) == str(models)
    assert user_models_dir({"HOME": str(tmp_path / "u")}) == models
    assert user_models_dir({}) is None


def test_existing_models_dir_is_never_replaced(tmp_path: Path) -> None:
    (tmp_path / "u" / ".cache" / "qmd" / "models").mkdir(parents=True)
    home = qmd_home(tmp_path / "state", "main")
    home.models_dir.mkdir(parents=True)
    (home.models_dir / "embed.gguf").write_text("x")
    assert ensure_home(home, parent_env={"HOME": str(tmp_path / "u")}) == []
    assert not home.models_dir.is_symlink()
    assert (home.models_dir / "embed.gguf").read_text() == "x"


def test_broken_models_symlink_is_left_alone(tmp_path: Path) -> None:
    (tmp_path / "u" / ".cache" / "qmd" / "models").mkdir(parents=True)
    home = qmd_home(tmp_path / "state", "main")
    home.models_dir.parent.mkdir(parents=True)
    home.models_dir.symlink_to(tmp_path / "gone")
    assert ensure_home(home, parent_env={"HOME": str(tmp_path / "u")}) == []
    assert os.readlink(home.models_dir) == str(tmp_path / "gone")


def test_missing_model_cache_is_silent(tmp_path: Path) -> None:
    home = qmd_home(tmp_path / "state", "main")
    assert ensure_home(home, parent_env={"HOME": str(tmp_path / "nobody")}) == []
    assert not os.path.lexists(home.models_dir)


def test_failures_are_returned_as_warnings(tmp_path: Path) -> None:
    (tmp_path / "u" / ".cache" / "qmd" / "models").mkdir(parents=True)
    home = qmd_home(tmp_path / "state", "main")
    home.xdg_cache.mkdir(parents=True)
    (home.xdg_cache / "qmd").write_text("a file where a folder belongs")
    warnings = ensure_home(home, parent_env={"HOME": str(tmp_path / "u")})
    assert warnings == [
        f"failed to create qmd folder {home.xdg_cache / 'qmd'}: [Errno 17] File exists: "
        f"'{home.xdg_cache / 'qmd'}'",
        f"failed to symlink qmd models directory: [Errno 20] Not a directory: "
        f"'{tmp_path / 'u' / '.cache' / 'qmd' / 'models'}' -> '{home.models_dir}'",
    ]


def test_child_env(tmp_path: Path) -> None:
    home = qmd_home(tmp_path / "state", "main")
    parent = {"HOME": "/home/a", "INDEX_PATH": "/elsewhere.sqlite", "XDG_CACHE_HOME": "/c",
              "QMD_CONFIG_DIR": "/cfg", "CI": "1", "PATH": "/parent/bin"}
    env = child_env(home, parent_env=parent, path_env="/usr/bin:/opt/qmd/bin")
    assert env == {
        "HOME": "/home/a", "CI": "1",
        "XDG_CONFIG_HOME": str(home.xdg_config), "QMD_CONFIG_DIR": str(home.config_dir),
        "XDG_CACHE_HOME": str(home.xdg_cache), "NO_COLOR": "1", "PATH": "/usr/bin:/opt/qmd/bin",
    }
    assert parent["INDEX_PATH"] == "/elsewhere.sqlite"  # the parent mapping is not modified


@pytest.mark.anyio
async def test_index_flag_defeats_project_qmd_folder(tmp_path: Path, qmd_bin: Path,
                                                     agent_home: QmdHome,
                                                     qmd_env: dict[str, str]) -> None:
    project = tmp_path / "proj"
    workspace = project / "ws"
    (workspace / "memory").mkdir(parents=True)
    (workspace / "memory" / "2026-01-01.md").write_text("# Notes\nalpha beta\n")
    other = tmp_path / "other"
    other.mkdir()
    (project / ".qmd").mkdir()
    (project / ".qmd" / "index.yml").write_text(
        f'collections:\n  hijack:\n    path: {other}\n    pattern: "**/*.md"\n')
    qmd = str(qmd_bin)

    async def run(*args: str) -> str:
        result = await run_command([qmd, *args], env=qmd_env, cwd=workspace, timeout_ms=60_000)
        return result.check().stdout

    await run("collection", "add", str(workspace / "memory"), "--name", "memory-dir-main",
              "--mask", "**/*.md", "--index", "index")
    pinned = await run("collection", "list", "--index", "index")
    assert "memory-dir-main (qmd://memory-dir-main/)" in pinned
    assert "hijack" not in pinned
    assert agent_home.index_db.is_file()
    assert "memory-dir-main:" in agent_home.index_yml.read_text()
    assert not (project / ".qmd" / "index.sqlite").exists()
    # Without --index the project's .qmd/ folder takes over (the hazard the flag prevents).
    hijacked = await run("collection", "list")
    assert "hijack (qmd://hijack/)" in hijacked
    assert "memory-dir-main" not in hijacked
    hits = json.loads(await run("search", "--json", "-n", "6", "-c", "memory-dir-main",
                                "--index", "index", "--", "alpha"))
    assert [h["file"] for h in hits] == ["qmd://memory-dir-main/2026-01-01.md"]
