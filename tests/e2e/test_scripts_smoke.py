"""Smoke runs of the benchmark and eval scripts (``--quick --json``) as real processes.

They keep the scripts from rotting: each must exit 0 and print one JSON document with the
expected rows. No timing is asserted (timing belongs to the scripts themselves).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # each test runs a benchmark script as a process

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "scripts"
QMD = REPO / ".tools" / "bin" / "qmd"


def run_script(*args: str, timeout_s: float = 120) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    proc = subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env,
                          cwd=REPO, timeout=timeout_s)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def rows_by_name(doc: dict) -> dict[str, dict]:
    return {r["name"]: r for r in doc["rows"]}


def test_corpus_is_deterministic(tmp_path: Path) -> None:
    for name in ("a", "b"):
        subprocess.run([sys.executable, str(SCRIPTS / "corpus.py"), str(tmp_path / name),
                        "--files", "12", "--file-bytes", "900"], check=True, capture_output=True)
    a = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*.md"))
    b = sorted(p.relative_to(tmp_path / "b") for p in (tmp_path / "b").rglob("*.md"))
    assert a == b and len(a) == 13
    assert all((tmp_path / "a" / p).read_bytes() == (tmp_path / "b" / p).read_bytes() for p in a)
    first = (tmp_path / "a" / "memory" / "2020-01-01.md").read_text(encoding="utf-8").splitlines()
    assert first[:3] == ["# 2020-01-01", "", first[2]] and "zqaaaaa" in first[2]
    text = "".join((tmp_path / "a" / p).read_text(encoding="utf-8") for p in a)
    assert any("\u3040" <= ch <= "\u9fff" for ch in text)

def test_bench_fallback_quick() -> None:
    doc = run_script(str(SCRIPTS / "bench_fallback.py"), "--quick", "--json",
                     "--sections", "scale,live", "--live-files", "10", timeout_s=180)
    rows = rows_by_name(doc)
    assert doc["title"] == "bench_fallback"
    assert rows["planted token found in its note"]["ok"] is True
    assert rows["full FTS index"]["unit"] == "s" and rows["full FTS index"]["value"] > 0
    assert rows["qmdbridge search CLI wall (median)"]["value"] > 0
    assert rows["peak RSS: CLI search process"]["value"] > 10
    assert rows["search errors during re-syncs"]["ok"] is True


def test_bench_qmd_quick() -> None:
    doc = run_script(str(SCRIPTS / "bench_qmd.py"), "--quick", "--json", "--files", "10",
                     "--runs", "1", timeout_s=180)
    rows = rows_by_name(doc)
    if not os.access(QMD, os.X_OK):
        assert rows["real qmd"]["note"].startswith("skipped:")
        return
    assert rows["overhead qmd mode / raw qmd (long-lived)"]["value"] > 0
    assert rows["spawning manager / raw qmd"]["value"] > 0
    # the question asked through the warm child: one call per collection, none spawned
    assert rows["manager.search, qmd mode, a question (long-lived, warm qmd mcp child)"]["note"].endswith(
        "(one per collection), 0 spawned instead")
    # one search call per collection qmd holds documents of (MEMORY.md and memory/)
    assert rows["qmd processes per qmdbridge search"]["value"] == 2
    assert "answered by ['builtin']" in rows["fallback answer, hanging qmd (in-process)"]["note"]
    assert rows["hang stand-in processes left alive"]["ok"] is True


def test_bench_qmd_oneshot_quick() -> None:
    doc = run_script(str(SCRIPTS / "bench_qmd_oneshot.py"), "--quick", "--json", "--files", "10",
                     "--runs", "1", timeout_s=300)
    rows = rows_by_name(doc)
    if not os.access(QMD, os.X_OK):
        assert rows["real qmd"]["note"].startswith("skipped:")
        return
    one = "1 note, 'router WAN'"
    assert "same bytes as the other variants every run: True" in rows[f"{one}: qmdbridge search (CLI wall)"]["note"]
    # the note is found by the content words ANDed: no word is searched alone
    assert rows[f"{one}: qmd processes per qmdbridge search"]["value"] == 1
    # a question: one lex call per collection (memory folder and MEMORY.md)
    assert rows["10 notes, a question: qmd processes per qmdbridge search"]["value"] <= 2


@pytest.mark.parametrize("mode", ["keyword"])
def test_eval_quick(mode: str) -> None:
    doc = run_script(str(SCRIPTS / "eval.py"), "--quick", "--json", "--modes", mode)
    rows = rows_by_name(doc)
    assert doc["meta"]["queries"] == 42
    assert rows["keyword (19 queries) Hit@1"]["value"] == 1.0
    assert rows["cjk (7 queries) Hit@3"]["value"] == 1.0
    assert rows["paraphrases sharing a keyword with their answer"]["ok"] is True


def test_bench_text_quick() -> None:
    doc = run_script(str(SCRIPTS / "bench_text.py"), "--quick", "--json")
    rows = rows_by_name(doc)
    assert doc["title"] == "bench_text" and doc["meta"]["mb"] == 0.1
    assert rows["text_weight over every line"]["unit"] == "ms"
    assert rows["text_weight over every line"]["value"] > 0
    assert rows["lines with CJK"]["value"] > 0
    assert rows["total text_weight"]["value"] > 100_000


def test_bench_daemon_quick() -> None:
    doc = run_script(str(SCRIPTS / "bench_daemon.py"), "--quick", "--json", "--files", "10",
                     "--runs", "1", timeout_s=240)
    rows = rows_by_name(doc)
    served = rows["qmdbridge search, served by the daemon (CLI wall)"]
    assert served["value"] > 0 and served["note"].endswith("right note every run: True")
    assert rows["qmdbridge search, no daemon (CLI wall)"]["note"] == "right note every run: True"
    assert rows["qmdbridge search, no daemon, cache off: the engine (CLI wall)"]["note"].endswith(
        "same hits as the fast path every run: True")
    assert rows["daemon exit code after SIGTERM"]["ok"] is True
    assert rows["mcp server exit code after SIGTERM"]["ok"] is True
    assert rows["tools/list + memory_search, initialised session"]["note"].endswith("top hit True")
    if os.access(QMD, os.X_OK):
        assert rows["qmd search --json (CLI wall)"]["note"] == "right note every run: True"
        warm = rows["our warm child: QmdBackend.search (in-process)"]
        assert warm["value"] > 0 and warm["note"].endswith(
            "right note every run: True; all answered by the child: True")
        assert rows["warm child start-up (spawn to initialize)"]["note"] == "qmd 2.8.3, stdio, restarts 0"
        for name in ("qmd's own MCP: the same tool call, bare JSON-RPC POST",
                     "qmd's own MCP over stdio: the same call, our client (ClientSession over our pipes)",
                     "spawn per call: qmd search --json (CLI wall)",
                     "spawn per call: qmd query --json --no-rerank (CLI wall)"):
            assert "right note every run: True" in rows[name]["note"], name


def test_bench_watch_quick() -> None:
    doc = run_script(str(SCRIPTS / "bench_watch.py"), "--quick", "--json")
    rows = rows_by_name(doc)
    assert doc["title"] == "bench_watch" and doc["meta"]["packages"] == 20
    assert rows["watcher listing"]["value"] == 62  # 50 notes, 10 topic folders, notes/, the root
    assert rows["watchdog defaults"]["value"] > 1000  # node_modules, .venv and .git walked
    assert rows["watcher listing (skip list, depth, lstat)"]["unit"] == "ms CPU"


@pytest.mark.parametrize(("flags", "unit"), [((), "ms"), (("--cpu",), "ms CPU")])
def test_bench_keyword_quick(tmp_path: Path, flags: tuple[str, ...], unit: str) -> None:
    # A made-up conversation in the LoCoMo layout (the real data is read from shared/ only).
    conv = {
        "speaker_a": "Ann", "speaker_b": "Bob",
        "session_1_date_time": "1:56 pm on 8 May, 2023",
        "session_1": [{"speaker": "Ann", "dia_id": "D1:1", "text": "I joined a pottery class."},
                      {"speaker": "Bob", "dia_id": "D1:2", "text": "Nice! What did you make?"}],
        "session_2_date_time": "10:00 am on 9 May, 2023",
        "session_2": [{"speaker": "Ann", "dia_id": "D2:1", "text": "A bowl for my mother."}],
        "qa": [{"question": "What class did Ann join?", "evidence": ["D1:1"], "category": 4},
               {"question": "What did Ann make?", "evidence": ["D2:1"], "category": 4}],
    }
    (tmp_path / "conv-x.json").write_text(json.dumps(conv), encoding="utf-8")
    doc = run_script(str(SCRIPTS / "bench_keyword.py"), "--quick", "--json", *flags, "--data",
                     str(tmp_path), "--files", "5", timeout_s=180)
    assert doc["title"] == "bench_keyword"
    rows = {(r["section"], r["name"]): r for r in doc["rows"]}
    locomo = rows[("locomo conv-x", "keyword search p50")]
    assert locomo["value"] > 0 and locomo["unit"] == unit
    assert rows[("locomo conv-x", "manager search p50 (BlockingMemoryManager)")]["unit"] == unit
    assert rows[("locomo conv-x", "full index (keyword-only)")]["note"] == "2 chunks, 2 queries"
    assert rows[("corpus 5x20000", "bare FTS5 query p50")]["value"] > 0
    assert rows[("locomo conv-x", "its SQL statements p50")]["value"] > 0
    assert rows[("corpus 5x20000", "engine search p50 (end to end)")]["value"] > 0
