"""Benchmark qmdbridge against the real qmd on one generated workspace, in one run.

Measured (wall time of whole processes, median of ``--runs``; the same workspace and queries):
- index build: ``qmdbridge qmd update`` (qmd collections + ``qmd update``) and
  ``qmdbridge index`` (builtin FTS);
- raw ``qmd search --json`` with the same argv and per-agent environment qmdbridge uses;
- ``qmdbridge search`` in qmd mode, and the ratio to raw qmd (target <= 1.10x);
- ``qmdbridge search`` in builtin mode;
- the fallback path with a hanging qmd (``tests/qmdbridge/standins/hang.py``,
  ``limits.timeoutMs``), the breaker file deleted before each run so each run waits for the
  timeout: answer time in-process (target <= timeout + 100 ms) and CLI wall time; then the
  breaker-open case (no wait); and whether the hang's grandchildren were all reaped;
- the qmd processes one ``qmdbridge search`` starts (a logging wrapper around qmd), which
  explains the overhead ratio;
- an agent's question in qmd mode (long-lived): the bridge's answer time and hits (its content
  words, then the relaxed pass of ``qmdbridge/qmd/lexical.py``) beside raw qmd given the question
  as written, and the qmd processes such a search starts.

Usage: ``python3 scripts/bench_qmd.py [--quick] [--json] [--files 1000] [--runs 5]``.
Needs ``bash scripts/install-qmd.sh`` (``.tools/bin/qmd``); without it every row is skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SCRIPTS = Path(__file__).resolve().parent
REPO = SCRIPTS.parent
sys.path.insert(0, str(SCRIPTS))

from benchlib import Row, check, cli_argv, emit, median, run_child  # noqa: E402
from corpus import generate_workspace, note_path, planted_token  # noqa: E402

QMD = REPO / ".tools" / "bin" / "qmd"
HANG = REPO / "tests" / "qmdbridge" / "standins" / "hang.py"
OVERHEAD_MAX = 1.10
# An agent's question over the generated notes' vocabulary (scripts/corpus.py).
QUESTION = "When did Priya fix the webhook timeout?"
FALLBACK_SLACK_MS = 100
SEC = "qmd vs qmdbridge"


def base_env(state: Path) -> dict[str, str]:
    """Our environment without ``CI`` (qmd refuses model work under CI) and with the state dir."""
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["OPENCLAW_STATE_DIR"] = str(state)
    return env


def write_config(state: Path, *, command: str, timeout_ms: int) -> None:
    """``<state>/openclaw.json`` (JSON5-compatible) for qmd mode with ``command``."""
    state.mkdir(parents=True, exist_ok=True)
    doc = {"memory": {"backend": "qmd", "qmd": {
        "command": command, "limits": {"timeoutMs": timeout_ms}, "update": {"onBoot": False}}},
        "agents": {"defaults": {"memorySearch": {"provider": "none"}}}}
    (state / "openclaw.json").write_text(json.dumps(doc, indent=2), encoding="utf-8")


def cli(state: Path, ws: Path, *args: str) -> Any:
    """Run ``qmdbridge ARGS --workspace WS --json``; returns ``(ChildRun, parsed JSON)``."""
    run = run_child([*cli_argv(), *args, "--workspace", str(ws), "--json"], env=base_env(state),
                    timeout_s=900)
    return run, run.json()


def raw_qmd_argv(query: str) -> list[str]:
    """The argv qmdbridge runs for a ``search``-mode query over both memory collections."""
    return [str(QMD), "search", "--json", "-n", "6", "-c", "memory-root-main", "-c",
            "memory-dir-main", "--index", "index", "--", query]


def raw_qmd_env(state: Path) -> dict[str, str]:
    """qmd's per-agent environment (XDG dirs under ``<state>/agents/main/qmd``)."""
    from qmdbridge.paths import child_env, qmd_home

    env = base_env(state)
    return dict(child_env(qmd_home(state, "main"), parent_env=env, path_env=env.get("PATH", "")))


