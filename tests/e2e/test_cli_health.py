"""Memory that cannot be searched as configured is told by ``status`` and ``doctor``, as real
``qmdbridge`` processes: a default local model not downloaded yet, a sync that failed on a full
store, a relative ``local.modelPath``."""

from __future__ import annotations

import socket
from pathlib import Path

import orjson

from tests.e2e.cli_proc import run_cli

MODEL_URI = "hf:CompendiumLabs/bge-small-en-v1.5-gguf/bge-small-en-v1.5-q8_0.gguf"
PULL_HINT = ("run `qmdbridge models pull` where the model host is reachable (or set "
             "memorySearch.local.modelPath to a .gguf file you have)")


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _json(args: list[str], env: dict[str, str]) -> dict:
    p = run_cli([*args, "--json"], env)
    return orjson.loads(p.stdout)


def test_a_default_model_not_downloaded_is_one_provider_problem(ws: Path, env: dict[str, str],
                                                                tmp_path: Path) -> None:
    cfg = tmp_path / "cfg.json5"
    cfg.write_text("{agents: {defaults: {memorySearch: {provider: 'local'}}}}")
    env = {**env, "HF_ENDPOINT": f"http://127.0.0.1:{_closed_port()}"}  # offline
    args = ["--workspace", str(ws), "--config", str(cfg)]
    cached = Path(env["OPENCLAW_STATE_DIR"]) / "models" / "hf" / MODEL_URI.removeprefix("hf:")
    problem = {"check": "embedding provider",
               "message": f"local model {MODEL_URI} is not downloaded yet ({cached}): searches "
                          "answer from keyword search only until it is",
               "hint": PULL_HINT}
    before = _json(["status", *args], env)
    assert (before["searchMode"], before["healthy"], before["problems"]) == ("fts-only", False, [problem])
    assert run_cli(["index", *args], env).returncode == 0
    after = _json(["status", *args], env)
    assert (after["searchMode"], after["problems"]) == ("fts-only", [problem])  # once, not per source
    human = run_cli(["status", *args], env).stdout.decode()
    assert "Mode: fts-only (keyword-only)\n" in human
    assert f"Problems: 1\n  [embedding provider] {problem['message']}\n    fix: {PULL_HINT}\n" in human
    doctor = _json(["doctor", *args], env)
    assert [(c["name"], c["detail"]) for c in doctor["checks"] if c["level"] == "error"] == [
        ("embedding provider", problem["message"])]
