"""``qmdbridge serve`` keeps qmd warm: a real serve process in ``query`` mode starts its
``qmd mcp`` child, answers a search through it (``status`` says so), and leaves no qmd process
behind on SIGTERM; after ``kill -9`` of serve the kernel kills the child (``PR_SET_PDEATHSIG``);
it answers requests while the warm child's modules (the ``mcp`` SDK) are still being imported."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "qmdbridge"))
from qmd_query_ws import make_workspace, model_free_env  # noqa: E402
from server_procs import DEADLINE_S, cli_env, start, stop  # noqa: E402

pytestmark = pytest.mark.qmd


# ``qmdbridge serve`` whose import of the ``mcp`` SDK waits, before the package runs, until the
# test writes a byte to the inherited fd ``$HOLD_FD`` (or DEADLINE_S passes); stderr says when it
# waits and what ended it. It waits in the loader, as a slow import does: a finder runs under
# the interpreter's global import lock, which would hold every thread's imports.
HOLD_MCP = f"""
import importlib.machinery, os, select, sys
class HeldLoader:
    def __init__(self, real):
        self.real = real
    def create_module(self, spec):
        return self.real.create_module(spec)
    def exec_module(self, module):
        sys.stderr.write("HOLD mcp import waits\\n")
        sys.stderr.flush()
        released, _, _ = select.select([int(os.environ["HOLD_FD"])], [], [], {DEADLINE_S})
        sys.stderr.write("HOLD released by " + ("the test" if released else "its deadline") + "\\n")
        sys.stderr.flush()
        self.real.exec_module(module)
class HoldMcp:
    def find_spec(self, name, path=None, target=None):
        if name != "mcp":
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        spec.loader = HeldLoader(spec.loader)
        return spec
sys.meta_path.insert(0, HoldMcp())
from qmdbridge.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


def _serve(tmp_path: Path, qmd_bin: Path) -> subprocess.Popen[bytes]:
    ws = make_workspace(tmp_path)
    cfg = tmp_path / "qmd.json"
    cfg.write_text(json.dumps({"memory": {"backend": "qmd", "qmd": {
        "command": str(qmd_bin), "searchMode": "query", "rerank": False, "limits": {"timeoutMs": 20000},
        "update": {"waitForBootSync": True, "interval": "0", "embedInterval": "0"}}},
        "agents": {"defaults": {"memorySearch": {"provider": "none"}}}}))
    env = model_free_env(tmp_path, cli_env(tmp_path / "state", tmp_path / "home"))
    proc, _ = start(["serve", "--no-socket", "--workspace", str(ws), "--config", str(cfg)], env,
                    ready="qmdbridge serve: agent main", stdin=subprocess.PIPE)
    return proc


def _call(proc: subprocess.Popen[bytes], request: dict[str, Any]) -> Any:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(json.dumps(request).encode() + b"\n")
    proc.stdin.flush()
    return json.loads(proc.stdout.readline())["result"]


def _warm_ready(proc: subprocess.Popen[bytes]) -> dict[str, Any]:
    """The warm child's status once it is ready (each ``status`` call is a real round trip)."""
    for _ in range(DEADLINE_S * 10):
        warm = _call(proc, {"id": 1, "tool": "status"})["custom"]["qmd"]["warm"]
        if warm["state"] == "ready":
            return warm
    raise AssertionError(f"the warm qmd child never became ready: {warm}")