def fallback_worker(spec: dict[str, Any]) -> dict[str, Any]:
    """Child side: one fresh ``MemoryManager`` search against the hanging qmd, timed in-process."""
    import anyio

    from qmdbridge.config import load_config, resolve_agent
    from qmdbridge.manager import MemoryManager

    env = base_env(Path(spec["state"]))
    env["STANDIN_PIDFILE"] = spec["pidfile"]
    agent = resolve_agent(load_config(Path(spec["state"]) / "openclaw.json", env=env), "main",
                          workspace=spec["ws"], env=env)

    async def run() -> dict[str, Any]:
        async with MemoryManager(agent, env=env) as m:
            start = time.perf_counter()
            res = await m.search(spec["query"])
            ms = (time.perf_counter() - start) * 1000
        return {"ms": ms, "backend": res.backend, "hits": len(res.results),
                "reason": res.fallback.reason if res.fallback else None}

    return anyio.run(run)


def inprocess_worker(spec: dict[str, Any]) -> dict[str, Any]:
    """Child side: one long-lived ``MemoryManager`` (as ``serve`` keeps), ``runs`` searches in
    qmd mode, and the same number of raw qmd searches; medians in ms."""
    import subprocess

    import anyio

    from qmdbridge.config import load_config, resolve_agent
    from qmdbridge.manager import MemoryManager

    state = Path(spec["state"])
    env = base_env(state)
    agent = resolve_agent(load_config(state / "openclaw.json", env=env), "main",
                          workspace=spec["ws"], env=env)
    queries: list[str] = spec["queries"]

    async def timed_words(m: MemoryManager) -> tuple[list[float], str]:
        """One untimed search, then ``runs`` timed one-word searches: times (ms), the backend
        of the last answer."""
        times, backend = [], ""
        await m.search(queries[0])  # warm: probe, collections
        for i in range(spec["runs"]):
            start = time.perf_counter()
            res = await m.search(queries[i % len(queries)])
            times.append((time.perf_counter() - start) * 1000)
            backend = res.backend
        return times, backend

    async def run() -> tuple[list[float], str]:
        async with MemoryManager(agent, env=env) as m:
            return await timed_words(m)

    async def timed_question(m: MemoryManager) -> tuple[list[float], int]:
        """One untimed search, then ``runs`` timed ones of the question: times (ms) and the
        hits of the last (-1 when the builtin engine answered)."""
        times, hits = [], 0
        await m.search(spec["question"])
        for _ in range(spec["runs"]):
            start = time.perf_counter()
            res = await m.search(spec["question"])
            times.append((time.perf_counter() - start) * 1000)
            hits = len(res.results) if res.backend == "qmd" else -1
        return times, hits

    async def question() -> tuple[list[float], int]:
        async with MemoryManager(agent, env=env) as m:
            return await timed_question(m)

    async def warm_question() -> tuple[list[float], list[float], int, int, int]:
        """The one-word queries and the question in long-lived ``full`` mode (``serve``,
        ``mcp``), once the warm ``qmd mcp`` child is ready: their lexical searches go to the
        child, one call per collection."""
        async with MemoryManager(agent, mode="full", env=env) as m:
            await m.start()
            backend: Any = await m.qmd()
            warm = getattr(backend, "warm", None)
            if warm is None:
                return [], [], 0, 0, 0
            with anyio.fail_after(60):
                await warm.wait_for(lambda w: w.ready)
            words, _ = await timed_words(m)
            times, hits = await timed_question(m)
            return words, times, hits, warm.answered, warm.spawn_fallbacks

    bridge, backend = anyio.run(run)
    asked, asked_hits = anyio.run(question)
    warm_words, warm_asked, warm_hits, warm_answered, warm_spawned = anyio.run(warm_question)
    raw, raw_asked = [], []
    for i in range(spec["runs"]):
        start = time.perf_counter()
        subprocess.run(raw_qmd_argv(queries[i % len(queries)]), env=raw_qmd_env(state),
                       cwd=spec["ws"], capture_output=True, check=True)
        raw.append((time.perf_counter() - start) * 1000)
        start = time.perf_counter()
        out = subprocess.run(raw_qmd_argv(spec["question"]), env=raw_qmd_env(state),
                             cwd=spec["ws"], capture_output=True, check=True)
        raw_asked.append((time.perf_counter() - start) * 1000)
    return {"bridge": median(bridge), "raw": median(raw), "backend": backend,
            "question": median(asked), "question_hits": asked_hits,
            "warm_words": median(warm_words) if warm_words else None,
            "warm_question": median(warm_asked) if warm_asked else None, "warm_hits": warm_hits,
            "warm_answered": warm_answered, "warm_spawned": warm_spawned,
            "raw_question": median(raw_asked), "raw_question_hits": len(json.loads(out.stdout))}


