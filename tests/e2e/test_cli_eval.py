"""``qmdbridge eval`` (run in this process) on the made-up LoCoMo conversation and query set
(``tests/qmdbridge/eval_synthetic.py``): parsed JSON with every key, the text report, exit codes,
and nothing left in the temporary folder or the state dir."""

from __future__ import annotations

import subprocess
from pathlib import Path

import orjson
import pytest

from tests.e2e.cli_proc import run_cli_in_process
from tests.qmdbridge.eval_synthetic import LOCOMO_CATEGORIES, LOCOMO_R, write_locomo, write_query_workspace

METRIC_KEYS = {"questions", "evidence", "hits", "recallAt1", "recallAt3", "recallAt5", "recallAt10",
               "fileRecallAt5", "fileRecallAt10", "snippetRecallAt5", "snippetEvidence", "linesPerHit",
               "searchP50Ms", "searchP95Ms", "perCategory"}
REPORT_KEYS = {"dataset", "inputs", "backend", "provider", "model", "mode", "maxResults", "minScore",
               "indexMs", "metrics", "workspaces", "warnings", "answeredBy", "fallbacks", "firstFallbackReason",
               "longLived", "warmCalls", "allFellBack", "misses"}
WORKSPACE_KEYS = {"name", "source", "files", "chunks", "questions", "evidence", "recallAt5", "indexMs",
                  "answeredBy", "fallbacks", "firstFallbackReason"}


