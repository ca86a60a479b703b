"""``status`` and ``doctor`` of an agent whose qmd ``searchMode`` needs GGUF models that are not
on disk and cannot be downloaded (the model host unreachable), with the real qmd 2.8.3 (the
``qmdbridge`` command run in this process).

Every ``query`` or ``vsearch`` search then falls back to the builtin engine at once with that
reason. ``status`` said ``qmd: healthy``, ``Problems: none`` and ``doctor`` passed (their test
search is ``qmd search``, BM25, which needs no model), so an operator had no way to learn from
them that qmd never answered. Now both name it, with what to do.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import orjson
import pytest

from tests.e2e.cli_proc import run_cli_in_process

pytestmark = pytest.mark.qmd


def _run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[bytes]:
    """``qmdbridge <args>`` run in this process (qmd is a real child of it)."""
    return run_cli_in_process(args, env)


@pytest.mark.parametrize("mode", ["query", "vsearch"])
def test_status_and_doctor_name_missing_models_that_cannot_be_downloaded(
        tmp_path: Path, qmd_bin: Path, mode: str) -> None:
    ws = tmp_path / "ws"
    (ws / "memory").mkdir(parents=True)
    (ws / "memory" / "2026-03-01.md").write_text("# Day\n\nThe router dropped the WAN link.\n")
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env.update(OPENCLAW_STATE_DIR=str(tmp_path / "state"), HOME=str(tmp_path / "home"))
    env["HF_ENDPOINT"] = "http://127.0.0.1:9"  # the discard port: nothing listens, refused at once
    cfg = tmp_path / "openclaw.json"
    cfg.write_bytes(orjson.dumps({"memory": {"backend": "qmd", "qmd": {
        "command": str(qmd_bin), "searchMode": mode}}}))
    args = ["--workspace", str(ws), "--config", str(cfg)]
    found = _run(["search", "router dropped the WAN link", *args, "--json"], env)
    doc = orjson.loads(found.stdout)
    assert doc["backend"] == "builtin" and doc["fallback"]["reason"].startswith(
        f"qmd {mode} skipped: offline: cannot reach 127.0.0.1:9"), doc
    status = orjson.loads(_run(["status", *args, "--json"], env).stdout)
    models = [p for p in status["problems"] if p["check"] == "qmd models"]
    assert len(models) == 1, status["problems"]
    assert models[0]["message"].startswith(
        f"qmd {mode} searches cannot run: offline: cannot reach 127.0.0.1:9")
    assert models[0]["message"].endswith("; the builtin engine answers them")
    assert "qmdbridge warmup" in models[0]["hint"] and 'searchMode: "search"' in models[0]["hint"]
    doctor = _run(["doctor", *args], env)
    assert doctor.returncode == 1, doctor.stdout
    assert f"[error] qmd models: qmd {mode} searches cannot run: offline" in doctor.stdout.decode()
    env["HF_ENDPOINT"] = ""  # search mode needs no model: no such problem
    cfg.write_bytes(orjson.dumps({"memory": {"backend": "qmd", "qmd": {
        "command": str(qmd_bin), "searchMode": "search"}}}))
    status = orjson.loads(_run(["status", *args, "--json"], env).stdout)
    assert [p for p in status["problems"] if p["check"] == "qmd models"] == []


@pytest.mark.parametrize("cut", ["empty", "half"])
def test_an_empty_or_truncated_model_file_is_named_by_search_status_and_doctor(
        tmp_path: Path, qmd_bin: Path, cut: str, gguf_test_model: Path) -> None:
    """A model file cut short (an interrupted download), before its GGUF header or inside its
    tensor data, whose header is whole: qmd's searches timed out with no hint, and status showed
    nothing of qmd's model cache."""
    ws = tmp_path / "ws"
    (ws / "memory").mkdir(parents=True)
    (ws / "memory" / "2026-03-01.md").write_text("# Day\n\nThe router dropped the WAN link.\n")
    models = tmp_path / "state" / "agents" / "main" / "qmd" / "xdg-cache" / "qmd" / "models"
    models.mkdir(parents=True)
    data = gguf_test_model.read_bytes()
    (models / "embeddinggemma-300M-Q8_0.gguf").write_bytes(b"" if cut == "empty" else data[: len(data) // 2])
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env.update(OPENCLAW_STATE_DIR=str(tmp_path / "state"), HOME=str(tmp_path / "home"))
    cfg = tmp_path / "openclaw.json"
    cfg.write_bytes(orjson.dumps({"memory": {"backend": "qmd", "qmd": {
        "command": str(qmd_bin), "searchMode": "vsearch"}}}))
    args = ["--workspace", str(ws), "--config", str(cfg)]
    damaged = (f"model file(s) {models / 'embeddinggemma-300M-Q8_0.gguf'} empty, truncated or "
               "not GGUF; delete them and run `qmdbridge warmup` where huggingface.co is reachable")
    doc = orjson.loads(_run(["search", "router dropped the WAN link", *args, "--json"], env).stdout)
    assert doc["backend"] == "builtin" and doc["fallback"]["reason"] == f"qmd vsearch skipped: {damaged}"
    status = orjson.loads(_run(["status", *args, "--json"], env).stdout)
    [problem] = [p for p in status["problems"] if p["check"] == "qmd models"]
    assert problem["message"] == f"qmd vsearch searches cannot run: {damaged}; the builtin engine answers them"
    qmd = status["backends"]["qmd"]["custom"]["qmd"]
    assert qmd["models"] == {"dir": str(models), "present": [], "missing": [],
                             "damaged": ["embeddinggemma-300M-Q8_0.gguf"]}
    doctor = _run(["doctor", *args], env)
    assert doctor.returncode == 1 and f"[error] qmd models: qmd vsearch searches cannot run: {damaged}" \
        in doctor.stdout.decode(), doctor.stdout


def test_under_ci_the_models_problem_says_to_unset_ci(tmp_path: Path, qmd_bin: Path) -> None:
    """With ``CI`` set qmd refuses model work: the problem's message says to unset ``CI``, and
    its hint says the same (it said to run ``qmdbridge warmup``, which ``CI`` refuses too)."""
    ws = tmp_path / "ws"
    (ws / "memory").mkdir(parents=True)
    (ws / "memory" / "2026-03-01.md").write_text("# Day\n\nThe router dropped the WAN link.\n")
    env = {**os.environ, "CI": "true", "OPENCLAW_STATE_DIR": str(tmp_path / "state"),
           "HOME": str(tmp_path / "home")}
    cfg = tmp_path / "openclaw.json"
    cfg.write_bytes(orjson.dumps({"memory": {"backend": "qmd", "qmd": {
        "command": str(qmd_bin), "searchMode": "query"}}}))
    args = ["--workspace", str(ws), "--config", str(cfg)]
    status = orjson.loads(_run(["status", *args, "--json"], env).stdout)
    [problem] = [p for p in status["problems"] if p["check"] == "qmd models"]
    assert problem["message"] == (
        "qmd query searches cannot run: qmd refuses model operations while the CI environment "
        "variable is set; unset CI to embed or warm up the models; the builtin engine answers them")
    assert problem["hint"] == ('unset CI in the environment qmdbridge runs in, or set '
                               'memory.qmd.searchMode: "search" (BM25, no models)')


@pytest.mark.anyio
async def test_a_padded_hf_endpoint_names_the_hub_the_local_model_download_uses(tmp_path: Path) -> None:
    from fallback.embeddings.model_fetch import hub_base_url
    from qmdbridge.qmd.models import model_problem

    env = {"HF_ENDPOINT": " http://127.0.0.1:9 "}  # the discard port: nothing listens
    assert hub_base_url(env) == "http://127.0.0.1:9"
    problem = await model_problem(tmp_path / "models", env, kinds=("embed",))
    assert problem is not None and problem.startswith("offline: cannot reach 127.0.0.1:9 to download"), problem