def leftover(pidfile: Path) -> int:
    """How many of the hang stand-in's grandchildren (pids in ``pidfile``) are still alive."""
    import psutil

    if not pidfile.is_file():
        return 0
    alive = 0
    for line in pidfile.read_text().split():
        try:
            p = psutil.Process(int(line))
            if p.status() != psutil.STATUS_ZOMBIE:
                alive += 1
                p.kill()
        except psutil.NoSuchProcess:
            continue
    pidfile.unlink()
    return alive


def qmd_calls(tmp: Path, state: Path, ws: Path, query: str, *, fresh: bool = True) -> list[str]:
    """The qmd command lines one ``qmdbridge search`` runs (through a logging wrapper); with
    ``fresh`` in a new state dir (no probe cache yet), else in the one the last call used."""
    log = tmp / "qmd-calls.log"
    wrapper = tmp / "qmd-logged"
    spy_state = tmp / "state-spy"
    if fresh:  # (rewriting the wrapper later would change its mtime and void the probe cache)
        wrapper.write_text(f'#!/bin/sh\necho "$*" >> "{log}"\nexec "{QMD}" "$@"\n')
        wrapper.chmod(0o755)
        write_config(spy_state, command=str(wrapper), timeout_ms=30_000)
        os.symlink(state / "agents", spy_state / "agents")  # same qmd home and index
    log.unlink(missing_ok=True)
    cli(spy_state, ws, "search", query)
    return log.read_text().splitlines() if log.is_file() else []


