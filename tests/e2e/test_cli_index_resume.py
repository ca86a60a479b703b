"""An interrupted first index keeps its embeddings: a real ``qmdbridge index`` subprocess is
stopped with SIGINT while an embedding provider stand-in (OpenAI wire, 127.0.0.1) holds a
request; the rerun asks the provider only for the chunks that were not committed."""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.fallback.embeddings_fake_server import Recorded, Reply, serve

pytestmark = pytest.mark.slow  # stops a real qmdbridge index process with SIGINT

FILES = 12
HOLD_AT = 5  # the 5th embedding request is held until the test has interrupted the index
# Linux's tgkill system call number (a signal to one thread of a process), where it is known.
TGKILL = {"x86_64": 234, "aarch64": 131}.get(platform.machine()) if sys.platform == "linux" else None


def vector_of(text: str) -> list[float]:
    digest = hashlib.sha256(text.encode()).digest()
    return [b / 255 for b in digest[:8]]


def qmdbridge(args: list[str], env: dict[str, str]) -> list[str]:
    exe = shutil.which("qmdbridge")
    return [exe, *args] if exe else [sys.executable, "-m", "qmdbridge.cli.main", *args]


def interrupt_a_side_thread(pid: int) -> None:
    """SIGINT to one thread of ``pid`` other than its main one (tgkill), as the kernel may pick
    one: the main thread, blocked in the event loop's wait, is not woken by it."""
    tid = next(int(t) for t in sorted(os.listdir(f"/proc/{pid}/task")) if int(t) != pid)
    assert ctypes.CDLL(None, use_errno=True).syscall(TGKILL, pid, tid, signal.SIGINT) == 0


@pytest.mark.parametrize("interrupt", [
    pytest.param(lambda proc: proc.send_signal(signal.SIGINT), id="process"),
    pytest.param(lambda proc: interrupt_a_side_thread(proc.pid), id="side-thread", marks=pytest.mark.skipif(
        TGKILL is None, reason="tgkill is a Linux x86-64/arm64 system call")),
])
def test_sigint_keeps_committed_batches_and_the_rerun_embeds_only_the_rest(tmp_path: Path,
                                                                           interrupt: Callable[[Any], None]) -> None:
    ws = tmp_path / "ws"
    (ws / "memory").mkdir(parents=True)
    (ws / "MEMORY.md").write_text("# Memory\n\nThe home router is an Omada ER605.\n")
    for day in range(1, FILES):
        (ws / "memory" / f"2026-03-{day:02d}.md").write_text(f"# 2026-03-{day:02d}\n\nNote number {day} about topic {day * 7}.\n")
    held = threading.Event()
    release = threading.Event()
    asked: list[list[str]] = []

    def handler(req: Recorded) -> Reply:
        texts = req.json["input"]
        asked.append(texts)
        if len(asked) == HOLD_AT and not release.is_set():
            held.set()
            release.wait(600)  # past the wait for the exit below: only the interrupt ends it
        return Reply(200, {"data": [{"index": i, "embedding": vector_of(t)} for i, t in enumerate(texts)]})

    state = tmp_path / "state"
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "OPENAI_API_KEY")}
    env.update(OPENCLAW_STATE_DIR=str(state), HOME=str(tmp_path / "home"))
    with serve(handler, max_requests=100) as server:
        cfg = tmp_path / "openclaw.json5"
        cfg.write_bytes(orjson.dumps({"agents": {"defaults": {"memorySearch": {
            "provider": "openai-compatible", "model": "stand-in", "remote": {"baseUrl": server.url}}}}}))
        argv = qmdbridge(["index", "--workspace", str(ws), "--config", str(cfg)], env)
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert held.wait(60), "the index never reached the held request"
            assert proc.stderr is not None
            # Progress lines come once the index ran 1 s (on a loaded machine an earlier one may
            # show the discovery still running); read until the line of the held batch.
            want = f"indexing: {HOLD_AT - 1}/{FILES} files, {HOLD_AT - 1} chunks written, {HOLD_AT - 1} embedded, "
            first = proc.stderr.readline()
            while first and not first.startswith(want):
                assert first.startswith("indexing: "), first
                first = proc.stderr.readline()
            assert first.startswith(want), first
            assert ", ETA " in first
            interrupt(proc)
            assert proc.wait(timeout=60) == 130
        finally:
            release.set()
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        rest = proc.stderr.read()
        assert (f"indexing: interrupted at {HOLD_AT - 1}/{FILES} files; the vectors of {HOLD_AT - 1} embedded chunks "
                "are kept in the embedding cache, run the command again to resume") in rest
        assert "Traceback" not in rest
        committed = [t for batch in asked[:HOLD_AT - 1] for t in batch]
        db = state / "memory" / "main.sqlite"
        with sqlite3.connect(db) as conn:
            cached = conn.execute("SELECT COUNT(*) FROM embedding_cache").fetchone()[0]
            chunks = conn.execute("SELECT COUNT(*) FROM chunks").fetchone()[0]
        assert (cached, chunks) == (len(committed), 0)  # kept: the embeddings; not published: the index
        assert sorted(p.name for p in db.parent.iterdir() if ".tmp-" in p.name) == []
        before = len(asked)

        again = subprocess.run([*argv, "--json"], env=env, capture_output=True, text=True, timeout=120)
        assert again.returncode == 0, again.stderr
        rerun = [t for batch in asked[before:] for t in batch]
        everything = {t for batch in asked for t in batch}
        assert len(everything) == FILES
        assert sorted(rerun) == sorted(everything - set(committed))  # only the rest, held one included
        assert again.stderr == ""  # --json: no progress without --progress
        status = orjson.loads(again.stdout)["status"]
        assert (status["files"], status["chunks"], status["cache"]["entries"]) == (FILES, FILES, FILES)
        assert status["searchMode"] == "hybrid"
