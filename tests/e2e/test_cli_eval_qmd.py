"""``qmdbridge eval --backend qmd`` (run in this process) with the real qmd (``.tools/bin/qmd``) on the
made-up LoCoMo conversation and query set (``tests/qmdbridge/eval_synthetic.py``), each with one
more question whose words are not all in one note, so qmd's ``search`` (an AND of every word)
finds it only through the bridge's relaxed pass (``qmdbridge/qmd/lexical.py``).

What qmd finds (qmd 2.8.3, ``search`` mode, the query's content words ANDed, then each word
alone when that leaves free slots; hits checked by hand). qmd's own snippet lines are in the
third column; every note is shorter than the chunk budget, so the bridge's passage
(``qmdbridge/qmd/passages.py``) makes each hit the whole note, or its Markdown section
(projects.md: "# Garden" lines 1-3, "# Garage" lines 4-5):

    LoCoMo   "Quillon beagle harbour shelter"  memory/2024-03-03.md    lines 2-4
             "trombone recital Vellmar"        memory/2024-03-03-2.md  lines 2-4
             "zaffre vase"                     memory/2024-04-12.md    lines 2-4
             "saxophone lessons"               no hit (no note holds either word)
             "Marisol cousin"                  memory/2024-03-03-2.md  lines 3-4
             "Which orchard picnic?"           memory/2024-03-03.md    lines 3-4: "which" is a
                                               stop word; as written qmd found nothing
    queries  "zucchini netting"                memory/projects.md      lines 1-4
             "lantern oil"                     memory/2024-05-01.md    lines 1-2
             "bicycle chain"                   memory/projects.md      lines 4-5
             "zucchini netting tomorrow"       memory/projects.md      lines 1-4: no note holds
                                               "tomorrow", the relaxed pass finds the note

So LoCoMo: 6 questions, 8 evidence turns, 6 found at rank 1 (R@k = file R@k = snippet R@5 =
6/8; single-hop 3 of 4), five hits of four lines (the notes). Queries: R@k 4/5 (the second
"zucchini netting" asks for line 5, the Garage section), file R@5 5/5, snippet R@5 2/3 (one
text is in no note), one hit each, of 3, 3, 2, 2 and 3 lines (lines/hit 2.6), garden R@5 2/3.
Sent as written, the two questions of the last rows found nothing (LoCoMo R@k 5/8, queries
3/5).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import orjson
import pytest

from tests.e2e.cli_proc import run_cli_in_process
from tests.qmdbridge.eval_synthetic import locomo_sample, write_query_workspace

pytestmark = pytest.mark.qmd

REPO = Path(__file__).resolve().parents[2]
LAUNCHER = REPO / ".tools" / "bin" / "qmd"
# qmd's answers to the LoCoMo conversation (module docstring).
LOCOMO_QMD_R = 6 / 8
AND_MISS_QA = {"question": "Which orchard picnic?", "answer": "the orchard", "evidence": ["D1:2"], "category": 4}
AND_MISS_QUERY = {"query": "zucchini netting tomorrow", "path": "memory/projects.md", "line": 2,
                  "category": "garden"}


@pytest.fixture
def launcher() -> Path:
    """The real qmd launcher; skips without it, fails when ``CI`` is set."""
    if not os.access(LAUNCHER, os.X_OK):
        message = f"real qmd not installed at {LAUNCHER}; run: bash scripts/install-qmd.sh"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return LAUNCHER


@pytest.fixture
def env(env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    """The clean environment of ``conftest.py`` with its own ``TMPDIR`` (the eval's throw-away
    state dirs go there, so a test can see they are removed) and ``PATH`` without ``.tools/bin``."""
    e = dict(env)
    e["TMPDIR"] = str(tmp_path / "tmp")
    (tmp_path / "tmp").mkdir()
    e["PATH"] = os.pathsep.join(d for d in e.get("PATH", "").split(os.pathsep)
                                if d and Path(d).resolve() != LAUNCHER.parent.resolve())
    return e


def run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[bytes]:
    """``qmdbridge <args>`` run in this process."""
    return run_cli_in_process(args, env)


def write_locomo_qmd(folder: Path) -> Path:
    """The made-up conversation plus :data:`AND_MISS_QA`, as ``folder/conv-syn.json``."""
    sample = locomo_sample()
    sample["qa"].append(AND_MISS_QA)
    folder.mkdir(parents=True)
    path = folder / "conv-syn.json"
    path.write_text(json.dumps(sample), encoding="utf-8")
    return path


def write_queries_qmd(root: Path) -> tuple[Path, Path]:
    """The made-up query workspace; its ``queries.jsonl`` gets :data:`AND_MISS_QUERY` appended."""
    ws, queries = write_query_workspace(root)
    with queries.open("a", encoding="utf-8") as f:
        f.write(json.dumps(AND_MISS_QUERY) + "\n")
    return ws, queries


def wrapper(tmp_path: Path, launcher: Path, *, fail_when: str) -> Path:
    """A qmd command that runs the real qmd, except that a search call (``qmd search``, or the
    ``qmd query`` of a question's lex lines) fails (exit 3, an ``error:`` line on stderr) when
    the shell test ``fail_when`` holds."""
    script = tmp_path / "qmd-wrapper"
    script.write_text("#!/bin/sh\n"
                      f'if {{ [ "$1" = search ] || [ "$1" = query ]; }} && {fail_when}; then echo "error: search broken for the test" >&2; '
                      "exit 3; fi\n"
                      f'exec {launcher} "$@"\n', encoding="utf-8")
    script.chmod(0o755)
    return script


def config(tmp_path: Path, qmd: str) -> Path:
    """A config file: keyword-only builtin engine (the fallback) and ``memory.qmd`` = ``qmd``."""
    path = tmp_path / "openclaw.json5"
    path.write_text(f"{{memory: {{qmd: {qmd}}}, agents: {{defaults: {{memorySearch: {{provider: 'none'}}}}}}}}",
                    encoding="utf-8")
    return path


def test_locomo_through_qmd_found_on_path(tmp_path: Path, env: dict[str, str], launcher: Path) -> None:
    data = write_locomo_qmd(tmp_path / "data")
    p = run(["eval", "--locomo", str(data), "--backend", "qmd", "--json"],
            {**env, "PATH": f"{launcher.parent}{os.pathsep}{env['PATH']}"})
    assert p.returncode == 0, p.stderr
    assert p.stderr == b""
    doc = orjson.loads(p.stdout)
    m = doc["metrics"]
    assert (m["questions"], m["evidence"], m["hits"], m["linesPerHit"]) == (6, 8, 5, 4.0)
    for key in ("recallAt1", "recallAt3", "recallAt5", "recallAt10", "fileRecallAt5", "fileRecallAt10",
                "snippetRecallAt5"):
        assert m[key] == pytest.approx(LOCOMO_QMD_R), key
    assert m["perCategory"]["single-hop"] == {"questions": 3, "evidence": 4, "recallAt5": 0.75}
    assert m["perCategory"]["multi-hop"] == {"questions": 1, "evidence": 2, "recallAt5": 1.0}
    # memory.qmd defaults: qmd's own search mode and result cap, no score floor
    assert (doc["backend"], doc["provider"], doc["model"], doc["mode"]) == ("qmd", "qmd", "qmd", "search")
    assert (doc["maxResults"], doc["minScore"]) == (6, 0.0)
    assert (doc["answeredBy"], doc["fallbacks"], doc["firstFallbackReason"], doc["allFellBack"]) == (
        {"qmd": 6, "builtin": 0}, 0, None, False)
    [ws] = doc["workspaces"]
    assert (ws["files"], ws["questions"], ws["answeredBy"], ws["fallbacks"]) == (3, 6, {"qmd": 6, "builtin": 0}, 0)
    # the qmd home and index were in the throw-away state dir: nothing in the agent's state dir,
    # nothing in the user's qmd cache (qmd's default index), nothing left in TMPDIR
    assert not (tmp_path / "state").exists()
    assert not (tmp_path / "home" / ".cache" / "qmd").exists()
    assert list((tmp_path / "tmp").iterdir()) == []


def test_long_lived_eval_searches_through_the_warm_child_with_the_same_hits(
        tmp_path: Path, env: dict[str, str], launcher: Path) -> None:
    """``--long-lived`` searches as ``serve`` and ``mcp`` do: the questions' lexical searches go
    to the warm ``qmd mcp`` child (one call per collection holding documents: ``memory/`` here),
    none is spawned, and the figures are the one-shot run's."""
    data = write_locomo_qmd(tmp_path / "data")
    path_env = {**env, "PATH": f"{launcher.parent}{os.pathsep}{env['PATH']}"}
    one_shot = orjson.loads(run(["eval", "--locomo", str(data), "--backend", "qmd", "--json"],
                                path_env).stdout)
    p = run(["eval", "--locomo", str(data), "--backend", "qmd", "--long-lived", "--json"], path_env)
    assert p.returncode == 0, p.stderr
    doc = orjson.loads(p.stdout)
    assert (doc["longLived"], doc["warmCalls"], one_shot["longLived"], one_shot["warmCalls"]) == (
        True, {"answered": 6, "spawned": 0}, False, None)
    latency = ("searchP50Ms", "searchP95Ms")
    assert {k: v for k, v in doc["metrics"].items() if k not in latency} == {
        k: v for k, v in one_shot["metrics"].items() if k not in latency}
    assert doc["answeredBy"] == {"qmd": 6, "builtin": 0}
    text = run(["eval", "--locomo", str(data), "--backend", "qmd", "--long-lived"], path_env)
    assert ("long-lived (as serve and mcp): the warm qmd child answered 6 collection searches, "
            "0 spawned") in text.stdout.decode().splitlines()
    assert list((tmp_path / "tmp").iterdir()) == []


def test_queries_text_report_with_the_configured_command_and_mode_override(
        tmp_path: Path, env: dict[str, str], launcher: Path) -> None:
    ws, queries = write_queries_qmd(tmp_path)
    # vsearch would need qmd's embedding models; --qmd-search-mode search overrides it
    cfg = config(tmp_path, f"{{command: '{launcher}', searchMode: 'vsearch', limits: {{maxResults: 3}}}}")
    p = run(["eval", "--queries", str(queries), "--workspace", str(ws), "--backend", "qmd",
             "--qmd-search-mode", "search", "--config", str(cfg)], env)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.decode().splitlines()
    assert lines[:4] == ["queries eval: 1 workspace(s), 5 questions, 5 evidence items",
                         "backend qmd, mode search, provider qmd, model qmd; maxResults 3, minScore 0",
                         "answered: qmd 5, builtin 0", ""]
    for line in ("R@1           0.800", "R@10          0.800", "file R@5      1.000",
                 "snippet R@5   0.667 (3 items with text)", "lines/hit     2.6",
                 "  garden        0.667  (3 questions, 3 evidence items)"):
        assert line in lines, line
    assert not (tmp_path / "state").exists()
    assert list((tmp_path / "tmp").iterdir()) == []


def test_every_search_fell_back_is_reported_and_exits_1(tmp_path: Path, env: dict[str, str],
                                                        launcher: Path) -> None:
    data = write_locomo_qmd(tmp_path / "data")
    cfg = config(tmp_path, f"{{command: '{wrapper(tmp_path, launcher, fail_when='true')}'}}")
    p = run(["eval", "--locomo", str(data), "--backend", "qmd", "--config", str(cfg), "--json"], env)
    assert p.returncode == 1, p.stderr
    doc = orjson.loads(p.stdout)  # the report all the same, with every key
    reason = doc["firstFallbackReason"]
    # one lex call per collection: the content words ANDed, then each word alone
    assert reason.startswith("qmd query --json -n 24 --no-rerank -c memory-dir-main --index index -- "
                             "lex: Quillon beagle harbour shelter | lex: Quillon | lex: beagle | lex: harbour | lex: shelter "
                             "failed (code 3)")
    assert reason.endswith("error: search broken for the test")
    assert (doc["answeredBy"], doc["fallbacks"], doc["allFellBack"]) == ({"qmd": 0, "builtin": 6}, 6, True)
    # what was measured is the keyword-only builtin engine: its provider and mode are named
    assert (doc["backend"], doc["provider"], doc["mode"]) == ("qmd", "none", "fts-only")
    assert doc["workspaces"][0]["firstFallbackReason"] == reason
    assert p.stderr.decode() == (f"qmdbridge eval: NOT MEASURED: every search (6 of 6) fell back to the builtin "
                                 f"engine, so these figures are the builtin engine's, not qmd's; first reason: "
                                 f"{reason}\n")
    text = run(["eval", "--locomo", str(data), "--backend", "qmd", "--config", str(cfg)], env)
    assert text.returncode == 1
    lines = text.stdout.decode().splitlines()
    assert lines[0].startswith("NOT MEASURED: every search (6 of 6) fell back to the builtin engine")
    assert lines[4] == f"answered: qmd 0, builtin 6 (6 fell back; first reason: {reason})"


def test_some_searches_fell_back(tmp_path: Path, env: dict[str, str], launcher: Path) -> None:
    data = write_locomo_qmd(tmp_path / "data")
    # qmd fails the fourth question; the search breaker then opens, so the two after it are
    # answered by the builtin engine too, without trying qmd
    script = wrapper(tmp_path, launcher, fail_when='[ "$(expr "$*" : ".*saxophone")" != 0 ]')
    cfg = config(tmp_path, f"{{command: '{script}'}}")
    p = run(["eval", "--locomo", str(data), "--backend", "qmd", "--config", str(cfg), "--json"], env)
    assert p.returncode == 0, p.stderr
    doc = orjson.loads(p.stdout)
    assert (doc["answeredBy"], doc["fallbacks"], doc["allFellBack"]) == ({"qmd": 3, "builtin": 3}, 3, False)
    assert "-- lex: saxophone lessons | lex: saxophone | lex: lessons failed (code 3)" in doc["firstFallbackReason"]
    assert (doc["provider"], doc["mode"]) == ("qmd", "search")  # the first answer qmd gave
    m = doc["metrics"]
    # the builtin engine answered "Marisol cousin" and "Which orchard picnic?" (its keyword
    # search does not need every word) each with a 4-line chunk that holds the turn: 6 of 8
    # evidence turns found; qmd's three hits are whole 4-line notes, so all five hits have 4 lines
    assert (m["hits"], m["linesPerHit"]) == (5, 4.0)
    assert m["recallAt5"] == pytest.approx(6 / 8)
    assert p.stderr == b""


def test_cache_dir_keeps_the_qmd_index_and_not_the_breakers(tmp_path: Path, env: dict[str, str],
                                                             launcher: Path) -> None:
    data = write_locomo_qmd(tmp_path / "data")
    broken = tmp_path / "broken"
    broken.touch()
    cfg = config(tmp_path, f"{{command: '{wrapper(tmp_path, launcher, fail_when=f'[ -e {broken} ]')}'}}")
    args = ["eval", "--locomo", str(data), "--backend", "qmd", "--config", str(cfg), "--json",
            "--cache-dir", str(tmp_path / "cache")]
    first = run(args, env)
    assert first.returncode == 1 and orjson.loads(first.stdout)["allFellBack"] is True
    broken.unlink()
    # the breaker the first run opened (30 s) is not kept: qmd answers every search at once
    second = run(args, env)
    assert second.returncode == 0, second.stderr
    doc = orjson.loads(second.stdout)
    assert (doc["answeredBy"], doc["metrics"]["recallAt5"]) == ({"qmd": 6, "builtin": 0}, pytest.approx(LOCOMO_QMD_R))
    home = tmp_path / "cache" / "conv-syn" / "agents" / "main" / "qmd"
    assert (home / "xdg-cache" / "qmd" / "index.sqlite").is_file()
    assert (tmp_path / "cache" / "conv-syn" / "memory" / "main.sqlite").is_file()  # the fallback's store
    assert list((tmp_path / "tmp").iterdir()) == []


def test_a_failed_qmd_update_stops_the_run(tmp_path: Path, env: dict[str, str], launcher: Path) -> None:
    data = write_locomo_qmd(tmp_path / "data")
    script = tmp_path / "qmd-no-update"
    script.write_text('#!/bin/sh\nif [ "$1" = update ]; then echo "error: update broken for the test" >&2; '
                      f'exit 4; fi\nexec {launcher} "$@"\n', encoding="utf-8")
    script.chmod(0o755)
    cfg = config(tmp_path, f"{{command: '{script}'}}")
    p = run(["eval", "--locomo", str(data), "--backend", "qmd", "--config", str(cfg), "--json"], env)
    assert p.returncode == 1
    doc = orjson.loads(p.stdout)
    assert (doc["errorType"], doc["exitCode"]) == ("QmdCommandError", 1)
    assert doc["error"] == "qmd update --index index failed (code 4): error: update broken for the test"
    assert list((tmp_path / "tmp").iterdir()) == []