def bench(tmp: Path, *, files: int, runs: int, inprocess_runs: int, timeout_ms: int) -> list[Row]:
    """All rows of the benchmark: ``runs`` per measurement of whole processes,
    ``inprocess_runs`` per timed in-process search."""
    ws = tmp / "ws"
    info = generate_workspace(ws, files=files, file_bytes=2000)
    meta_note = f"{files} notes, {info.total_bytes / 1e6:.1f} MB"
    state = tmp / "state-qmd"
    write_config(state, command=str(QMD), timeout_ms=30_000)
    run, _ = cli(state, ws, "qmd", "update")
    qmd_index_s = run.wall_ms / 1000
    run, doc = cli(state, ws, "index", "--backend", "builtin")
    builtin_index_s = run.wall_ms / 1000
    rows: list[Row] = [
        Row(SEC, "index: qmdbridge qmd update (qmd)", qmd_index_s, "s", "", None, meta_note),
        Row(SEC, "index: qmdbridge index (builtin FTS)", builtin_index_s, "s", "", None,
            f"{doc['status']['chunks']} chunks"),
        Row(SEC, "index ratio builtin / qmd", builtin_index_s / qmd_index_s, "x"),
    ]
    # One-word queries: the bridge runs the same qmd search as the raw command (a question
    # may add the relaxed pass of qmdbridge/qmd/lexical.py, measured on its own below).
    queries = [planted_token(i) for i in (1, files // 2, files - 1)]
    expected = note_path(files // 2)
    raw_env = raw_qmd_env(state)
    raw_walls, bridge_walls, builtin_walls = [], [], []
    raw_hit = bridge_hit = builtin_hit = False
    for i in range(runs):
        q = queries[i % len(queries)]
        r = run_child(raw_qmd_argv(q), env=raw_env, cwd=ws)
        raw_walls.append(r.wall_ms)
        r2, d2 = cli(state, ws, "search", q)
        bridge_walls.append(r2.wall_ms)
        r3, d3 = cli(state, ws, "search", q, "--backend", "builtin")
        builtin_walls.append(r3.wall_ms)
        if q == planted_token(files // 2):
            raw_hit = any(str(h.get("file", "")).endswith(expected.split("/")[-1])
                          for h in json.loads(r.stdout))
            bridge_hit = d2["backend"] == "qmd" and d2["results"][0]["path"] == expected
            builtin_hit = d3["results"][0]["path"] == expected
    raw, bridge, builtin = median(raw_walls), median(bridge_walls), median(builtin_walls)
    rows += [
        Row(SEC, "raw qmd search (CLI wall)", raw, "ms", "", None,
            f"{runs} runs; planted token found: {raw_hit}"),
        Row(SEC, "qmdbridge search, qmd mode (CLI wall)", bridge, "ms", "", None,
            f"planted token found via qmd: {bridge_hit}"),
        Row(SEC, "qmd mode CLI / raw qmd CLI", bridge / raw, "x", "", None,
            "a new Python process per search: start-up and imports dominate"),
        Row(SEC, "qmdbridge search, builtin mode (CLI wall)", builtin, "ms", "", None,
            f"planted token found: {builtin_hit}"),
        Row(SEC, "builtin mode / raw qmd", builtin / raw, "x"),
    ]
    spec = {"state": str(state), "ws": str(ws), "queries": queries, "runs": inprocess_runs,
            "question": QUESTION}
    r = run_child([sys.executable, __file__, "--inprocess-worker", json.dumps(spec)],
                  env=base_env(state), timeout_s=300)
    inproc = r.json()
    assert isinstance(inproc, dict)
    spawning = inproc["bridge"] / inproc["raw"]
    warm_words = inproc["warm_words"]
    ratio = warm_words / inproc["raw"] if warm_words is not None else float("nan")
    rows += [
        Row(SEC, "manager.search, qmd mode, one word (in-process, spawning)", inproc["bridge"], "ms",
            "", None, f"answered by {inproc['backend']}; raw qmd in the same child {inproc['raw']:.1f} ms"),
        Row(SEC, "spawning manager / raw qmd", spawning, "x", "", None,
            "one-word queries: the same qmd search, spawned as one-shot commands do"),
        Row(SEC, "manager.search, qmd mode, one word (long-lived, warm qmd mcp child)", warm_words,
            "ms", "", None, "as serve and mcp answer: a lex sub-search per collection"),
        Row(SEC, "overhead qmd mode / raw qmd (long-lived)", ratio, "x", f"<= {OVERHEAD_MAX:.2f}x",
            check(ratio, OVERHEAD_MAX), "one-word queries: serve's answer against a spawned qmd search"),
        Row(SEC, "manager.search, qmd mode, a question (in-process, spawning)", inproc["question"], "ms", "",
            None, f"{QUESTION!r}: {inproc['question_hits']} hits; raw qmd with it as written "
            f"{inproc['raw_question']:.1f} ms, {inproc['raw_question_hits']} hits"),
        Row(SEC, "manager.search, qmd mode, a question (long-lived, warm qmd mcp child)",
            inproc["warm_question"], "ms", "", None,
            f"{inproc['warm_hits']} hits; the child answered {inproc['warm_answered']} calls "
            f"(one per collection), {inproc['warm_spawned']} spawned instead"),
    ]
    first = qmd_calls(tmp, state, ws, queries[0])
    steady = qmd_calls(tmp, state, ws, queries[0], fresh=False)
    asked = qmd_calls(tmp, state, ws, QUESTION, fresh=False)
    rows.append(Row(SEC, "qmd processes per qmdbridge search", float(len(steady)), "", "", None,
                    f"first run in a new state dir {len(first)}; then: "
                    + " | ".join(c.split(" --index")[0] for c in steady)[:240]))
    rows.append(Row(SEC, "qmd processes per question", float(len(asked)), "", "", None,
                    "the content words ANDed per collection, then each word alone when that "
                    "leaves free slots"))
    rows += bench_fallback_path(tmp, ws, builtin_ms=builtin, runs=runs, timeout_ms=timeout_ms,
                                query=queries[1])
    return rows


def bench_fallback_path(tmp: Path, ws: Path, *, builtin_ms: float, runs: int, timeout_ms: int,
                        query: str) -> list[Row]:
    """Hanging qmd: in-process answer time, CLI wall, breaker-open case, reaped processes."""
    state = tmp / "state-hang"
    write_config(state, command=str(HANG), timeout_ms=timeout_ms)
    cli(state, ws, "index", "--backend", "builtin")
    breaker = state / "agents" / "main" / "qmd" / "breaker.json"
    pidfile = tmp / "hang.pids"
    spec = {"state": str(state), "ws": str(ws), "query": query, "pidfile": str(pidfile)}
    answers, walls, left, backends = [], [], 0, set()
    for _ in range(runs):
        breaker.unlink(missing_ok=True)
        r = run_child([sys.executable, __file__, "--fallback-worker", json.dumps(spec)],
                      env=base_env(state), timeout_s=120)
        res = r.json()
        assert isinstance(res, dict)
        answers.append(res["ms"])
        backends.add(res["backend"])
        left += leftover(pidfile)
        breaker.unlink(missing_ok=True)
        run, doc = cli(state, ws, "search", query)
        walls.append(run.wall_ms)
        backends.add(doc["backend"])
        left += leftover(pidfile)
    reason = res["reason"] or ""
    r = run_child([sys.executable, __file__, "--fallback-worker", json.dumps(spec)],
                  env=base_env(state), timeout_s=120)
    open_res = r.json()
    assert isinstance(open_res, dict)
    left += leftover(pidfile)
    limit = timeout_ms + FALLBACK_SLACK_MS
    answer = median(answers)
    return [
        Row(SEC, "fallback answer, hanging qmd (in-process)", answer, "ms", f"<= {limit} ms",
            check(answer, limit), f"timeoutMs {timeout_ms}; max {max(answers):.0f} ms; "
            f"answered by {sorted(backends)}; reason: {reason[:60]}"),
        Row(SEC, "fallback, hanging qmd (CLI wall)", median(walls), "ms", "", None,
            f"builtin-mode CLI wall is {builtin_ms:.0f} ms"),
        Row(SEC, "breaker open: answer (in-process)", open_res["ms"], "ms", "", None,
            f"backend {open_res['backend']}; {(open_res['reason'] or '')[:70]}"),
        Row(SEC, "hang stand-in processes left alive", float(left), "", "= 0", left == 0),
    ]


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark (or, with ``--fallback-worker``, one in-process fallback search)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="30 notes, 2 runs (smoke run)")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.add_argument("--files", type=int, help="notes in the workspace (default 1000)")
    p.add_argument("--runs", type=int, help="runs per measurement (default 5; in-process searches 10)")
    p.add_argument("--timeout-ms", type=int, default=1000, help="limits.timeoutMs for the hang")
    p.add_argument("--fallback-worker", metavar="SPEC", help=argparse.SUPPRESS)
    p.add_argument("--inprocess-worker", metavar="SPEC", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.fallback_worker:
        sys.stdout.write(json.dumps(fallback_worker(json.loads(args.fallback_worker))) + "\n")
        return 0
    if args.inprocess_worker:
        sys.stdout.write(json.dumps(inprocess_worker(json.loads(args.inprocess_worker))) + "\n")
        return 0
    files = args.files or (30 if args.quick else 1000)
    runs = args.runs or (2 if args.quick else 5)
    timeout_ms = 500 if args.quick and args.timeout_ms == 1000 else args.timeout_ms
    if not os.access(QMD, os.X_OK):
        rows = [Row(SEC, "real qmd", None, "", "", None,
                    f"skipped: {QMD} missing; run bash scripts/install-qmd.sh")]
    else:
        with tempfile.TemporaryDirectory(prefix="bench-qmd-") as tmp:
            # an in-process search takes milliseconds: 10 of them unless --runs names the count
            rows = bench(Path(tmp), files=files, runs=runs, inprocess_runs=args.runs or 10,
                         timeout_ms=timeout_ms)
    emit("bench_qmd", rows, as_json=args.json,
         meta={"quick": args.quick, "files": files, "runs": runs, "timeoutMs": timeout_ms})
    return 0


if __name__ == "__main__":
    sys.exit(main())
