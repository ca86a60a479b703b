"""``qmdbridge models pull|list`` and a first search that downloads its model (the command run
in this process; as another user, a real process) against a stand-in hub on 127.0.0.1
(``HF_ENDPOINT``) serving the real GGUF test model."""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
import subprocess
import sys
import threading
from pathlib import Path

import orjson
import pytest

from fallback.embeddings.model_fetch import DEFAULT_MODEL
from tests.conftest import TEST_MODEL_NAME
from tests.e2e.cli_proc import run_cli_in_process
from tests.fallback.hub_server import HubFile, serve_hub

REPO = Path(__file__).resolve().parents[2]
URI = f"hf:test-org/all-MiniLM-L6-v2-GGUF/{TEST_MODEL_NAME}"


@pytest.fixture(scope="module")
def model_data(gguf_test_model: Path) -> bytes:
    return gguf_test_model.read_bytes()


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if k not in ("CI", "OPENAI_API_KEY", "HF_ENDPOINT")}
    e["OPENCLAW_STATE_DIR"] = str(tmp_path / "state")
    e["HOME"] = str(tmp_path / "home")
    return e


def _argv(args: list[str]) -> list[str]:
    exe = shutil.which("qmdbridge")
    return [exe, *args] if exe else [sys.executable, "-m", "qmdbridge.cli.main", *args]


