"""Benchmark a one-shot ``qmdbridge search`` in qmd mode (no daemon) beside a raw ``qmd search``.

Measured (wall time of whole processes, median of ``--runs``; the commands of a case
interleaved in each round, so machine load hits them alike):

- ``qmdbridge search QUERY --json`` with ``memory.backend: "qmd"`` and ``QMDBRIDGE_DAEMON=off``:
  what an agent's tool call costs without a running ``serve`` (after a first search of the same
  command line, which records its settings);
- the same with ``QMDBRIDGE_CLI_CACHE=off`` (nothing recorded is used: no qmd call started
  ahead of the config);
- ``qmd search --json`` (the real qmd at ``.tools/bin/qmd``) with the argv and per-agent
  environment the bridge's first call uses (the query's content words, every collection that
  holds documents), on the same index;
- ``python -c pass`` with the same interpreter: the start-up floor;
- with ``--baseline DIR``, the same search from another checkout (``PYTHONPATH=DIR``) in the
  same rounds, so a before/after comparison sees the same machine load;
- the CPU time of each (user + system, the qmd processes it waited for included);
- the qmd search processes (``search``, ``vsearch``, ``query``) one such ``qmdbridge search``
  starts (a logging wrapper around qmd): one per collection; a question's is one ``qmd query``
  of typed ``lex`` searches (its content words ANDed, then each word alone;
  ``qmdbridge/qmd/query_text.py``), other queries one ``qmd search``.

Cases: the workspace of one note (``MEMORY.md``: "router dropped the WAN link on tuesday") asked
``router WAN``; a generated workspace (``scripts/corpus.py``) asked for one note's planted token
(one word: one AND call per collection) and asked a question that few notes answer whole (the
relaxed pass runs). Every run checks that both ``qmdbridge`` variants print the same bytes.

The packages' bytecode is compiled first, as ``pip install`` does.

Usage: ``python3 scripts/bench_qmd_oneshot.py [--quick] [--json] [--files 300] [--runs 15]``.
Needs ``bash scripts/install-qmd.sh`` (``.tools/bin/qmd``); without it every row is skipped.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parent
sys.path.insert(0, str(SCRIPTS))

from bench_daemon import compile_packages, search_argv  # noqa: E402
from bench_qmd import QMD, base_env, raw_qmd_env, write_config  # noqa: E402
from benchlib import Row, cli_argv, emit, median, run_child  # noqa: E402
from corpus import generate_workspace, planted_token  # noqa: E402

SEC = "one-shot qmd-mode qmdbridge search vs raw qmd search"
# A question that few generated notes hold whole (a planted token beside common words), so
# the relaxed pass runs; {token} is one note's planted token.
QUESTION = "Where is {token} on the grocery list?"
ONE_NOTE = "# Notes\nrouter dropped the WAN link on tuesday\n"


def raw_argv(state: Path, query: str) -> list[str]:
    """The bridge's first ``qmd search`` as one command: the query's content words (the query
    as written when it has none), ``-c`` for each collection qmd holds documents of."""
    from qmdbridge.paths import qmd_home
    from qmdbridge.qmd.index_stats import index_counts
    from qmdbridge.qmd.query_text import lexical_terms

    counts, _ = index_counts(qmd_home(state, "main").index_db)
    colls = [c for name in sorted(counts) for c in ("-c", name)]
    sent = " ".join(lexical_terms(query)) or query
    return [str(QMD), "search", "--json", "-n", "6", *colls, "--index", "index", "--", sent]


def spawned(tmp: Path, ws: Path, query: str) -> list[str]:
    """The qmd search processes of the second of two ``qmdbridge search`` runs (a wrapper
    that logs each argv stands in for qmd; its own state dir, the first run records)."""
    log = tmp / f"calls-{abs(hash((str(ws), query)))}.log"
    wrapper = tmp / "qmd-logged"
    if not wrapper.exists():
        wrapper.write_text(f'#!/bin/sh\ncase "$1" in search|vsearch|query) echo "$*" | tr "\\n" " " '
                           f'>> "$QMD_CALL_LOG"; echo >> "$QMD_CALL_LOG" ;; esac\n'
                           f'exec "{QMD}" "$@"\n')
        wrapper.chmod(0o755)
    state = tmp / f"state-spy-{ws.name}"
    if not state.exists():
        write_config(state, command=str(wrapper), timeout_ms=30_000)
    env = {**base_env(state), "QMDBRIDGE_DAEMON": "off", "QMD_CALL_LOG": str(log)}
    for _ in range(2):
        log.unlink(missing_ok=True)
        run_child(search_argv(ws, query), env=env, timeout_s=300).json()
    return log.read_text().splitlines() if log.is_file() else []


def _call(line: str) -> str:
    """``<command> <collection>: <query>`` of one logged search argv."""
    head, _, query = line.partition(" -- ")
    return f"{head.split()[0]} {head.split(' -c ')[-1].split()[0]}: {query.strip()}"


def bench_case(tmp: Path, name: str, ws: Path, query: str, *, runs: int,
               baseline: Path | None = None) -> list[Row]:
    """One case: the interleaved walls and CPU times, and the qmd processes of one search
    (``baseline``: another checkout's ``qmdbridge search`` in the same rounds)."""
    state = tmp / f"state-{ws.name}"
    if not state.exists():
        write_config(state, command=str(QMD), timeout_ms=30_000)
        run_child([*cli_argv(), "qmd", "update", "--workspace", str(ws), "--json"],
                  env={**base_env(state), "QMDBRIDGE_DAEMON": "off"}, timeout_s=900).json()
    env = {**base_env(state), "QMDBRIDGE_DAEMON": "off"}
    env.pop("QMDBRIDGE_CLI_CACHE", None)
    off = {**env, "QMDBRIDGE_CLI_CACHE": "off"}
    old_env = {**env, "PYTHONPATH": str(baseline)} if baseline is not None else None
    for e in (env, old_env):  # the first search of a command line records its settings
        if e is not None:
            first: object = run_child(search_argv(ws, query), env=e, timeout_s=300).json()
    raw_env, argv = raw_qmd_env(state), raw_argv(state, query)
    walls: dict[str, list[float]] = {k: [] for k in ("bridge", "off", "base", "raw", "floor")}
    cpus: dict[str, list[float]] = {k: [] for k in walls}
    same = True
    for _ in range(runs):
        runs_now = {"bridge": run_child(search_argv(ws, query), env=env),
                    "off": run_child(search_argv(ws, query), env=off)}
        if old_env is not None:
            runs_now["base"] = run_child(search_argv(ws, query), env=old_env)
        runs_now["raw"] = run_child(argv, env=raw_env, cwd=ws)
        runs_now["raw"].json()
        runs_now["floor"] = run_child([sys.executable, "-c", "pass"], env=env)
        same &= all(runs_now[k].stdout == runs_now["bridge"].stdout for k in ("off", "base")
                    if k in runs_now) and runs_now["bridge"].json() == first
        for k, run in runs_now.items():
            walls[k].append(run.wall_ms)
            cpus[k].append(run.cpu_ms)
    doc = first if isinstance(first, dict) else {}
    hits = len(doc.get("results", []))
    calls = spawned(tmp, ws, query)
    m, e, r = median(walls["bridge"]), median(walls["off"]), median(walls["raw"])
    rows = [
        Row(SEC, f"{name}: qmdbridge search (CLI wall)", m, "ms", "", None,
            f"{runs} runs; {hits} hits, backend {doc.get('backend')}; same bytes as the other "
            f"variants every run: {same}; CPU {median(cpus['bridge']):.0f} ms (qmd included)"),
        Row(SEC, f"{name}: qmdbridge search, QMDBRIDGE_CLI_CACHE=off (CLI wall)", e, "ms", "", None,
            f"CPU {median(cpus['off']):.0f} ms"),
    ]
    if baseline is not None:
        b = median(walls["base"])
        rows.append(Row(SEC, f"{name}: baseline qmdbridge search (CLI wall)", b, "ms", "", None,
                        f"{baseline}; CPU {median(cpus['base']):.0f} ms; this / baseline {m / b:.2f}x"))
    return [*rows,
            Row(SEC, f"{name}: raw qmd search --json (CLI wall)", r, "ms", "", None,
                f"CPU {median(cpus['raw']):.0f} ms; " + " ".join(argv[1:]).split(" --index")[0][:80]),
            Row(SEC, f"{name}: python -c pass", median(walls["floor"]), "ms"),
            Row(SEC, f"{name}: qmdbridge / raw qmd", m / r, "x", "", None,
                f"cache off / raw qmd {e / r:.2f}x"),
            Row(SEC, f"{name}: qmd processes per qmdbridge search", float(len(calls)), "",
                "", None, " | ".join(_call(c) for c in calls)[:200])]


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print its table (``--json``: one JSON document)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="30 notes, 3 runs (smoke run)")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.add_argument("--files", type=int, help="generated notes (default 300)")
    p.add_argument("--runs", type=int, help="interleaved rounds per case (default 15)")
    p.add_argument("--baseline", type=Path, metavar="DIR",
                   help="another checkout (e.g. `git worktree add DIR main`): its qmdbridge search, "
                   "run with PYTHONPATH=DIR, in the same rounds")
    args = p.parse_args(argv)
    files = args.files or (30 if args.quick else 300)
    runs = args.runs or (3 if args.quick else 15)
    if not os.access(QMD, os.X_OK):
        rows = [Row(SEC, "real qmd", None, "", "", None,
                    f"skipped: {QMD} missing; run bash scripts/install-qmd.sh")]
    else:
        compile_packages()
        with tempfile.TemporaryDirectory(prefix="bench-qmd-oneshot-") as tmp_name:
            tmp = Path(tmp_name)
            small = tmp / "one-note"
            small.mkdir()
            (small / "MEMORY.md").write_text(ONE_NOTE, encoding="utf-8")
            big = tmp / "generated"
            generate_workspace(big, files=files, file_bytes=2000)
            base = args.baseline.resolve() if args.baseline else None
            rows = [*bench_case(tmp, "1 note, 'router WAN'", small, "router WAN", runs=runs,
                                baseline=base),
                    *bench_case(tmp, f"{files} notes, one word", big, planted_token(files // 2),
                                runs=runs, baseline=base),
                    *bench_case(tmp, f"{files} notes, a question", big,
                                QUESTION.format(token=planted_token(files // 3)), runs=runs,
                                baseline=base)]
    emit("bench_qmd_oneshot", rows, as_json=args.json, meta={
        "quick": args.quick, "files": files, "runs": runs, "baseline": str(args.baseline or "")})
    return 0


if __name__ == "__main__":
    sys.exit(main())
