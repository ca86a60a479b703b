"""The eval runner as a library: the real MemoryManager over real SQLite stores in temporary
folders, on the made-up conversation and query set of ``eval_synthetic`` (hand-checked values)."""

from __future__ import annotations

import json
import sqlite3
import tempfile
from pathlib import Path

import pytest

from fallback.errors import UsageError
from qmdbridge.config import OpenClawConfig, parse_config
from qmdbridge.evaluation.queries import load_queries
from qmdbridge.evaluation.runner import (
    EvalOptions,
    backend_tally,
    check_options,
    eval_agent,
    run_locomo,
    run_queries,
)
from tests.qmdbridge.eval_synthetic import LOCOMO_CATEGORIES, LOCOMO_R, write_locomo, write_query_workspace

KEYWORD = EvalOptions(provider="none")


@pytest.fixture
def private_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Route ``tempfile`` into a folder of the test, so "nothing left behind" can be checked."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


@pytest.mark.anyio
async def test_locomo_run_hand_checked(tmp_path: Path, private_tmp: Path) -> None:
    data = tmp_path / "data"
    write_locomo(data)
    report = await run_locomo(data, cfg=OpenClawConfig(), options=KEYWORD)
    doc = report.to_json_dict()
    m = doc["metrics"]
    assert (m["questions"], m["evidence"], m["hits"]) == (5, 7, 4)
    assert [m[k] for k in ("recallAt1", "recallAt3", "recallAt5", "recallAt10", "fileRecallAt5",
                           "fileRecallAt10", "snippetRecallAt5")] == [pytest.approx(LOCOMO_R)] * 7
    assert m["snippetEvidence"] == 7 and m["linesPerHit"] == 4.0
    assert list(m["perCategory"]) == ["multi-hop", "temporal", "open-domain", "single-hop"]
    assert m["perCategory"] == {k: {**v, "recallAt5": pytest.approx(v["recallAt5"])}
                                for k, v in LOCOMO_CATEGORIES.items()}
    assert 0 < m["searchP50Ms"] <= m["searchP95Ms"]
    assert (doc["dataset"], doc["backend"], doc["provider"], doc["mode"]) == ("locomo", "builtin", "none", "fts-only")
    assert (doc["maxResults"], doc["minScore"], doc["warnings"]) == (10, 0.35, [])
    assert doc["inputs"] == [str(data / "conv-syn.json")]
    assert (doc["answeredBy"], doc["fallbacks"], doc["firstFallbackReason"], doc["allFellBack"]) == (
        {"qmd": 0, "builtin": 5}, 0, None, False)
    [ws] = doc["workspaces"]
    assert {k: ws[k] for k in ("name", "files", "chunks", "questions", "evidence", "answeredBy", "fallbacks",
                               "firstFallbackReason")} == {
        "name": "conv-syn", "files": 3, "chunks": 3, "questions": 5, "evidence": 7,
        "answeredBy": {"qmd": 0, "builtin": 5}, "fallbacks": 0, "firstFallbackReason": None}
    assert list(private_tmp.iterdir()) == []  # workspaces and stores are gone


@pytest.mark.anyio
async def test_queries_run_hand_checked(tmp_path: Path, private_tmp: Path) -> None:
    ws, queries = write_query_workspace(tmp_path)
    before = sorted(p.relative_to(ws) for p in ws.rglob("*"))
    elsewhere = tmp_path / "configured-store"
    cfg = parse_config({"agents": {"defaults": {"memorySearch": {
        "store": {"path": str(elsewhere / "{agentId}.sqlite")}}}}})
    report = await run_queries(queries, ws, cfg=cfg, options=EvalOptions(provider="none", min_score=0.0))
    m = report.metrics
    assert (m.questions, m.evidence, m.hits) == (4, 4, 4)
    assert (m.recall_at1, m.recall_at5, m.recall_at10) == (0.75, 0.75, 0.75)
    assert (m.file_recall_at5, m.file_recall_at10) == (1.0, 1.0)
    assert m.snippet_recall_at5 == pytest.approx(2 / 3) and m.snippet_evidence == 3
    assert m.lines_per_hit == 2.5
    assert {k: v.model_dump(by_alias=True) for k, v in m.per_category.items()} == {
        "garden": {"questions": 2, "evidence": 2, "recallAt5": 0.5}}
    assert report.min_score == 0.0 and report.dataset == "queries" and report.inputs == [str(queries)]
    assert sorted(p.relative_to(ws) for p in ws.rglob("*")) == before  # the workspace is only read
    assert not elsewhere.exists()  # the configured store is never touched
    assert list(private_tmp.iterdir()) == []


