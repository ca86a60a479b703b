"""Memory that cannot be searched as configured is told by ``status`` and ``doctor`` of the
``qmdbridge`` command: a default local model not downloaded yet, a sync that failed on a full
store, a relative ``local.modelPath``, a locked store. The commands run in this process, but for
a real process where its limits, working folder or lifetime are the subject."""

from __future__ import annotations

import re
import resource
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest

from tests.e2e.cli_proc import cli_argv, run_cli_in_process

REPO = Path(__file__).resolve().parents[2]
MODEL_URI = "hf:CompendiumLabs/bge-small-en-v1.5-gguf/bge-small-en-v1.5-q8_0.gguf"
PULL_HINT = ("run `qmdbridge models pull` where the model host is reachable (or set "
             "memorySearch.local.modelPath to a .gguf file you have)")


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[bytes]:
    """``qmdbridge <args>`` run to its end in this process (exit code and output bytes); the runs
    under a file-size limit, from another folder and ``serve`` start real processes."""
    return run_cli_in_process(args, env)


def _json(args: list[str], env: dict[str, str]) -> dict:
    p = run([*args, "--json"], env)
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
    assert run(["index", *args], env).returncode == 0
    after = _json(["status", *args], env)
    assert (after["searchMode"], after["problems"]) == ("fts-only", [problem])  # once, not per source
    human = run(["status", *args], env).stdout.decode()
    assert "Mode: fts-only (keyword-only)\n" in human
    assert f"Problems: 1\n  [embedding provider] {problem['message']}\n    fix: {PULL_HINT}\n" in human
    doctor = _json(["doctor", *args], env)
    assert [(c["name"], c["detail"]) for c in doctor["checks"] if c["level"] == "error"] == [
        ("embedding provider", problem["message"])]
    found = run(["search", "router", *args], env)  # keyword-only, saying why
    assert found.returncode == 0 and found.stdout
    err = [line for line in found.stderr.decode().splitlines() if not line.startswith("indexing: ")]
    assert len(err) == 1 and err[0].startswith("warning: offline: cannot reach 127.0.0.1:") and err[0].endswith(
        "; results come from keyword search only"), err  # no "no embedding provider" notice


def test_a_relative_model_path_is_read_against_the_config_folder(ws: Path, env: dict[str, str],
                                                                 tmp_path: Path,
                                                                 local_model_path: Path) -> None:
    conf = tmp_path / "conf"
    (conf / "models").mkdir(parents=True)
    (conf / "models" / "mini.gguf").symlink_to(local_model_path)
    cfg = conf / "openclaw.json5"
    cfg.write_text("{agents: {defaults: {memorySearch: {provider: 'local', "
                   "local: {modelPath: 'models/mini.gguf'}}}}}")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    args = ["status", "--workspace", str(ws), "--config", str(cfg), "--json"]
    env = {**env, "PYTHONPATH": str(REPO)}  # this checkout, from any current folder
    for cwd in (conf, elsewhere):  # the same config works from any folder
        p = subprocess.run(cli_argv(args), env=env, capture_output=True, timeout=120, cwd=cwd)
        doc = orjson.loads(p.stdout)
        assert (doc["provider"], doc["model"], doc["searchMode"], doc["problems"]) == (
            "local", str(local_model_path.resolve()), "hybrid", [])  # the link's target
    cfg.write_text("{agents: {defaults: {memorySearch: {provider: 'local', "
                   "local: {modelPath: 'models/gone.gguf'}}}}}")
    p = subprocess.run(cli_argv(args), env=env, capture_output=True, timeout=120, cwd=elsewhere)
    assert orjson.loads(p.stdout)["providerUnavailableReason"] == (
        f"memory search unavailable: local: local model file not found: {conf / 'models' / 'gone.gguf'}")


def _limit_file_size(max_bytes: int) -> Callable[[], None]:
    def apply() -> None:  # in the child: writes past max_bytes fail (Python ignores SIGXFSZ)
        resource.setrlimit(resource.RLIMIT_FSIZE, (max_bytes, max_bytes))
    return apply


def test_a_sync_that_could_not_write_is_told_with_the_files_that_wait(ws: Path, env: dict[str, str]) -> None:
    args = ["--workspace", str(ws)]
    assert run(["index", *args], env).returncode == 0
    for day in range(1, 41):
        (ws / "memory" / f"2026-10-{day:02d}.md").write_text(
            f"# Note {day}\n" + "".join(f"Heron count line {n} for note {day}.\n" for n in range(300)))
    failed = subprocess.run(cli_argv(["index", *args]), env=env, capture_output=True, timeout=120,
                            preexec_fn=_limit_file_size(64 * 1024))  # the disk is "full"
    assert failed.returncode == 1
    # a sync past 1 s (a loaded machine) shows progress lines first
    err = [line for line in failed.stderr.decode().splitlines() if not line.startswith("indexing: ")]
    error = "\n".join(err).strip().removeprefix("qmdbridge: ")
    assert error.startswith("index store ")
    status = _json(["status", *args], env)
    assert (status["dirty"], status["dirtyReason"], status["healthy"]) == (
        True, "40 files wait to be indexed", False)
    assert status["custom"]["filesWaiting"] == 40
    problem = {"check": "index",
               "message": f"last sync (cli) failed: {error}; memory files waiting to be indexed: 40",
               "hint": "run `qmdbridge index -v` to see the failure"}
    assert status["problems"] == [problem]
    doctor = run(["doctor", *args, "--json"], env)
    assert doctor.returncode == 1
    assert [(c["name"], c["detail"]) for c in orjson.loads(doctor.stdout)["checks"]
            if c["level"] == "error"] == [("index", problem["message"])]
    assert run(["index", *args], env).returncode == 0  # space again: all is indexed
    after = _json(["status", *args], env)
    assert (after["dirty"], after["healthy"], after["problems"], after["custom"]["syncFailure"]) == (
        False, True, [], None)