def run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``qmdbridge <args>`` run in this process, its output decoded."""
    p = run_cli_in_process(args, env)
    return subprocess.CompletedProcess(p.args, p.returncode, p.stdout.decode(), p.stderr.decode())


def test_pull_then_list(tmp_path: Path, env: dict[str, str], model_data: bytes) -> None:
    sha = hashlib.sha256(model_data).hexdigest()
    cached = tmp_path / "state" / "models" / "hf" / "test-org" / "all-MiniLM-L6-v2-GGUF" / TEST_MODEL_NAME
    empty = run(["models", "list"], env)
    assert empty.stdout == (f"Model cache: {tmp_path / 'state' / 'models'}\nNo models cached. `qmdbridge models "
                            "pull` downloads the default, bge-small-en-v1.5 (36.8 MB).\n")
    with serve_hub({URI.removeprefix("hf:"): HubFile(model_data)}) as hub:
        e = {**env, "HF_ENDPOINT": hub.url}
        pulled = run(["models", "pull", URI, "--json"], e)
        assert pulled.returncode == 0, pulled.stderr
        assert pulled.stderr == ""
        assert orjson.loads(pulled.stdout) == {
            "ok": True, "model": URI, "path": str(cached), "sizeBytes": len(model_data), "sha256": sha,
            "downloaded": True, "resumedFrom": 0, "verifiedBy": "hub"}
        again = run(["models", "pull", URI], e)
        assert again.returncode == 0 and again.stderr == ""
        assert again.stdout == (f"cached {URI}\n  {cached} (25.3 MB, already cached)\n"
                                f'  to use it: set agents.defaults.memorySearch.provider to "local" and '
                                f"local.modelPath to {URI}\n")
    listed = orjson.loads(run(["models", "list", "--json"], env).stdout)
    assert listed == {"cacheDir": str(tmp_path / "state" / "models"), "default": DEFAULT_MODEL.ref.uri,
                      "models": [{"model": URI, "path": str(cached), "sizeBytes": len(model_data),
                                  "sha256": sha, "complete": True, "default": False}]}
    plain = run(["models", "list"], env).stdout
    assert f"{URI}\n  {cached} (25.3 MB, sha256 {sha[:12]})\n" in plain


def test_pull_progress_plain_lines_and_errors(tmp_path: Path, env: dict[str, str], model_data: bytes) -> None:
    with serve_hub({URI.removeprefix("hf:"): HubFile(model_data)}) as hub:
        p = run(["models", "pull", URI], {**env, "HF_ENDPOINT": hub.url})
    assert p.returncode == 0
    lines = p.stderr.splitlines()
    assert lines[0] == f"downloading {URI} (25.3 MB)" and lines[-1] == "  100% 25.3 MB of 25.3 MB"
    assert len(lines) == 11  # the start, then one line per 10 %
    assert p.stdout.startswith(f"downloaded {URI}\n")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    offline = run(["models", "pull", "--json"], {**env, "HF_ENDPOINT": f"http://127.0.0.1:{port}"})
    assert offline.returncode == 1
    doc = orjson.loads(offline.stdout)
    assert doc["errorType"] == "ModelDownloadError"
    assert doc["error"].startswith(f"local embedding provider unavailable: offline: cannot reach 127.0.0.1:{port} "
                                   f"to download {DEFAULT_MODEL.ref.uri} into {tmp_path / 'state' / 'models'}")
    unknown = run(["models", "pull", "minilm"], env)
    assert unknown.returncode == 2 and unknown.stderr.startswith("qmdbridge: unknown model 'minilm' (known: ")


@pytest.mark.slow
@pytest.mark.local_model
def test_first_search_with_provider_local_downloads_and_answers_hybrid(tmp_path: Path, env: dict[str, str],
                                                                      local_model_path: Path) -> None:
    ws = tmp_path / "ws"  # the two example notes of the rollout: the search embeds each chunk
    (ws / "memory").mkdir(parents=True)
    for note in ("memory/2026-11-05.md", "memory/2026-11-10.md"):
        shutil.copy(REPO / "examples" / "workspace" / note, ws / note)
    cfg = tmp_path / "local.json5"
    cfg.write_text(f"{{agents: {{defaults: {{memorySearch: {{provider: 'local', local: {{modelPath: '{URI}'}}}}}}}}}}")
    with serve_hub({URI.removeprefix("hf:"): HubFile(local_model_path.read_bytes())}) as hub:
        p = run(["search", "who wants the rollout plan", "--workspace", str(ws), "--config", str(cfg), "--json"],
                {**env, "HF_ENDPOINT": hub.url})
    assert p.returncode == 0, p.stderr
    assert p.stderr.splitlines()[0] == f"downloading {URI} (25.3 MB)"
    doc = orjson.loads(p.stdout)
    assert (doc["provider"], doc["model"], doc["mode"]) == ("local", URI, "hybrid")
    assert doc["results"][0]["vectorScore"] is not None


@pytest.mark.local_model
def test_doctor_says_the_default_model_is_not_downloaded_yet(tmp_path: Path, env: dict[str, str],
                                                              local_model_path: Path) -> None:
    ws = tmp_path / "ws"
    shutil.copytree(REPO / "examples" / "workspace", ws)
    cfg = tmp_path / "local.json5"
    cfg.write_text("{agents: {defaults: {memorySearch: {provider: 'local'}}}}")
    p = run(["doctor", "--workspace", str(ws), "--config", str(cfg), "--json"], {**env, "HF_ENDPOINT": "http://127.0.0.1:9"})
    check = next(c for c in orjson.loads(p.stdout)["checks"] if c["name"] == "embedding provider")
    cached = tmp_path / "state" / "models" / "hf" / DEFAULT_MODEL.ref.uri.removeprefix("hf:")
    assert check == {"name": "embedding provider", "level": "error", "fixed": False,
                     "detail": f"local model {DEFAULT_MODEL.ref.uri} is not downloaded yet ({cached}): "
                               "searches answer from keyword search only until it is",
                     "hint": "run `qmdbridge models pull` where the model host is reachable (or set "
                             "memorySearch.local.modelPath to a .gguf file you have)"}
    assert not (tmp_path / "state" / "models").exists()  # the doctor downloaded nothing


@pytest.mark.slow
def test_a_model_cache_this_user_cannot_write_is_named_with_its_cause(tmp_path: Path,
                                                                      env: dict[str, str]) -> None:
    """The download lock (``<file>.lock``) and the file go into the model cache: a cache folder
    this user may not write fails the pull with the folder and the cause, not a traceback.
    The hub is never asked (nothing listens on port 9)."""
    from tests.fallback.child_procs import unprivileged_prefix

    cache = tmp_path / "state" / "models"
    cache.mkdir(parents=True)
    cache.chmod(0o555)
    try:
        p = subprocess.run([*unprivileged_prefix(), *_argv(["models", "pull", "--json"])],
                           env={**env, "HF_ENDPOINT": "http://127.0.0.1:9"}, capture_output=True,
                           timeout=180, text=True)
    finally:
        cache.chmod(0o755)
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr
    doc = orjson.loads(p.stdout)
    assert (doc["errorType"], doc["error"]) == ("ModelDownloadError", (
        f"local embedding provider unavailable: cannot use the model cache {cache}: Permission denied "
        f"({cache / 'hf'}); let this user write it, or set local.modelCacheDir to a folder it can write"))


def test_a_hub_that_refuses_the_file_names_the_url_and_the_settings(env: dict[str, str]) -> None:
    """A gated or private repository answers 403 (not 404): the pull fails at once, naming the
    URL, the status and the settings that get the model another way; nothing is kept."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Gated(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            body = b'{"error": "Access to model test-org/all-MiniLM-L6-v2-GGUF is restricted."}'
            self.send_response(403)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    with ThreadingHTTPServer(("127.0.0.1", 0), Gated) as hub:
        threading.Thread(target=hub.serve_forever, daemon=True).start()
        try:
            p = run(["models", "pull", URI, "--json"], {**env, "HF_ENDPOINT": f"http://127.0.0.1:{hub.server_port}"})
        finally:
            hub.shutdown()
    url = f"http://127.0.0.1:{hub.server_port}/test-org/all-MiniLM-L6-v2-GGUF/resolve/main/{TEST_MODEL_NAME}"
    assert (p.returncode, orjson.loads(p.stdout)) == (1, {
        "error": f"local embedding provider unavailable: download of {url} failed with HTTP 403; download "
                 "the .gguf file and set local.modelPath to its path, or set HF_ENDPOINT",
        "errorType": "ModelDownloadError", "exitCode": 1})
    assert [f.name for f in Path(env["OPENCLAW_STATE_DIR"], "models").rglob("*") if f.is_file()] == [
        f"{TEST_MODEL_NAME}.lock"]  # the download lock only: no .part, no model