@pytest.mark.anyio
async def test_queries_without_text_report_null_snippet_recall(tmp_path: Path, private_tmp: Path) -> None:
    ws, _ = write_query_workspace(tmp_path)
    queries = tmp_path / "plain.jsonl"
    queries.write_text(json.dumps({"query": "bicycle", "path": "memory/projects.md", "line": 5}) + "\n",
                       encoding="utf-8")
    report = await run_queries(queries, ws, cfg=OpenClawConfig(), options=KEYWORD)
    doc = report.to_json_dict()["metrics"]
    assert doc["snippetRecallAt5"] is None and doc["snippetEvidence"] == 0
    assert doc["recallAt1"] == 1.0 and doc["perCategory"] == {}


@pytest.mark.parametrize(("line", "message"), [
    ("{not json", "queries.jsonl:1: not valid JSON"),
    ('{\n  "queries": [{"query": "x", "path": "memory/projects.md"}]\n}',  # one JSON document
     'queries.jsonl:1: not valid JSON (--queries reads JSON Lines: one {"query", "path", ...} object per line): '
     "Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"),
    ("[1]", "queries.jsonl:1: each line must be a JSON object"),
    ('{"query": "x", "path": "memory/projects.md", "lines": 3}',
     "queries.jsonl:1: unknown key 'lines' (allowed: query, path, line, text, category, id)"),
    ('{"query": " ", "path": "memory/projects.md"}', "queries.jsonl:1: 'query' must be a non-empty string"),
    ('{"query": "x"}', "queries.jsonl:1: 'path' must be a workspace-relative path"),
    ('{"query": "x", "path": "/etc/passwd"}', "'path' must be relative to the workspace, not '/etc/passwd'"),
    ('{"query": "x", "path": "memory/nope.md"}', "'path' 'memory/nope.md' is not a file in the workspace"),
    ('{"query": "x", "path": "memory/projects.md", "line": 0}', "'line' must be a 1-based line number"),
    ('{"query": "x", "path": "memory/projects.md", "line": true}', "'line' must be a 1-based line number"),
    ('{"query": "x", "path": "memory/projects.md", "line": 6}',
     "queries.jsonl:1: 'line' 6 is past the end of memory/projects.md (5 lines)"),
    ('{"query": "x", "path": "memory/projects.md", "text": ""}', "'text' must be a non-empty string"),
    ('{"query": "x", "path": "memory/projects.md", "category": [1]}', "'category' must be a string or a number"),
])
def test_bad_query_lines_are_named(tmp_path: Path, line: str, message: str) -> None:
    ws, _ = write_query_workspace(tmp_path)
    queries = tmp_path / "queries.jsonl"
    queries.write_text(line + "\n", encoding="utf-8")
    with pytest.raises(UsageError) as info:
        load_queries(queries, ws)
    assert message in str(info.value)


def test_query_file_edge_cases(tmp_path: Path) -> None:
    ws, queries = write_query_workspace(tmp_path)
    loaded = load_queries(queries, ws)
    assert [q.ref for q in loaded] == [f"{queries}:{n}" for n in (1, 2, 4, 5)]  # line 3 is blank
    assert loaded[2].evidence[0].line is None and loaded[2].category is None
    (tmp_path / "blank.jsonl").write_text("\n \n", encoding="utf-8")
    with pytest.raises(UsageError, match="no queries in"):
        load_queries(tmp_path / "blank.jsonl", ws)
    with pytest.raises(UsageError, match="cannot read queries file"):
        load_queries(tmp_path / "missing.jsonl", ws)
    dotted = tmp_path / "dotted.jsonl"
    dotted.write_text('{"query": "x", "path": "./memory/projects.md", "category": 2, "id": 7}\n', encoding="utf-8")
    [q] = load_queries(dotted, ws)
    assert (q.evidence[0].path, q.category, q.ref) == ("memory/projects.md", "2", "7")