# A second process holding the store locked until its stdin closes: SQLite's write lock, or
# the writer lock of qmdbridge's syncs.
_HOLD_LOCK = {
    "sqlite": "import sqlite3, sys; c = sqlite3.connect(sys.argv[1], isolation_level=None); "
              "c.execute('BEGIN EXCLUSIVE'); print('held', flush=True); sys.stdin.read()",
    "writer": "import sys; from pathlib import Path; from fallback.store.lock import StoreWriteLock; "
              "lock = StoreWriteLock(Path(sys.argv[1])); lock.acquire_blocking(); print('held', flush=True); "
              "sys.stdin.read()"}


@pytest.mark.parametrize("lock", ["sqlite", "writer"])
def test_a_search_on_a_locked_store_answers_within_its_budget_and_status_tells_the_failure(
        ws: Path, env: dict[str, str], lock: str) -> None:
    args = ["--workspace", str(ws)]
    assert run(["index", *args], env).returncode == 0
    with (ws / "MEMORY.md").open("a") as f:
        f.write("\nThe quokka sanctuary opens in May.\n")
    db = Path(env["OPENCLAW_STATE_DIR"]) / "memory" / "main.sqlite"
    holder = subprocess.Popen([sys.executable, "-c", _HOLD_LOCK[lock], str(db)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"held\n"
        found = run(["search", "quokka", *args, "--json"], env)
        status = _json(["status", *args], env)
        indexed = run(["index", *args], env) if lock == "sqlite" else None
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=60)
    assert found.returncode == 0, found.stderr
    error = (f"index store is locked by another process past the busy timeout: database is locked ({db})"
             if lock == "sqlite" else
             rf"another process \(pid {holder.pid}\) is writing the index; waiting for the writer lock "
             rf"main\.sqlite\.lock timed out after (?P<ms>\d+) ms \({re.escape(str(db))}\)")
    if lock == "sqlite":
        error = re.escape(error)
    answer = orjson.loads(found.stdout)
    assert answer["results"] == [] and len(answer["warnings"]) == 1, answer
    told = re.fullmatch(f"sync \\(search\\) failed: {error}", answer["warnings"][0])
    assert told is not None
    if lock == "writer":  # the wait was what was left of the 2 s sync budget, not the lock's own
        assert int(told["ms"]) <= 2000
    assert (status["dirty"], status["dirtyReason"], status["healthy"]) == (
        True, "1 file waits to be indexed", False)
    [problem] = status["problems"]
    hint = ("another process is writing the index (a `qmdbridge index` or `serve` of this agent, or a "
            "program holding the file in a transaction): run `qmdbridge index` again once it is done"
            if lock == "sqlite" else "run `qmdbridge index -v` to see the failure")
    assert (problem["check"], problem["hint"]) == ("index", hint)
    if indexed is not None:  # the failed command says what to do, as status does
        locked = f"index store is locked by another process past the busy timeout: database is locked ({db})"
        assert indexed.returncode == 1 and indexed.stderr.decode().endswith(
            f"qmdbridge: {locked}\n  fix: {hint}\n"), indexed.stderr
    assert re.fullmatch(f"last sync \\(search\\) failed: {error}; memory files waiting to be indexed: 1",
                        problem["message"])
    assert run(["index", *args], env).returncode == 0  # the lock released: all is indexed
    after = _json(["status", *args], env)
    assert (after["dirty"], after["problems"]) == (False, [])


def test_serve_answers_keyword_only_while_the_provider_hangs_and_status_says_why(
        ws: Path, env: dict[str, str], tmp_path: Path) -> None:
    from tests.fallback.embeddings_fake_server import Recorded, Reply, serve

    def silent(req: Recorded) -> Reply:
        return Reply(200, {"data": []}, delay_s=600)

    with serve(silent, max_requests=1000) as srv:
        cfg = tmp_path / "openclaw.json5"  # query.keywordFallback left at its default
        cfg.write_text("{agents: {defaults: {memorySearch: {provider: 'openai-compatible', model: "
                       f"'mini-embed', remote: {{baseUrl: '{srv.url}'}}, sync: "
                       "{embeddingBatchTimeoutSeconds: 1}, query: {timeoutMs: 1500}}}}}")
        lines = [b'{"id": 1, "tool": "memory_search", "params": {"query": "Atlas rollback"}}',
                 b'{"id": 2, "tool": "status"}']
        p = subprocess.run(cli_argv(["serve", "--workspace", str(ws), "--config", str(cfg)]),
                           env=env, capture_output=True, timeout=120, input=b"\n".join(lines) + b"\n")
    assert p.returncode == 0, p.stderr
    replies = {r["id"]: r["result"] for r in map(orjson.loads, p.stdout.splitlines())}
    hang = ("query embedding failed: openai-compatible embedding failed: query embedding timed out "
            "after 1500 ms (query.timeoutMs)")
    assert replies[1]["results"] and replies[1]["results"][0]["path"].startswith("memory/2026-11-")
    assert replies[1]["warnings"][0] == f"{hang}; results come from keyword search only"
    status = replies[2]  # the boot sync's failure once it ended, else the search's
    assert status["healthy"] is False
    assert status["vector"]["providerError"] in (
        "openai-compatible embedding failed: memory embeddings batch timed out after 1s", hang)
