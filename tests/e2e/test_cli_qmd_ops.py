"""``qmdbridge qmd collections`` and ``qmdbridge warmup`` with the real qmd 2.8.3 (the command run
in this process): the listing people read, and a warm-up whose model download fails, against a
stand-in hub on 127.0.0.1 (``HF_ENDPOINT``) that holds no model."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import orjson
import pytest

from qmdbridge.paths import child_env, qmd_home
from tests.e2e.cli_proc import run_cli_in_process
from tests.fallback.hub_server import serve_hub

pytestmark = pytest.mark.qmd

EMBED_MODEL = "hf:ggml-org/embeddinggemma-300M-GGUF/embeddinggemma-300M-Q8_0.gguf"


@pytest.fixture
def setup(tmp_path: Path, qmd_bin: Path, env: dict[str, str]) -> dict[str, Any]:
    ws = tmp_path / "ws"
    (ws / "memory").mkdir(parents=True)
    (ws / "MEMORY.md").write_text("# Notes\n\nThe router is a Mikrotik.\n")
    (ws / "memory" / "2026-03-01.md").write_text("# Day\n\nThe heron nests by the weir.\n")
    state = Path(env["OPENCLAW_STATE_DIR"])
    state.mkdir()
    (state / "openclaw.json").write_text(json.dumps({
        "memory": {"backend": "qmd", "qmd": {"command": str(qmd_bin)}},
        "agents": {"defaults": {"memorySearch": {"provider": "none"}}}}))
    return {"ws": ws, "env": {**env, "QMDBRIDGE_DAEMON": "off"}}


def test_qmd_collections_lists_name_folder_and_pattern(setup: dict[str, Any]) -> None:
    ws = setup["ws"]
    p = run_cli_in_process(["qmd", "collections", "--workspace", str(ws)], setup["env"])
    assert (p.returncode, p.stdout.decode()) == (0, f"memory-root-main\t{ws}\tMEMORY.md\n"
                                                    f"memory-dir-main\t{ws / 'memory'}\t**/*.md\n")


@pytest.mark.parametrize("action", ["collections", "update", "embed"])
def test_qmd_operations_refuse_a_workspace_that_is_no_folder(setup: dict[str, Any], action: str) -> None:
    """A mistyped workspace is refused as every command refuses it, and not created: the qmd
    start-up made the folder (and ``memory/``) and registered collections for it."""
    typo = setup["ws"].parent / "wsx"
    p = run_cli_in_process(["qmd", action, "--workspace", str(typo)], setup["env"])
    assert (p.returncode, p.stderr.decode().splitlines()[-1], typo.exists()) == (
        2, f"qmdbridge: workspace does not exist: {typo} (create it, pass --workspace or set "
           "agents.defaults.workspace)", False)


def test_warmup_names_the_failed_model_download(setup: dict[str, Any]) -> None:
    """The mirror answers 404 for the embedding model: ``warmup`` stops after the embed step,
    exit 1, naming the URL and the HTTP status (it said ``loading failed``, which sends a
    person looking at the model file rather than at the mirror)."""
    ws = setup["ws"]
    with serve_hub({}) as hub:
        env = {**setup["env"], "HF_ENDPOINT": hub.url}
        url = (f"{hub.url}/ggml-org/embeddinggemma-300M-GGUF/resolve/main/"
               "embeddinggemma-300M-Q8_0.gguf?download=true")
        hint = (f"qmd embed: the download of {url} failed with HTTP 404; it needs the model(s) "
                f"{EMBED_MODEL} (downloaded from huggingface.co into the agent's xdg-cache/qmd/models "
                "on first use; or point QMD_EMBED_MODEL / QMD_RERANK_MODEL / QMD_GENERATE_MODEL at "
                "local .gguf files)")
        js = run_cli_in_process(["warmup", "--workspace", str(ws), "--json"], env)
        doc = orjson.loads(js.stdout)
        assert js.returncode == 1
        [step] = doc["steps"]
        assert (doc["ok"], step["step"], step["ok"], step["error"]) == (False, "embed", False, hint)
        assert isinstance(step["durationMs"], int) and step["durationMs"] >= 0
        plain = run_cli_in_process(["warmup", "--workspace", str(ws)], env)
    lines = plain.stderr.decode().splitlines()
    assert (plain.returncode, plain.stdout) == (1, b"")
    assert lines[0] == "[1/2] qmd embed (first run downloads models; this can take minutes)..."
    assert re.fullmatch(r"    failed in \d+ ms: (.*)", lines[1]) is not None
    assert lines[1].endswith(": " + hint) and len(lines) == 2


def test_a_search_before_any_collection_holds_a_note_answers_empty_from_qmd(setup: dict[str, Any]) -> None:
    ws = setup["ws"]
    (ws / "MEMORY.md").unlink()
    (ws / "memory" / "2026-03-01.md").unlink()
    args = ["search", "heron weir", "--workspace", str(ws), "--json"]
    empty = run_cli_in_process(args, setup["env"])
    doc = orjson.loads(empty.stdout)
    assert (empty.returncode, doc["backend"], doc["fallback"], doc["results"], doc["warnings"]) == (
        0, "qmd", None, [], [])
    (ws / "memory" / "2026-03-02.md").write_text("# Day\n\nThe heron nests by the weir.\n")
    found = orjson.loads(run_cli_in_process(args, setup["env"]).stdout)
    assert (found["backend"], [(h["path"], h["startLine"], h["endLine"]) for h in found["results"]]) == (
        "qmd", [("memory/2026-03-02.md", 1, 3)])


def test_a_collection_the_user_added_for_the_memory_folder_is_rebound(setup: dict[str, Any], qmd_bin: Path) -> None:
    """qmd refuses our add of a folder and pattern another collection holds: that one is
    removed and ours added, so the memory folder is searched under the managed name."""
    ws, env = setup["ws"], setup["env"]
    home = qmd_home(Path(env["OPENCLAW_STATE_DIR"]), "main")
    home.config_dir.mkdir(parents=True)
    home.xdg_cache.mkdir(parents=True)
    qmd_env = child_env(home, parent_env=env, path_env=os.environ["PATH"])
    added = subprocess.run([str(qmd_bin), "collection", "add", "--name", "old-notes", "--mask", "**/*.md",
                            "--index", "index", "--", str(ws / "memory")], env=qmd_env, capture_output=True,
                           timeout=120, stdin=subprocess.DEVNULL)
    assert added.returncode == 0, added.stderr
    found = orjson.loads(run_cli_in_process(["search", "heron weir", "--workspace", str(ws), "--json"], env).stdout)
    assert (found["backend"], found["warnings"], [h["path"] for h in found["results"]]) == (
        "qmd", [], ["memory/2026-03-01.md"])
    p = run_cli_in_process(["qmd", "collections", "--workspace", str(ws)], env)
    assert p.stdout.decode() == (f"memory-root-main\t{ws}\tMEMORY.md\n"
                                 f"memory-dir-main\t{ws / 'memory'}\t**/*.md\n")