def test_eval_agent_overrides_provider_model_and_store(tmp_path: Path) -> None:
    cfg = parse_config({"agents": {"defaults": {"memorySearch": {
        "provider": "openai", "store": {"path": "/somewhere/{agentId}.sqlite"},
        "query": {"minScore": 0.2}}}}})
    ws, state = tmp_path / "ws", tmp_path / "state"
    agent = eval_agent(cfg, agent_id=None, workspace=ws, state_dir=state, options=EvalOptions())
    assert agent.memory_search.provider == "openai" and agent.memory_search.query.min_score == 0.2
    assert agent.engine.db_path == (state / "memory" / "main.sqlite").resolve()
    assert agent.workspace_dir == ws.resolve() and agent.state_dir == state.resolve()
    local = eval_agent(cfg, agent_id=None, workspace=ws, state_dir=state,
                       options=EvalOptions(model_path="/models/m.gguf"))
    assert (local.memory_search.provider, local.memory_search.local.model_path) == ("local", "/models/m.gguf")
    assert local.engine.search.provider == "local"
    none = eval_agent(cfg, agent_id=None, workspace=ws, state_dir=state, options=EvalOptions(provider="none"))
    assert none.engine.search.provider == "none"
    with pytest.raises(UsageError, match="--model is the local GGUF model; it does not apply to provider gemini"):
        eval_agent(cfg, agent_id=None, workspace=ws, state_dir=state,
                   options=EvalOptions(provider="gemini", model_path="/m.gguf"))
    with pytest.raises(UsageError, match="unknown embedding provider 'bert' \\(one of: auto, none, openai"):
        eval_agent(cfg, agent_id=None, workspace=ws, state_dir=state, options=EvalOptions(provider="bert"))


def test_eval_agent_on_qmd_overrides_the_search_mode_and_keeps_memory_qmd(tmp_path: Path) -> None:
    cfg = parse_config({"memory": {"backend": "builtin", "qmd": {
        "searchMode": "query", "limits": {"maxResults": 4, "timeoutMs": 9000}}}})
    ws, state = tmp_path / "ws", tmp_path / "state"
    kept = eval_agent(cfg, agent_id=None, workspace=ws, state_dir=state, options=EvalOptions(backend="qmd"))
    assert (kept.memory.qmd.search_mode, kept.memory.qmd.limits.max_results) == ("query", 4)
    agent = eval_agent(cfg, agent_id=None, workspace=ws, state_dir=state,
                       options=EvalOptions(backend="qmd", qmd_search_mode="vsearch"))
    assert agent.memory.qmd.search_mode == "vsearch"
    assert (agent.memory.qmd.limits.max_results, agent.memory.qmd.limits.timeout_ms) == (4, 9000)
    assert agent.state_dir == state.resolve()  # the qmd home is <state>/agents/main/qmd
    assert cfg.memory.qmd.search_mode == "query"  # the loaded config is not changed


@pytest.mark.parametrize(("options", "message"), [
    (EvalOptions(backend="qmd", provider="none"),
     "--provider applies to the builtin engine (its embedding provider); qmd embeds with its own models"),
    (EvalOptions(backend="qmd", model_path="/m.gguf"), "--model applies to the builtin engine"),
    (EvalOptions(backend="qmd", provider="local", model_path="/m.gguf"), "--provider and --model apply to"),
    (EvalOptions(qmd_search_mode="search"), "--qmd-search-mode applies to --backend qmd"),
    (EvalOptions(backend="lucene"), "unknown backend 'lucene' (one of: builtin, qmd)"),  # type: ignore[arg-type]
    (EvalOptions(backend="qmd", qmd_search_mode="hybrid"),  # type: ignore[arg-type]
     "unknown qmd search mode 'hybrid' (one of: search, vsearch, query)"),
])
def test_options_of_the_other_backend_are_usage_errors(tmp_path: Path, options: EvalOptions,
                                                        message: str) -> None:
    with pytest.raises(UsageError) as info:
        check_options(options)
    assert message in str(info.value)
    with pytest.raises(UsageError):
        eval_agent(OpenClawConfig(), agent_id=None, workspace=tmp_path, state_dir=tmp_path, options=options)


def test_backend_tally_counts_answers_and_keeps_the_first_fallback_reason() -> None:
    answers = [("qmd", None), ("builtin", "qmd search timed out"), ("qmd", None), ("builtin", "circuit open")]
    assert backend_tally(answers) == {"answered_by": {"qmd": 2, "builtin": 2}, "fallbacks": 2,
                                      "first_fallback_reason": "qmd search timed out"}
    assert backend_tally([("qmd", None)] * 3 + answers) == {
        "answered_by": {"qmd": 5, "builtin": 2}, "fallbacks": 2, "first_fallback_reason": "qmd search timed out"}
    # the builtin engine measured: an answer, no fallback
    assert backend_tally([("builtin", None)]) == {"answered_by": {"qmd": 0, "builtin": 1}, "fallbacks": 0,
                                                  "first_fallback_reason": None}


