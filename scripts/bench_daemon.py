"""Benchmark the warm daemon and the MCP server against the real qmd, side by side in one run.

Measured on one generated workspace (wall time of whole processes, median of ``--runs``, the
three commands interleaved in each round so machine load hits them alike):
- ``qmdbridge search --json`` answered by a running ``qmdbridge serve`` (``servedBy: daemon``);
- the same command without a daemon (``QMDBRIDGE_DAEMON=off``: a fresh in-process engine);
- ``python -c pass`` with the same interpreter: the start-up floor of any served search;
- ``qmd search --json`` (the real qmd at ``.tools/bin/qmd``) with the argv and per-agent
  environment qmdbridge uses, on qmd's own index of the same notes;
- ratios to qmd: served target <= 0.5x, without daemon target <= 1.0x;
- ``qmdbridge mcp --http`` kept warm: ``tools/list`` + one ``memory_search`` in an initialised
  MCP session (the SDK's Streamable HTTP client), target <= 1 s.

Usage: ``python3 scripts/bench_daemon.py [--quick] [--json] [--files 300] [--runs 15]``.
Without ``.tools/bin/qmd`` (``bash scripts/install-qmd.sh``) the qmd rows are skipped.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SCRIPTS = Path(__file__).resolve().parent
REPO = SCRIPTS.parent
sys.path.insert(0, str(SCRIPTS))

from bench_qmd import QMD, base_env, raw_qmd_argv, raw_qmd_env, write_config  # noqa: E402
from benchlib import Row, check, cli_argv, emit, median, run_child  # noqa: E402
from corpus import generate_workspace, note_path, planted_token  # noqa: E402

SEC = "served vs in-process vs qmd"
MCP_SEC = "MCP server (warm)"
SERVED_MAX = 0.5
PROCESS_MAX = 1.0
MCP_MAX_MS = 1000.0
TOKEN = "bench-daemon-token-0123456789"


def start_and_wait(argv: list[str], env: dict[str, str], ready: str) -> tuple[subprocess.Popen[bytes], str]:
    """Start a long-lived child and read its stderr up to the line containing ``ready``.

    Raises:
        RuntimeError: the child exited first (its stderr in the message).
    """
    proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    assert proc.stderr is not None
    seen = ""
    while True:
        line = proc.stderr.readline().decode()
        if not line:
            proc.wait()
            raise RuntimeError(f"{argv[-1]} exited {proc.returncode}: {seen[-1500:]}")
        seen += line
        if ready in line:
            return proc, line


def stop(proc: subprocess.Popen[bytes]) -> int:
    """SIGTERM and wait (kill after 60 s); returns the exit code."""
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()
    finally:
        if proc.stderr is not None:
            proc.stderr.close()


def search_argv(ws: Path, query: str) -> list[str]:
    """``qmdbridge search QUERY --workspace WS --json``."""
    return [*cli_argv(), "search", query, "--workspace", str(ws), "--json"]


def bench_cli(tmp: Path, ws: Path, *, files: int, runs: int) -> list[Row]:
    """Served, in-process and qmd CLI walls, interleaved."""
    state = tmp / "state-builtin"
    env = base_env(state)
    env.pop("QMDBRIDGE_DAEMON", None)
    off = {**env, "QMDBRIDGE_DAEMON": "off"}
    run_child([*cli_argv(), "index", "--workspace", str(ws), "--json"], env=off, timeout_s=900).json()
    have_qmd = os.access(QMD, os.X_OK)
    qmd_state = tmp / "state-qmd"
    if have_qmd:
        write_config(qmd_state, command=str(QMD), timeout_ms=30_000)
        run_child([*cli_argv(), "qmd", "update", "--workspace", str(ws), "--json"],
                  env={**base_env(qmd_state), "QMDBRIDGE_DAEMON": "off"}, timeout_s=900).json()
    expected = {planted_token(i): note_path(i) for i in (1, files // 2, files - 1)}
    queries = list(expected)
    daemon, _ = start_and_wait([*cli_argv(), "serve", "--no-stdin", "--workspace", str(ws)], env,
                               ready="daemon socket")
    served, process, raw, floor = [], [], [], []
    served_ok = process_ok = raw_ok = True
    try:
        run_child(search_argv(ws, queries[0]), env=env).json()  # first served call warms the daemon
        for i in range(runs):
            q = queries[i % len(queries)]
            a = run_child(search_argv(ws, q), env=env)
            doc: Any = a.json()
            served.append(a.wall_ms)
            served_ok &= doc["servedBy"] == "daemon" and doc["results"][0]["path"] == expected[q]
            floor.append(run_child([sys.executable, "-c", "pass"], env=env).wall_ms)
            b = run_child(search_argv(ws, q), env=off)
            doc = b.json()
            process.append(b.wall_ms)
            process_ok &= doc["servedBy"] == "process" and doc["results"][0]["path"] == expected[q]
            if have_qmd:
                c = run_child(raw_qmd_argv(q), env=raw_qmd_env(qmd_state), cwd=ws)
                hits: Any = c.json()
                raw.append(c.wall_ms)
                raw_ok &= any(str(h.get("file", "")).endswith(expected[q].split("/")[-1]) for h in hits)
    finally:
        code = stop(daemon)
    s, p = median(served), median(process)
    rows = [
        Row(SEC, "qmdbridge search, served by the daemon (CLI wall)", s, "ms", "", None,
            f"{runs} runs; servedBy daemon and right note every run: {served_ok}"),
        Row(SEC, "qmdbridge search, no daemon (CLI wall)", p, "ms", "", None,
            f"right note every run: {process_ok}"),
        Row(SEC, "python -c pass, same interpreter (start-up floor)", median(floor), "ms", "", None,
            "what any served search pays before its first line runs"),
    ]
    if have_qmd:
        r = median(raw)
        rows += [
            Row(SEC, "qmd search --json (CLI wall)", r, "ms", "", None, f"right note every run: {raw_ok}"),
            Row(SEC, "served / qmd", s / r, "x", f"<= {SERVED_MAX}x", check(s / r, SERVED_MAX)),
            Row(SEC, "no daemon / qmd", p / r, "x", f"<= {PROCESS_MAX}x", check(p / r, PROCESS_MAX)),
        ]
    else:
        rows.append(Row(SEC, "qmd search --json (CLI wall)", None, "", "", None,
                        f"skipped: {QMD} missing; run bash scripts/install-qmd.sh"))
    rows.append(Row(SEC, "daemon exit code after SIGTERM", float(code), "", "= 0", code == 0))
    return rows


async def _mcp_round(url: str, runs: int, query: str) -> tuple[list[float], list[float], str]:
    import httpx
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    warm, fresh, top = [], [], ""
    async with httpx.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}) as http:
        async with streamable_http_client(url, http_client=http) as (read, write, _), \
                ClientSession(read, write) as session:
            await session.initialize()
            await session.call_tool("memory_search", {"query": query})  # warm
            for _ in range(runs):
                start = time.perf_counter()
                await session.list_tools()
                res = await session.call_tool("memory_search", {"query": query})
                warm.append((time.perf_counter() - start) * 1000)
                top = (res.structuredContent or {}).get("results", [{}])[0].get("path", "")
        for _ in range(max(1, runs // 3)):
            start = time.perf_counter()
            async with streamable_http_client(url, http_client=http) as (read, write, _), \
                    ClientSession(read, write) as session:
                await session.initialize()
                await session.list_tools()
                await session.call_tool("memory_search", {"query": query})
            fresh.append((time.perf_counter() - start) * 1000)
    return warm, fresh, top


def bench_mcp(tmp: Path, ws: Path, *, files: int, runs: int) -> list[Row]:
    """``tools/list`` + ``memory_search`` against a warm ``qmdbridge mcp --http``."""
    import anyio

    state = tmp / "state-builtin"
    env = {**base_env(state), "QMDBRIDGE_MCP_TOKEN": TOKEN}
    proc, line = start_and_wait([*cli_argv(), "mcp", "--http", "--port", "0", "--workspace", str(ws)],
                                env, ready="listening on")
    match = re.search(r"listening on (http://\S+)", line)
    assert match is not None
    query = planted_token(files // 2)
    try:
        warm, fresh, top = anyio.run(_mcp_round, match.group(1), runs, query)
    finally:
        code = stop(proc)
    w, f = median(warm), median(fresh)
    return [
        Row(MCP_SEC, "tools/list + memory_search, initialised session", w, "ms", f"<= {MCP_MAX_MS:.0f} ms",
            check(w, MCP_MAX_MS), f"{runs} runs; max {max(warm):.1f} ms; top hit {top == note_path(files // 2)}"),
        Row(MCP_SEC, "new session: initialize + tools/list + memory_search", f, "ms", f"<= {MCP_MAX_MS:.0f} ms",
            check(f, MCP_MAX_MS), f"{len(fresh)} runs"),
        Row(MCP_SEC, "mcp server exit code after SIGTERM", float(code), "", "= 0", code == 0),
    ]


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print the table (or one JSON document with ``--json``)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="30 notes, 3 runs (smoke run)")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.add_argument("--files", type=int, help="notes in the workspace (default 300)")
    p.add_argument("--runs", type=int, help="runs per measurement (default 15)")
    args = p.parse_args(argv)
    files = args.files or (30 if args.quick else 300)
    runs = args.runs or (3 if args.quick else 15)
    with tempfile.TemporaryDirectory(prefix="bench-daemon-") as tmp:
        ws = Path(tmp) / "ws"
        generate_workspace(ws, files=files, file_bytes=2000)
        rows = bench_cli(Path(tmp), ws, files=files, runs=runs)
        rows += bench_mcp(Path(tmp), ws, files=files, runs=runs)
    emit("bench_daemon", rows, as_json=args.json, meta={"quick": args.quick, "files": files, "runs": runs})
    return 0


if __name__ == "__main__":
    sys.exit(main())
