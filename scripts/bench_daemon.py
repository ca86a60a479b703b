"""Benchmark the warm daemon and the MCP server against the real qmd, side by side in one run.

Measured on one generated workspace (wall time of whole processes, median of ``--runs``, and their
CPU time, user + system, which the machine's load moves less than the wall; the
three commands interleaved in each round so machine load hits them alike):
- ``qmdbridge search --json`` answered by a running ``qmdbridge serve`` (``servedBy: daemon``);
- the same command without a daemon (``QMDBRIDGE_DAEMON=off``): the one-shot fast path, an index
  in sync searched read-only with the settings the first in-process search recorded
  (``qmdbridge/cli/fast_search.py``);
- the same with ``QMDBRIDGE_CLI_CACHE=off`` too: the whole in-process engine (config models,
  manager, pre-search sync), what every one-shot search cost before the fast path;
- ``python -c pass`` with the same interpreter: the start-up floor of any served search;
- ``qmd search --json`` (the real qmd at ``.tools/bin/qmd``) with the argv and per-agent
  environment qmdbridge uses, on qmd's own index of the same notes;
- ratios to qmd: served target <= 0.5x, without daemon target <= 1.0x;
- ``qmdbridge mcp --http`` kept warm: ``tools/list`` + one ``memory_search`` in an initialised
  MCP session (the SDK's Streamable HTTP client), target <= 1 s;
- the warm qmd child of long-lived mode (``qmdbridge/qmd/warm.py``, ``qmd mcp`` over stdio),
  side by side on the same notes, interleaved: a ``query``-mode search through it
  (``QmdBackend.search``, in-process, and ``MemoryManager.search`` for the whole tool call minus
  its transport), the bare tool call on its connection, qmd's own MCP server answering the same
  ``query`` tool call (the reference: a ``qmd mcp --http`` started here, called with a bare
  JSON-RPC POST; and a ``qmd mcp`` over stdio called with our client (the SDK's
  ``ClientSession`` over our pipes) and with the SDK's ``stdio_client`` + ``ClientSession``), two calls at once and two in turn on one stdio
  connection, and a spawn per call (``qmd search --json`` and ``qmd query --json --no-rerank``,
  whole processes); targets: warm <= 1.10x qmd's own MCP time (``--http``), spawned ``qmd
  search`` >= 3x the warm search. The notes are the generated ones without ``MEMORY.md`` and
  each query is a note's planted token and date: qmd's ``query`` then finds a strong BM25 hit
  and needs none of its GGUF models (``QMD_*_MODEL`` name absent files, so a model load would
  fail at once, not download).

The packages' bytecode is compiled first (``compileall``, as ``pip install`` does), so a
checkout run with ``PYTHONDONTWRITEBYTECODE`` does not time the compiler.

With ``--skipped`` the workspace also holds a binary note in ``memory/`` (skipped by every sync).

Usage: ``python3 scripts/bench_daemon.py [--quick] [--json] [--files 300] [--runs 15]
[--only cli|mcp|warm] [--skipped]``. Without ``.tools/bin/qmd`` (``bash scripts/install-qmd.sh``) the qmd
rows are skipped.
"""

from __future__ import annotations

import argparse
import compileall
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

SCRIPTS = Path(__file__).resolve().parent
REPO = SCRIPTS.parent
sys.path.insert(0, str(SCRIPTS))

from bench_qmd import QMD, base_env, raw_qmd_argv, raw_qmd_env, write_config  # noqa: E402
from benchlib import Row, check, cli_argv, emit, median, percentile, run_child  # noqa: E402
from corpus import generate_workspace, note_path, planted_token  # noqa: E402

SEC = "served vs in-process vs qmd"
MCP_SEC = "MCP server (warm)"
WARM_SEC = "warm qmd child vs qmd's own MCP vs a spawn per call (query mode, same notes)"
WARM_MAX = 1.10
SPAWN_MIN = 3.0
# Fewer notes give a planted token too little BM25 weight for qmd's strong-signal shortcut.
WARM_MIN_FILES = 30
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


def compile_packages() -> None:
    """Write the bytecode of ``qmdbridge`` and ``fallback`` as ``pip install`` does."""
    import fallback
    import qmdbridge

    for pkg in (qmdbridge, fallback):
        compileall.compile_dir(str(Path(pkg.__file__).parent), quiet=1)