@pytest.mark.anyio
async def test_bad_limits_and_inputs(tmp_path: Path) -> None:
    write_locomo(tmp_path / "data")
    with pytest.raises(UsageError, match="max results must be between 1 and 2147483647"):
        await run_locomo(tmp_path / "data", cfg=OpenClawConfig(), options=EvalOptions(max_results=0))
    with pytest.raises(UsageError, match="max results must be between 1 and 2147483647"):
        check_options(EvalOptions(max_results=2**31))  # refused before any index is built, as a search refuses it
    with pytest.raises(UsageError, match="min score must be between 0 and 1"):
        await run_locomo(tmp_path / "data", cfg=OpenClawConfig(), options=EvalOptions(min_score=1.5))
    with pytest.raises(UsageError, match=r"workspace does not exist: .*nowhere \(create it, pass --workspace"):
        await run_queries(tmp_path / "q.jsonl", tmp_path / "nowhere", cfg=OpenClawConfig())
    empty = tmp_path / "empty" / "conv.json"
    empty.parent.mkdir()
    empty.write_text(json.dumps({"speaker_a": "A", "qa": []}), encoding="utf-8")
    with pytest.raises(UsageError, match="no question with evidence in"):
        await run_locomo(empty, cfg=OpenClawConfig(), options=KEYWORD)


@pytest.mark.local_model
@pytest.mark.anyio
async def test_hybrid_with_the_local_model(tmp_path: Path, private_tmp: Path, local_model_path: Path) -> None:
    write_locomo(tmp_path / "data")
    report = await run_locomo(tmp_path / "data", cfg=OpenClawConfig(),
                              options=EvalOptions(model_path=str(local_model_path)))
    assert (report.provider, report.mode) == ("local", "hybrid")
    assert (report.metrics.questions, report.metrics.evidence) == (5, 7)
    assert list(private_tmp.iterdir()) == []


def _chunk_rows(db: Path) -> list[tuple[int, str, int]]:
    with sqlite3.connect(db) as conn:
        return conn.execute("SELECT rowid, id, updated_at FROM chunks ORDER BY rowid").fetchall()


@pytest.mark.anyio
async def test_cache_dir_keeps_each_store_for_the_next_run(tmp_path: Path, private_tmp: Path) -> None:
    write_locomo(tmp_path / "data")
    cache = tmp_path / "cache"
    options = EvalOptions(provider="none", cache_dir=cache)
    first = await run_locomo(tmp_path / "data", cfg=OpenClawConfig(), options=options)
    db = cache / "conv-syn" / "memory" / "main.sqlite"
    rows = _chunk_rows(db)
    assert len(rows) == 3
    second = await run_locomo(tmp_path / "data", cfg=OpenClawConfig(), options=options)
    # the second run's workspace is a new temporary folder with the same notes: the sync finds
    # every chunk unchanged (same rows, same write times), nothing is written or embedded again
    assert _chunk_rows(db) == rows
    assert second.metrics.recall_at5 == first.metrics.recall_at5 == pytest.approx(LOCOMO_R)
    assert list(private_tmp.iterdir()) == []  # the workspaces are still temporary


def test_cache_dir_names_are_safe_folder_names(tmp_path: Path) -> None:
    options = EvalOptions(cache_dir=tmp_path / "cache")
    assert options.state_dir("conv-26", tmp_path / "x") == tmp_path / "cache" / "conv-26"
    assert options.state_dir("conv 26#2/../x", tmp_path / "x") == tmp_path / "cache" / "conv_26_2_.._x"
    assert EvalOptions().state_dir("conv-26", tmp_path / "x") == tmp_path / "x" / "state"


def test_query_lines_end_at_newlines_only(tmp_path: Path) -> None:
    # JSON allows U+2028, U+2029 and U+0085 unescaped inside a string (json.dumps with
    # ensure_ascii=False writes them raw): they are part of the line, not line ends
    ws, _ = write_query_workspace(tmp_path)
    queries = tmp_path / "raw.jsonl"
    rows = [{"query": "Atlas\u2028rollback", "path": "memory/projects.md"},
            {"query": "cron\x85jobs\u2029x", "path": "memory/projects.md", "category": 2}]
    queries.write_text("\r\n".join(json.dumps(r, ensure_ascii=False) for r in rows) + "\r\n", encoding="utf-8")
    loaded = load_queries(queries, ws)
    assert [(q.query, q.ref, q.category) for q in loaded] == [
        ("Atlas\u2028rollback", f"{queries}:1", None), ("cron\x85jobs\u2029x", f"{queries}:2", "2")]