def test_serve_answers_through_the_warm_child_and_sigterm_leaves_no_qmd(tmp_path: Path,
                                                                        qmd_bin: Path) -> None:
    proc = _serve(tmp_path, qmd_bin)
    try:
        warm = _warm_ready(proc)
        found = _call(proc, {"id": 2, "tool": "memory_search", "params": {"query": "spice zanzibar"}})
        assert (found["backend"], found["fallback"]) == ("qmd", None)
        assert [(h["path"], h["startLine"]) for h in found["results"]] == [
            ("MEMORY.md", 1), ("memory/2026-03-01.md", 2)]
        after = _call(proc, {"id": 3, "tool": "status"})["custom"]["qmd"]["warm"]
        assert (after["pid"], after["answered"], after["spawnFallbacks"]) == (warm["pid"], 2, 0)
        child = psutil.Process(warm["pid"])
        assert "mcp" in child.cmdline() and "--http" not in child.cmdline()  # the stdio transport
        tree = psutil.Process(proc.pid).children(recursive=True)
        assert child in tree
    finally:
        code = stop(proc, signal.SIGTERM)
    assert code == 0
    alive = [p for p in tree if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert alive == []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux only")
def test_kill_9_of_serve_takes_the_warm_child_with_it(tmp_path: Path, qmd_bin: Path) -> None:
    proc = _serve(tmp_path, qmd_bin)
    try:
        child = psutil.Process(_warm_ready(proc)["pid"])
    finally:
        stop(proc, signal.SIGKILL)
    gone, alive = psutil.wait_procs([child], timeout=DEADLINE_S)
    assert (gone, alive) == ([child], [])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux only")
def test_kill_9_of_serve_takes_a_running_qmd_update_with_it(tmp_path: Path, qmd_bin: Path) -> None:
    """A ``qmd update`` (or ``embed``, or a ``collection add`` indexing a large folder) runs for
    minutes on a large corpus. ``kill -9`` of serve left it running as an orphan, writing the
    index beside the next serve's own update (and an orphaned ``qmd embed`` kept a CPU busy for
    as long as it took). The update is stood in for by a wrapper that execs a long sleep in its
    place (same pid, as qmd's launcher execs Node or Bun)."""
    pid_file = tmp_path / "update.pid"
    wrapper = tmp_path / "qmd"
    wrapper.write_text("#!/bin/sh\n"
                       f'if [ "$1" = update ]; then echo $$ > "{pid_file}"; exec sleep 300; fi\n'
                       f'exec "{qmd_bin}" "$@"\n')
    wrapper.chmod(0o755)
    ws = make_workspace(tmp_path)
    cfg = tmp_path / "qmd.json"
    cfg.write_text(json.dumps({"memory": {"backend": "qmd", "qmd": {
        "command": str(wrapper), "searchMode": "search", "mcp": {"enabled": False},
        "update": {"interval": "0", "updateTimeoutMs": 600000}}},
        "agents": {"defaults": {"memorySearch": {"provider": "none"}}}}))
    env = cli_env(tmp_path / "state", tmp_path / "home")
    proc, _ = start(["serve", "--no-socket", "--no-stdin", "--workspace", str(ws), "--config", str(cfg)],
                    env, ready="qmdbridge serve: agent main")
    update: psutil.Process | None = None
    try:
        for _ in range(DEADLINE_S * 20):  # the boot update runs in the background
            if pid_file.is_file() and pid_file.read_text().strip():
                update = psutil.Process(int(pid_file.read_text()))
                break
            psutil.wait_procs([psutil.Process(proc.pid)], timeout=0.05)
        assert update is not None, "the boot update never started"
        stop(proc, signal.SIGKILL)
        gone, alive = psutil.wait_procs([update], timeout=DEADLINE_S)
        assert (gone, alive) == ([update], [])
    finally:
        stop(proc, signal.SIGKILL)
        if update is not None and update.is_running():
            update.kill()


def _stderr_until(proc: subprocess.Popen[bytes], prefix: str) -> str:
    """The first line of serve's stderr that starts with ``prefix`` (the lines before it are skipped)."""
    assert proc.stderr is not None
    while line := proc.stderr.readline().decode():
        if line.startswith(prefix):
            return line.rstrip("\n")
    raise AssertionError(f"serve exited {proc.wait(timeout=DEADLINE_S)} before a line {prefix!r}")


def test_serve_answers_while_the_warm_child_modules_are_imported(tmp_path: Path, qmd_bin: Path) -> None:
    """The warm child's modules pull in the ``mcp`` SDK, which took seconds to import on a loaded
    machine; imported on the event loop after the boot update, it froze every search, read and
    watcher event meanwhile. Held here until the test has its answer: the search is answered by
    the builtin engine while qmd is still starting, and the warm child starts once released."""
    ws = make_workspace(tmp_path)
    cfg = tmp_path / "qmd.json"
    cfg.write_text(json.dumps({"memory": {"backend": "qmd", "qmd": {
        "command": str(qmd_bin), "searchMode": "query", "rerank": False, "limits": {"timeoutMs": 20000},
        "update": {"interval": "0", "embedInterval": "0"}}},
        "agents": {"defaults": {"memorySearch": {"provider": "none"}}}}))
    hold_r, hold_w = os.pipe()
    env = {**model_free_env(tmp_path, cli_env(tmp_path / "state", tmp_path / "home")), "HOLD_FD": str(hold_r)}
    proc = subprocess.Popen([sys.executable, "-c", HOLD_MCP, "serve", "--no-socket", "--workspace", str(ws),
                             "--config", str(cfg)], env=env, pass_fds=(hold_r,), stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    os.close(hold_r)
    try:
        assert _stderr_until(proc, "HOLD ") == "HOLD mcp import waits"
        found = _call(proc, {"id": 1, "tool": "memory_search", "params": {"query": "zanzibar ferry"}})
        os.write(hold_w, b"x")
        assert _stderr_until(proc, "HOLD ") == "HOLD released by the test"
        assert (found["backend"], found["fallback"]["reason"]) == (
            "builtin", "qmd is still starting (collections, boot update)")
        assert [(h["path"], h["startLine"]) for h in found["results"]] == [
            ("memory/2026-03-01.md", 1), ("MEMORY.md", 3), ("memory/2026-03-02.md", 81), ("MEMORY.md", 1)]
        assert _call(proc, {"id": 2, "tool": "sync"}) == {"ok": True}  # joins qmd's start-up
        assert _warm_ready(proc)["state"] == "ready"
    finally:
        os.close(hold_w)
        code = stop(proc, signal.SIGTERM)
    assert code == 0