def bench_cli(tmp: Path, ws: Path, *, files: int, runs: int) -> list[Row]:
    """Served, fast one-shot, in-process engine and qmd CLI walls, interleaved."""
    compile_packages()
    state = tmp / "state-builtin"
    env = base_env(state)
    env.pop("QMDBRIDGE_DAEMON", None)
    env.pop("QMDBRIDGE_CLI_CACHE", None)
    off = {**env, "QMDBRIDGE_DAEMON": "off"}
    engine_env = {**off, "QMDBRIDGE_CLI_CACHE": "off"}
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
    served, process, engine, raw, floor = [], [], [], [], []
    cpu: dict[str, list[float]] = {"served": [], "process": [], "engine": [], "raw": []}
    served_ok = process_ok = engine_ok = raw_ok = True
    try:
        run_child(search_argv(ws, queries[0]), env=env).json()  # first served call warms the daemon
        for q in queries:  # the first in-process search of each command line records its settings
            run_child(search_argv(ws, q), env=off).json()
        for i in range(runs):
            q = queries[i % len(queries)]
            a = run_child(search_argv(ws, q), env=env)
            doc: Any = a.json()
            served.append(a.wall_ms)
            cpu["served"].append(a.cpu_ms)
            served_ok &= doc["servedBy"] == "daemon" and doc["results"][0]["path"] == expected[q]
            floor.append(run_child([sys.executable, "-c", "pass"], env=env).wall_ms)
            b = run_child(search_argv(ws, q), env=off)
            doc = b.json()
            process.append(b.wall_ms)
            cpu["process"].append(b.cpu_ms)
            process_ok &= doc["servedBy"] == "process" and doc["results"][0]["path"] == expected[q]
            e = run_child(search_argv(ws, q), env=engine_env)
            edoc: Any = e.json()
            engine.append(e.wall_ms)
            cpu["engine"].append(e.cpu_ms)
            engine_ok &= edoc["results"] == doc["results"]
            if have_qmd:
                c = run_child(raw_qmd_argv(q), env=raw_qmd_env(qmd_state), cwd=ws)
                hits: Any = c.json()
                raw.append(c.wall_ms)
                cpu["raw"].append(c.cpu_ms)
                raw_ok &= any(str(h.get("file", "")).endswith(expected[q].split("/")[-1]) for h in hits)
    finally:
        code = stop(daemon)
    s, p = median(served), median(process)
    rows = [
        Row(SEC, "qmdbridge search, served by the daemon (CLI wall)", s, "ms", "", None,
            f"{runs} runs; servedBy daemon and right note every run: {served_ok}"),
        Row(SEC, "qmdbridge search, no daemon (CLI wall)", p, "ms", "", None,
            f"right note every run: {process_ok}"),
        Row(SEC, "qmdbridge search, no daemon, cache off: the engine (CLI wall)", median(engine), "ms",
            "", None, f"QMDBRIDGE_CLI_CACHE=off; same hits as the fast path every run: {engine_ok}"),
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
    rows += [Row(SEC, f"{what} (CPU, user + system)", median(cpu[key]), "ms") for key, what in (
        ("served", "served by the daemon"), ("process", "no daemon"), ("engine", "no daemon, cache off"),
        ("raw", "qmd search --json")) if cpu[key]]
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


def _warm_env(state: Path) -> dict[str, str]:
    """:func:`base_env` with ``HOME`` in the bench folder and qmd's models pointed at absent
    files (a strong BM25 hit keeps ``qmd query`` from loading any)."""
    env = base_env(state)
    env["HOME"] = str(state.parent / "home-warm")
    for kind in ("EMBED", "GENERATE", "RERANK"):
        env[f"QMD_{kind}_MODEL"] = str(state.parent / f"absent-{kind.lower()}.gguf")
    return env


class _BareHttp:
    """A bare JSON-RPC client for qmd's own ``qmd mcp --http`` (the reference): one httpx POST
    per call, the answer read whole (plain JSON, or the one SSE ``message`` event)."""

    def __init__(self, port: int) -> None:
        import httpx

        self.base = f"http://127.0.0.1:{port}"
        self.http = httpx.AsyncClient(timeout=None, headers={
            "Accept": "application/json, text/event-stream", "Content-Type": "application/json",
            "MCP-Protocol-Version": "2025-11-25"})
        self.next_id = 0

    async def health(self) -> bool:
        import httpx

        try:
            return (await self.http.get(f"{self.base}/health")).status_code == 200
        except httpx.HTTPError:
            return False

    async def rpc(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        self.next_id += 1
        res = await self.http.post(f"{self.base}/mcp", content=json.dumps(
            {"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params}))
        res.raise_for_status()
        body = res.text
        if res.headers.get("content-type", "").startswith("text/event-stream"):
            body = next(ln[5:].strip() for ln in body.splitlines() if ln.startswith("data:"))
        return dict(json.loads(body)["result"])

    async def initialize(self) -> None:
        await self.rpc("initialize", {"protocolVersion": "2025-11-25", "capabilities": {},
                                      "clientInfo": {"name": "bench", "version": "1"}})

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        return dict((await self.rpc("tools/call", {"name": name, "arguments": arguments}))["structuredContent"])


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def _warm_round(ws: Path, state: Path, queries: dict[str, str], runs: int,
                      spawn_runs: int) -> dict[str, Any]:
    """Start a long-lived manager (qmd ``query`` mode), qmd's own ``qmd mcp --http`` and two
    more ``qmd mcp`` over stdio (our client over our pipes, the SDK's ``stdio_client``), time the same
    searches through each (interleaved, the order turned every round), then spawned commands."""
    import anyio
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    from fallback.request import SearchRequest
    from qmdbridge import MemoryManager
    from qmdbridge.config import parse_config, resolve_agent
    from qmdbridge.qmd.mcp_client import McpStdioClient
    from qmdbridge.qmd.reads import RACY_NS

    cfg = parse_config({"memory": {"backend": "qmd", "qmd": {
        "command": str(QMD), "searchMode": "query", "rerank": False, "limits": {"timeoutMs": 30_000},
        "update": {"waitForBootSync": True, "interval": "0", "embedInterval": "0"}}},
        "agents": {"defaults": {"memorySearch": {"provider": "none"}}}})
    agent = resolve_agent(cfg, "main", workspace=ws, env={"OPENCLAW_STATE_DIR": str(state)})
    keys = ("backend", "manager", "child", "http", "stdio", "sdk", "pair_at_once", "pair_in_turn")
    times: dict[str, list[float]] = {k: [] for k in (*keys, "search", "query")}
    ok = {"backend": True, "manager": True, "http": True, "stdio": True, "search": True, "query": True}
    async with MemoryManager(agent, mode="full", env=_warm_env(state)) as manager, \
            contextlib.AsyncExitStack() as stack:
        await manager.start()
        backend: Any = manager.sidecar.backend if manager.sidecar else None
        with anyio.fail_after(120):
            await backend.warm.wait_for(lambda w: w.ready)
        # Steady state: the builtin engine's boot sync (the fallback index, a worker thread that
        # holds the GIL) is over, and hit checks and index counts keep what they read once the
        # notes and qmd's index are older than RACY_NS (qmd.reads).
        with anyio.fail_after(300):
            while "builtin: boot sync" in manager.tasks.status().tasks:
                await anyio.sleep(0.1)
        newest = max(p.stat().st_mtime_ns for p in (ws / "memory", backend.home.index_db,
                                                    backend.home.index_db.with_name("index.sqlite-wal"))
                     if p.exists())
        await anyio.sleep(max(0, RACY_NS - (time.time_ns() - newest)) / 1e9 + 0.1)
        env, port = backend.child_env, _free_port()
        for q in queries:  # qmd's query needs no model only for a strong BM25 hit
            top = json.loads(run_child([str(QMD), "search", "--json", "-n", "2", "-c", "memory-dir-main",
                                        "--index", "index", "--", q], env=env, cwd=ws).stdout or "[]")
            scores = [float(h["score"]) for h in top] + [0.0, 0.0]
            if scores[0] < 0.85 or scores[0] - scores[1] < 0.15:
                return {"skip": f"no strong BM25 hit for {q!r} ({scores[:2]}): more notes needed"}
        own = subprocess.Popen([str(QMD), "mcp", "--http", "--port", str(port), "--host", "127.0.0.1",
                                "--index", "index"], env=env, cwd=ws, stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        http = _BareHttp(port)
        stdio_proc = await anyio.open_process([str(QMD), "mcp", "--index", "index"], env=env, cwd=ws,
                                              stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                              stderr=subprocess.DEVNULL, start_new_session=True)
        assert stdio_proc.stdin is not None and stdio_proc.stdout is not None
        stdio = McpStdioClient(stdio_proc.stdin, stdio_proc.stdout)
        child = backend.warm._client
        devnull = stack.enter_context(open(os.devnull, "w"))  # the SDK child's stderr
        sdk_params = StdioServerParameters(command=str(QMD), args=["mcp", "--index", "index"], env=env,
                                           cwd=str(ws))
        try:
            async with anyio.create_task_group() as readers, \
                    stdio_client(sdk_params, errlog=devnull) as (read, write), \
                    ClientSession(read, write) as sdk:
                readers.start_soon(stdio.run)
                with anyio.fail_after(120):
                    while not await http.health():
                        await anyio.sleep(0.05)
                    await http.initialize()
                    await stdio.initialize()
                    await sdk.initialize()
                names = list(queries)
                lock = anyio.Lock()

                async def pair(args: dict[str, Any], *, in_turn: bool) -> None:
                    async def one() -> None:
                        async with lock if in_turn else contextlib.nullcontext():
                            await stdio.call_tool("query", args)

                    async with anyio.create_task_group() as tg:
                        tg.start_soon(one)
                        tg.start_soon(one)

                for i in range(-3, runs):  # three untimed rounds first: every path warmed up
                    q = names[i % len(names)]
                    args = {"query": q, "limit": 6, "minScore": 0, "collections": ["memory-dir-main"],
                            "rerank": False}
                    calls = {"backend": partial(backend.search, SearchRequest.of(q)), "manager": partial(manager.search, q),
                             "child": partial(child.call_tool, "query", args),
                             "http": partial(http.call_tool, "query", args),
                             "stdio": partial(stdio.call_tool, "query", args),
                             "sdk": partial(sdk.call_tool, "query", args),
                             "pair_at_once": partial(pair, args, in_turn=False),
                             "pair_in_turn": partial(pair, args, in_turn=True)}
                    got: dict[str, Any] = {}
                    spent: dict[str, float] = {}
                    turn = i % len(calls)
                    for key in list(calls)[turn:] + list(calls)[:turn]:  # a new order each round
                        start = time.perf_counter()
                        got[key] = await calls[key]()
                        spent[key] = (time.perf_counter() - start) * 1000
                    if i < 0:
                        continue
                    for key, value in spent.items():
                        times[key].append(value)
                    want = queries[q]
                    hits, res = got["backend"].results, got["manager"]
                    ok["backend"] &= bool(hits) and hits[0].path == want
                    ok["manager"] &= res.backend == "qmd" and res.results[0].path == want
                    for key in ("http", "stdio"):
                        own_hits = got[key]["results"]
                        ok[key] &= bool(own_hits) and own_hits[0]["file"].endswith(want.split("/")[-1])
                readers.cancel_scope.cancel()
            for i in range(spawn_runs):  # whole processes, after the in-process rounds
                q = names[i % len(names)]
                argv = [str(QMD), "search", "--json", "-n", "6", "-c", "memory-dir-main", "--index",
                        "index", "--", q]
                spawned_search = run_child(argv, env=env, cwd=ws)
                spawned_query = run_child([str(QMD), "query", "--json", "-n", "6", "--no-rerank",
                                           *argv[4:]], env=env, cwd=ws)
                times["search"].append(spawned_search.wall_ms)
                times["query"].append(spawned_query.wall_ms)
                ok["search"] &= queries[q].split("/")[-1] in spawned_search.stdout
                ok["query"] &= queries[q].split("/")[-1] in spawned_query.stdout
        finally:
            await http.http.aclose()
            stdio.close()
            stdio_proc.kill()
            await stdio_proc.aclose()
            own.terminate()
            own.wait(timeout=60)
        warm = backend.warm.describe()
    return {"times": times, "ok": ok, "warm": warm}


def bench_warm_qmd(tmp: Path, *, files: int, runs: int) -> list[Row]:
    """The warm qmd child vs qmd's own MCP server vs a spawn per call (module docstring)."""
    import anyio

    if not os.access(QMD, os.X_OK):
        return [Row(WARM_SEC, "warm qmd child", None, "", "", None,
                    f"skipped: {QMD} missing; run bash scripts/install-qmd.sh")]
    ws = tmp / "ws-warm"
    files = max(files, WARM_MIN_FILES)
    generate_workspace(ws, files=files, file_bytes=2000)
    (ws / "MEMORY.md").unlink()  # one collection, every query with a strong BM25 hit in it
    picks = (1, files // 2, files - 1)
    queries = {f"{planted_token(i)} {note_path(i)[7:17]}": note_path(i) for i in picks}
    out = anyio.run(_warm_round, ws, tmp / "state-warm", queries, 4 * runs, runs)
    if "skip" in out:
        return [Row(WARM_SEC, "warm qmd child", None, "", "", None, f"skipped: {out['skip']}")]
    t, ok, warm = out["times"], out["ok"], out["warm"]
    w, own, stdio, sdk = median(t["backend"]), median(t["http"]), median(t["stdio"]), median(t["sdk"])
    spawn_search, spawn_query = median(t["search"]), median(t["query"])
    served_all = warm["answered"] >= 8 * runs and warm["spawnFallbacks"] == 0

    def spread(key: str) -> str:
        return f"best {min(t[key]):.2f}, p90 {percentile(t[key], 90):.2f} ms"

    return [
        Row(WARM_SEC, "our warm child: QmdBackend.search (in-process)", w, "ms", "", None,
            f"{4 * runs} runs, {spread('backend')}; right note every run: {ok['backend']}; all "
            f"answered by the child: {served_all}"),
        Row(WARM_SEC, "qmd's own MCP: the same tool call, bare JSON-RPC POST", own, "ms", "", None,
            f"qmd mcp --http; {spread('http')}; right note every run: {ok['http']}"),
        Row(WARM_SEC, "qmd's own MCP over stdio: the same call, our client (ClientSession over our pipes)", stdio, "ms", "", None,
            f"qmd mcp; {spread('stdio')}; right note every run: {ok['stdio']}"),
        Row(WARM_SEC, "qmd's own MCP over stdio: the same call, SDK stdio_client + ClientSession", sdk,
            "ms", "", None, f"{spread('sdk')}; the SDK's cost of its own process: {sdk - stdio:+.2f} ms"),
        Row(WARM_SEC, "our warm child: the same tool call on its connection", median(t["child"]), "ms", "",
            None, f"{spread('child')}; the rest of the search is ours (hit files checked on disk, "
                  "a worker-thread hop)"),
        Row(WARM_SEC, "two calls at once on one stdio connection (ids matched)", median(t["pair_at_once"]),
            "ms", "", None, spread("pair_at_once")),
        Row(WARM_SEC, "two calls in turn on one stdio connection (one in flight)",
            median(t["pair_in_turn"]), "ms", "", None, f"{spread('pair_in_turn')}; what the child does"),
        Row(WARM_SEC, "MemoryManager.search through the warm child", median(t["manager"]), "ms", "", None,
            f"the whole memory_search minus its transport; right note every run: {ok['manager']}"),
        Row(WARM_SEC, "spawn per call: qmd search --json (CLI wall)", spawn_search, "ms", "", None,
            f"right note every run: {ok['search']}"),
        Row(WARM_SEC, "spawn per call: qmd query --json --no-rerank (CLI wall)", spawn_query, "ms", "",
            None, f"the spawn path of the same mode; right note every run: {ok['query']}"),
        Row(WARM_SEC, "warm child / qmd's own MCP", w / own, "x", f"<= {WARM_MAX}x", check(w / own, WARM_MAX),
            f"medians, against qmd mcp --http; best to best {min(t['backend']) / min(t['http']):.2f}x; "
            f"against qmd mcp (stdio) {w / stdio:.2f}x"),
        Row(WARM_SEC, "spawned qmd search / warm child", spawn_search / w, "x", f">= {SPAWN_MIN}x",
            spawn_search / w >= SPAWN_MIN),
        Row(WARM_SEC, "warm child start-up (spawn to initialize)", float(warm["startupMs"] or 0), "ms",
            "", None, f"qmd {warm['serverVersion']}, {warm['transport']}, restarts {warm['restarts']}"),
    ]


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print the table (or one JSON document with ``--json``)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="30 notes, 3 runs (smoke run)")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.add_argument("--files", type=int, help="notes in the workspace (default 300)")
    p.add_argument("--runs", type=int, help="runs per measurement (default 15)")
    p.add_argument("--only", choices=("cli", "mcp", "warm"), help="run one section")
    p.add_argument("--skipped", action="store_true",
                   help="add a binary note (NUL bytes) to memory/, which every sync skips")
    args = p.parse_args(argv)
    files = args.files or (30 if args.quick else 300)
    runs = args.runs or (3 if args.quick else 15)
    with tempfile.TemporaryDirectory(prefix="bench-daemon-") as tmp:
        ws = Path(tmp) / "ws"
        generate_workspace(ws, files=files, file_bytes=2000)
        if args.skipped:
            (ws / "memory" / "scan.md").write_bytes(b"\x00\x01\x02 binary dump\n" * 64)
        rows: list[Row] = []
        if args.only in (None, "cli"):
            rows += bench_cli(Path(tmp), ws, files=files, runs=runs)
        if args.only in (None, "mcp"):
            rows += bench_mcp(Path(tmp), ws, files=files, runs=runs)
        if args.only in (None, "warm"):
            rows += bench_warm_qmd(Path(tmp), files=files, runs=runs)
    emit("bench_daemon", rows, as_json=args.json,
         meta={"quick": args.quick, "files": files, "runs": runs, "skipped": args.skipped})
    return 0


if __name__ == "__main__":
    sys.exit(main())