@pytest.fixture
def env(env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    """The clean environment of ``conftest.py`` with its own ``TMPDIR`` (the eval's
    throw-away stores go there, so a test can see they are removed)."""
    e = dict(env)
    e["TMPDIR"] = str(tmp_path / "tmp")
    (tmp_path / "tmp").mkdir()
    return e


def run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[bytes]:
    """``qmdbridge <args>`` run in this process."""
    return run_cli_in_process(args, env)


def test_help_names_both_forms_and_exit_codes(env: dict[str, str]) -> None:
    p = run(["eval", "--help"], env)
    assert p.returncode == 0
    out = p.stdout.decode()
    assert out.startswith("usage: qmdbridge eval")
    for flag in ("--locomo PATH", "--queries FILE", "--max-results N", "--min-score X", "--provider NAME",
                 "--model PATH", "--backend {builtin,qmd}", "--qmd-search-mode {search,vsearch,query}",
                 "--workspace DIR", "--misses N", "--json", "exit codes", "eval --backend qmd exits 1"):
        assert flag in out, flag
    assert "eval" in run(["--help"], env).stdout.decode()


def test_locomo_json(tmp_path: Path, env: dict[str, str]) -> None:
    write_locomo(tmp_path / "data")
    p = run(["eval", "--locomo", str(tmp_path / "data"), "--provider", "none", "--json"], env)
    assert p.returncode == 0, p.stderr
    assert p.stderr == b""  # no progress bar when stderr is not a terminal
    doc = orjson.loads(p.stdout)
    assert set(doc) == REPORT_KEYS and set(doc["metrics"]) == METRIC_KEYS
    m = doc["metrics"]
    assert (m["questions"], m["evidence"], m["hits"], m["linesPerHit"]) == (5, 7, 4, 4.0)
    for key in ("recallAt1", "recallAt5", "recallAt10", "fileRecallAt5", "snippetRecallAt5"):
        assert m[key] == pytest.approx(LOCOMO_R), key
    assert m["perCategory"] == {k: {**v, "recallAt5": pytest.approx(v["recallAt5"])}
                                for k, v in LOCOMO_CATEGORIES.items()}
    assert (doc["backend"], doc["provider"], doc["mode"], doc["maxResults"]) == ("builtin", "none", "fts-only", 10)
    assert (doc["answeredBy"], doc["fallbacks"], doc["allFellBack"]) == ({"qmd": 0, "builtin": 5}, 0, False)
    assert set(doc["workspaces"][0]) == WORKSPACE_KEYS
    assert list((tmp_path / "tmp").iterdir()) == []
    assert not (tmp_path / "state").exists()


def test_locomo_cache_dir_keeps_the_index(tmp_path: Path, env: dict[str, str]) -> None:
    write_locomo(tmp_path / "data")
    args = ["eval", "--locomo", str(tmp_path / "data"), "--provider", "none", "--json",
            "--cache-dir", str(tmp_path / "cache")]
    first, second = run(args, env), run(args, env)
    assert first.returncode == second.returncode == 0, first.stderr + second.stderr
    m1, m2 = orjson.loads(first.stdout)["metrics"], orjson.loads(second.stdout)["metrics"]
    assert m1["recallAt5"] == m2["recallAt5"] == pytest.approx(LOCOMO_R)
    assert (tmp_path / "cache" / "conv-syn" / "memory" / "main.sqlite").is_file()
    assert list((tmp_path / "tmp").iterdir()) == []


def test_locomo_text_report(tmp_path: Path, env: dict[str, str]) -> None:
    data = write_locomo(tmp_path / "data")
    p = run(["eval", "--locomo", str(data), "--provider", "none", "--max-results", "3"], env)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.decode().splitlines()
    assert lines[0] == "LoCoMo eval: 1 workspace(s), 5 questions, 7 evidence items"
    assert lines[1] == "backend builtin, mode fts-only, provider none; maxResults 3, minScore 0.35"
    assert lines[2] == ""  # the builtin engine measured: no "answered:" line
    assert "R@5           0.714" in lines and "file R@10     0.714" in lines
    assert "snippet R@5   0.714 (7 items with text)" in lines and "lines/hit     4.0" in lines
    assert "  open-domain   0.000  (1 questions, 1 evidence items)" in lines
    assert "  single-hop    0.667  (2 questions, 3 evidence items)" in lines


def test_queries_json(tmp_path: Path, env: dict[str, str]) -> None:
    ws, queries = write_query_workspace(tmp_path)
    p = run(["eval", "--queries", str(queries), "--workspace", str(ws), "--provider", "none",
             "--min-score", "0", "--json"], env)
    assert p.returncode == 0, p.stderr
    doc = orjson.loads(p.stdout)
    m = doc["metrics"]
    assert set(doc) == REPORT_KEYS and set(m) == METRIC_KEYS
    assert (m["recallAt1"], m["recallAt10"], m["fileRecallAt5"], m["linesPerHit"]) == (0.75, 0.75, 1.0, 2.5)
    assert m["snippetRecallAt5"] == pytest.approx(2 / 3)
    assert m["perCategory"] == {"garden": {"questions": 2, "evidence": 2, "recallAt5": 0.5}}
    assert (doc["dataset"], doc["minScore"], doc["workspaces"][0]["name"]) == ("queries", 0.0, "ws")
    # the one miss: line 5 of projects.md, while the only hit was its first section
    assert doc["misses"] == [{
        "workspace": "ws", "query": "zucchini netting", "ref": f"{queries}:2", "category": "garden",
        "expected": [{"path": "memory/projects.md", "line": 5, "ref": None}],
        "returned": [{"path": "memory/projects.md", "startLine": 1, "endLine": 3, "score": 1.0}]}]
    text = run(["eval", "--queries", str(queries), "--workspace", str(ws), "--provider", "none",
                "--min-score", "0", "--misses", "3"], env).stdout.decode()
    assert text.endswith(f"\nmisses: 1 of 1 questions shown (R@5 missed them)\n[ws {queries}:2] "
                         "zucchini netting\n  expected memory/projects.md:5\n"
                         "  got 1. memory/projects.md:1-3 1.000\n")
    assert list((tmp_path / "tmp").iterdir()) == []
    assert not (tmp_path / "state").exists()


@pytest.mark.parametrize(("args", "message"), [
    (["--queries", "{q}"], "--queries needs --workspace"),
    (["--locomo", "{data}", "--workspace", "{ws}"], "--workspace applies to --queries"),
    (["--locomo", "{missing}"], "LoCoMo path does not exist"),
    (["--queries", "{bad}", "--workspace", "{ws}"], "bad.jsonl:1: unknown key 'lines'"),
    (["--locomo", "{data}", "--provider", "openai", "--model", "/m.gguf"], "--model is the local GGUF model"),
    (["--locomo", "{data}", "--max-results", "0"], "max results must be between 1 and 2147483647"),
    (["--locomo", "{data}", "--backend", "qmd", "--provider", "none"],
     "--provider applies to the builtin engine (its embedding provider); qmd embeds with its own models"),
    (["--queries", "{q}", "--workspace", "{ws}", "--backend", "qmd", "--model", "/m.gguf"],
     "--model applies to the builtin engine"),
    (["--locomo", "{data}", "--qmd-search-mode", "query"], "--qmd-search-mode applies to --backend qmd"),
])
def test_usage_errors_exit_2_with_a_json_error(tmp_path: Path, env: dict[str, str], args: list[str],
                                                message: str) -> None:
    ws, queries = write_query_workspace(tmp_path)
    data = write_locomo(tmp_path / "data")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"query": "x", "path": "memory/projects.md", "lines": 2}\n', encoding="utf-8")
    values = {"q": str(queries), "data": str(data), "ws": str(ws), "missing": str(tmp_path / "missing"),
              "bad": str(bad)}
    argv = ["eval", *(a.format(**values) for a in args)]
    p = run([*argv, "--json"], env)
    assert p.returncode == 2, p.stderr
    doc = orjson.loads(p.stdout)
    assert doc["errorType"] == "UsageError" and doc["exitCode"] == 2 and message in doc["error"]
    plain = run(argv, env)
    assert plain.returncode == 2 and plain.stdout == b""
    assert plain.stderr.decode().startswith("qmdbridge: ") and message in plain.stderr.decode()
    assert b"Traceback" not in plain.stderr


def test_a_source_is_required(env: dict[str, str]) -> None:
    p = run(["eval", "--json"], env)
    assert p.returncode == 2
    assert "one of the arguments --locomo --queries is required" in orjson.loads(p.stdout)["error"]
    p = run(["eval", "--locomo", "a", "--queries", "b"], env)
    assert p.returncode == 2 and b"not allowed with argument" in p.stderr
    p = run(["eval", "--locomo", "a", "--backend", "lucene"], env)
    assert p.returncode == 2 and b"argument --backend: invalid choice: 'lucene'" in p.stderr
