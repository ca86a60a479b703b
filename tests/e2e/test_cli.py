"""The ``qmdbridge`` command: every command's output parsed, exit codes, errors on stderr without
tracebacks, and ``serve`` answering JSON lines and stopping on SIGTERM. Output shapes are checked
by running the command in this process (``run``); ``python -m qmdbridge``, ``serve`` and SIGTERM,
whose subject is the process, start a real one."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from tests.e2e.cli_proc import run_cli, run_cli_in_process

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "workspace"
COMMANDS = ["search", "get", "status", "index", "qmd", "warmup", "serve", "mcp", "doctor", "models"]


def run(args: list[str], env: dict[str, str], *, cwd: Path | None = None) -> subprocess.CompletedProcess[bytes]:
    """``qmdbridge <args>`` run to its end in this process (exit code and output bytes)."""
    return run_cli_in_process(args, env, cwd=cwd)


def test_every_command_has_help(env: dict[str, str]) -> None:
    top = run(["--help"], env)
    assert top.returncode == 0
    assert (b"3 refused path,\n4 no such memory file, 130 interrupted (Ctrl-C, SIGTERM), 141 stdout's reader "
            b"went away (| head).") in top.stdout
    for cmd in COMMANDS:
        assert cmd in top.stdout.decode()
        sub = run([cmd, "--help"], env)
        assert sub.returncode == 0, cmd
        assert b"usage: qmdbridge " + cmd.encode() in sub.stdout
        assert b"exit codes" in sub.stdout


def test_help_texts_read_the_defaults_the_settings_models_own(env: dict[str, str],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A default the settings models own is read from them when help is printed, never written
    again in the parser: with other defaults in the models, the help says those."""
    import fallback.sources.read_page as read_page
    from fallback.settings import QuerySettings
    from qmdbridge.config import QmdLimits

    monkeypatch.setattr(QuerySettings.model_fields["max_results"], "default", 9)
    monkeypatch.setattr(QuerySettings.model_fields["min_score"], "default", 0.25)
    monkeypatch.setattr(QmdLimits.model_fields["max_results"], "default", 7)
    monkeypatch.setattr(read_page, "DEFAULT_READ_LINES", 80)

    def helped(cmd: str) -> str:
        return " ".join(run([cmd, "--help"], env).stdout.decode().split())

    search, get, evaluate = helped("search"), helped("get"), helped("eval")
    assert "--max-results N hits wanted (default query.maxResults, 9; on qmd memory.qmd.limits.maxResults, 7)" in search
    assert "--min-score X score floor 0..1 (default query.minScore, 0.25; qmd applies none)" in search
    assert "--lines N number of lines (default 80)" in get
    assert "--min-score X score floor 0..1 (default query.minScore, 0.25)" in evaluate


def test_search_json_on_the_example_workspace(ws: Path, env: dict[str, str]) -> None:
    p = run(["search", "router dropped the WAN link", "--workspace", str(ws), "--json"], env)
    assert p.returncode == 0, p.stderr
    doc = orjson.loads(p.stdout)
    assert set(doc) == {"backend", "fallback", "provider", "model", "mode", "citations", "results",
                        "denied", "warnings", "corpus", "servedBy"}
    assert doc["servedBy"] == "process"  # no daemon serves this state dir
    assert doc["backend"] == "builtin" and doc["fallback"] is None and doc["mode"] == "fts-only"
    top = doc["results"][0]
    assert set(top) == {"path", "startLine", "endLine", "score", "snippet", "snippetStartLine",
                        "snippetEndLine", "source", "citation", "vectorScore", "textScore",
                        "explain"}
    assert top["explain"] is None  # present, null, without --explain
    assert top["path"] == "memory/2026-11-05.md" and top["source"] == "memory"
    assert top["startLine"] <= top["snippetStartLine"] <= top["snippetEndLine"] <= top["endLine"]
    assert top["citation"] == (
        f"memory/2026-11-05.md#L{top['snippetStartLine']}-L{top['snippetEndLine']}")
    assert 0 < top["score"] <= 1
    # keyword-only: the keyword score is the text side (as in a hybrid hit), with no vector side
    assert top["vectorScore"] is None and top["score"] <= top["textScore"] <= 1


def test_a_query_that_starts_with_a_dash_says_to_put_it_after_double_dash(ws: Path, env: dict[str, str]) -> None:
    hint = ("(a query or path that starts with '-' goes after '--', and the options before it: "
            "qmdbridge search --json -- -flag)")
    p = run(["search", "-flag", "--workspace", str(ws)], env)
    assert p.returncode == 2
    assert p.stderr.decode().splitlines()[-1] == (
        f"qmdbridge search: error: the following arguments are required: query {hint}")
    j = run(["search", "router", "-x", "--workspace", str(ws), "--json"], env)
    assert (j.returncode, orjson.loads(j.stdout)) == (2, {
        "error": f"qmdbridge: unrecognized arguments: -x {hint}", "errorType": "UsageError", "exitCode": 2})
    ok = run(["search", "--workspace", str(ws), "--json", "--", "-router dropped the WAN link"], env)
    assert ok.returncode == 0 and orjson.loads(ok.stdout)["results"][0]["path"] == "memory/2026-11-05.md"
    helped = run(["search", "--help"], env).stdout.decode()
    assert "one that starts with '-' goes after '--'" in " ".join(helped.split())


def test_an_unquoted_query_of_several_words_is_one_query(ws: Path, env: dict[str, str]) -> None:
    """``qmdbridge search router dropped the WAN link`` (no quotes) searches the words joined by
    single spaces, as the quoted query, also after ``--``; ``get`` still takes one path."""
    quoted = run(["search", "router dropped the WAN link", "--workspace", str(ws), "--json"], env)
    words = run(["search", "router", "dropped", "the", "WAN", "link", "--workspace", str(ws), "--json"], env)
    late = run(["search", "--workspace", str(ws), "--json", "--", "-router", "dropped", "the", "WAN", "link"], env)
    assert (words.returncode, late.returncode) == (0, 0), words.stderr + late.stderr
    assert orjson.loads(words.stdout)["results"] == orjson.loads(quoted.stdout)["results"]
    assert orjson.loads(late.stdout)["results"][0]["path"] == "memory/2026-11-05.md"
    from qmdbridge.cli.main import build_parser

    assert build_parser("search").parse_args(["search", "what", "did", "we", "decide"]).query == "what did we decide"
    two = run(["get", "MEMORY.md", "memory/2026-11-05.md", "--workspace", str(ws)], env)
    assert two.returncode == 2
    assert two.stderr.decode().splitlines()[-1] == "qmdbridge: error: unrecognized arguments: memory/2026-11-05.md"
    helped = " ".join(run(["search", "--help"], env).stdout.decode().split())
    assert "several words are one query (qmdbridge search what did we decide)" in helped


def test_options_before_the_command_are_read_as_the_commands(ws: Path, env: dict[str, str]) -> None:
    """``qmdbridge --json search x`` and ``qmdbridge --workspace DIR search x``: the options typed
    before the command are the command's (they were refused with the '-' query hint)."""
    after = run(["search", "router dropped the WAN link", "--workspace", str(ws), "--json"], env)
    before = run(["--json", "--workspace", str(ws), "search", "router dropped the WAN link"], env)
    assert before.returncode == 0, before.stdout + before.stderr
    assert orjson.loads(before.stdout) == orjson.loads(after.stdout)
    # an option's value that names a command is still that option's value
    named = run(["--agent", "search", "--workspace", str(ws), "search", "router", "--json"], env)
    assert (named.returncode, orjson.loads(named.stdout)) == (2, {
        "error": "unknown agent 'search' (known: main)", "errorType": "UsageError", "exitCode": 2})
    assert run(["--version"], env).stdout.startswith(b"qmdbridge ")


@pytest.mark.slow
def test_python_dash_m_qmdbridge_is_the_command(ws: Path, env: dict[str, str]) -> None:
    def module(*args: str) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run([sys.executable, "-m", "qmdbridge", *args], env=env, capture_output=True,
                              timeout=120)

    usage = module("search", "--help")
    assert usage.returncode == 0 and usage.stdout.startswith(b"usage: qmdbridge search ")
    p = module("search", "router dropped the WAN link", "--workspace", str(ws), "--json")
    assert p.returncode == 0, p.stderr
    assert orjson.loads(p.stdout)["results"][0]["path"] == "memory/2026-11-05.md"
    assert module("search", "   ", "--workspace", str(ws)).returncode == 2


def test_search_japanese_substring_and_text_output(ws: Path, env: dict[str, str]) -> None:
    p = run(["search", "東京チーム", "--workspace", str(ws), "--json"], env)
    paths = [r["path"] for r in orjson.loads(p.stdout)["results"]]
    assert "memory/2026-11-06.md" in paths and "memory/2026-11-19.md" in paths
    text = run(["search", "Parquet schema", "--workspace", str(ws)], env)
    assert text.returncode == 0
    first = text.stdout.decode().splitlines()[0]
    assert first.split(" ", 1)[1].startswith("memory/2026-11-17.md:")


def test_search_no_matches_and_usage_errors(ws: Path, env: dict[str, str]) -> None:
    p = run(["search", "nonexistent_xyz_keyword", "--workspace", str(ws)], env)
    assert p.returncode == 0 and p.stdout == b"No matches.\n"
    blank = run(["search", "   ", "--workspace", str(ws)], env)
    assert blank.returncode == 2
    assert blank.stderr == b"qmdbridge: query must not be empty\n"
    blank_json = run(["search", "", "--workspace", str(ws), "--json"], env)
    assert blank_json.returncode == 2
    assert orjson.loads(blank_json.stdout) == {"error": "query must not be empty", "errorType": "UsageError",
                                               "exitCode": 2}
    bad_flag = run(["search", "x", "--max-results", "abc"], env)
    assert bad_flag.returncode == 2 and b"invalid int value" in bad_flag.stderr


def test_malformed_config_is_one_line_exit_2(tmp_path: Path, ws: Path, env: dict[str, str]) -> None:
    cfg = tmp_path / "bad.json5"
    cfg.write_text("{ memory: { backend: 'qmd', qmd: { limits: { timeoutMs: 'soon' } } } }")
    p = run(["search", "router", "--workspace", str(ws), "--config", str(cfg)], env)
    assert p.returncode == 2
    lines = p.stderr.decode().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"qmdbridge: {cfg}: memory.qmd.limits.timeoutMs: invalid value 'soon'")
    syntax = tmp_path / "syntax.json5"
    syntax.write_text("{ memory: { backend: 'qmd',, } }")
    q = run(["status", "--config", str(syntax)], env)
    assert q.returncode == 2 and b"invalid JSON5" in q.stderr and b"Traceback" not in q.stderr
    missing = run(["status", "--config", str(tmp_path / "nope.json5")], env)
    assert missing.returncode == 2 and b"config file not found" in missing.stderr


def test_a_hit_inside_a_very_long_line_is_read_on_by_from_char(ws: Path, env: dict[str, str]) -> None:
    """A note holding one 60,000-char line (a pasted JSON log): the search hit deep inside it
    cites the line; reading that line pages 12,000 chars at a time, each notice naming the
    --from-char to go on at, until the hit's text is on the page (the fourth page here)."""
    records = "".join(f'{{"id": {i}, "msg": "step {i} ok", "level": "info"}}, ' for i in range(1_300))
    line = records[:45_000] + '{"id": -1, "msg": "zanzibar quokka failure"}, ' + records[45_000:60_000]
    (ws / "memory" / "log.md").write_text(f"# Pasted log\n\nSome intro.\n\n{line}\n\nAfter the log.\n")
    common = ["--workspace", str(ws), "--json"]
    [hit] = orjson.loads(run(["search", "zanzibar quokka", *common], env).stdout)["results"]
    assert (hit["path"], hit["citation"]) == ("memory/log.md", "memory/log.md#L5")
    assert "zanzibar quokka failure" in hit["snippet"]
    get = ["get", "memory/log.md", "--from", "5", "--lines", "1", *common]
    read, from_char, notices = "", 1, []
    while "zanzibar quokka failure" not in read:
        page = orjson.loads(run([*get, "--from-char", str(from_char)], env).stdout)
        assert (page["from"], page["lines"], page["truncated"], page["nextFrom"]) == (5, 1, True, None)
        body, notice = page["text"].split("\n\n[More content available. ")
        notices.append(notice)
        read += body
        from_char += len(body)
    assert notices == [f"Line 5 is cut at the maxChars budget. Use from=5 fromChar={n} to continue.]"
                       for n in (12_001, 24_001, 36_001, 48_001)]
    assert line.startswith(read)
    plain = run(["get", "memory/log.md", "--from", "5", "--from-char", "48001", "--lines", "1",
                 "--workspace", str(ws)], env)
    assert plain.stdout.endswith(b"[More content available. Line 5 is cut at the maxChars budget. "
                                 b"Use --from 5 --from-char 60001 to continue.]\n")
    bad = run([*get, "--from-char", "0"], env)
    assert (bad.returncode, orjson.loads(bad.stdout)["error"]) == (2, "fromChar must be between 1 and 2147483647")


def test_get_pages_refuses_and_reports_missing(ws: Path, env: dict[str, str]) -> None:
    p = run(["get", "memory/2026-11-05.md", "--from", "2", "--lines", "2", "--workspace", str(ws), "--json"], env)
    doc = orjson.loads(p.stdout)
    assert doc["from"] == 3 or doc["from"] == 2
    assert doc["lines"] == 2 and doc["nextFrom"] == doc["from"] + 2 and doc["truncated"] is True
    refused = run(["get", "../secrets.md", "--workspace", str(ws)], env)
    assert refused.returncode == 3 and b"parent segment" in refused.stderr
    refused_json = run(["get", "/etc/passwd", "--workspace", str(ws), "--json"], env)
    assert refused_json.returncode == 3 and orjson.loads(refused_json.stdout)["errorType"] == "PathRefusedError"
    missing = run(["get", "memory/2030-01-01.md", "--workspace", str(ws), "--json"], env)
    assert missing.returncode == 4
    assert orjson.loads(missing.stdout) == {
        "error": "no such memory file: 'memory/2030-01-01.md': no such file",
        "errorType": "MemoryFileNotFoundError", "exitCode": 4}
    plain = run(["get", "memory/2030-01-01.md", "--workspace", str(ws)], env)
    assert (plain.returncode, plain.stdout) == (4, b"")
    assert plain.stderr == b"qmdbridge: no such memory file: 'memory/2030-01-01.md': no such file\n"
    (ws / "memory" / "blob.md").write_bytes(b"GIF89a\x00\x01\x02\n")  # what indexing skips as binary
    blob = run(["get", "memory/blob.md", "--workspace", str(ws)], env)
    assert (blob.returncode, blob.stdout, blob.stderr) == (
        3, b"", b"qmdbridge: path refused: 'memory/blob.md': binary file (NUL bytes)\n")
    lower = run(["get", "memory.md", "--workspace", str(ws)], env)  # only MEMORY.md exists
    assert (lower.returncode, lower.stderr) == (
        3, b"qmdbridge: path refused: 'memory.md': the root file is MEMORY.md (names are case-sensitive)\n")


def test_index_force_and_status(ws: Path, env: dict[str, str]) -> None:
    (ws / "memory" / "bad.md").write_bytes(b"caf\xe9 au lait\n")
    (ws / "memory" / "blob.md").write_bytes(b"\x00\x01binary")
    p = run(["index", "--force", "--workspace", str(ws), "--json"], env)
    assert p.returncode == 0, p.stderr
    doc = orjson.loads(p.stdout)
    assert doc["ok"] is True and doc["forced"] is True
    st = run(["status", "--workspace", str(ws), "--json"], env)
    status = orjson.loads(st.stdout)
    assert status["files"] == 16 and status["chunks"] >= 16
    assert status["backend"] == "builtin" and status["dirty"] is False
    reasons = {s["path"]: s["reason"] for s in status["skipped"]}
    assert reasons["memory/blob.md"] == "binary file (NUL bytes)"
    assert reasons["memory/bad.md"].startswith("invalid UTF-8")
    assert status["dbPath"] == str(Path(env["OPENCLAW_STATE_DIR"]) / "memory" / "main.sqlite")
    human = run(["status", "--workspace", str(ws)], env).stdout.decode()
    assert "Indexed: 16 files" in human and "Skipped: memory/blob.md: binary file (NUL bytes)" in human


def test_doctor_json(ws: Path, env: dict[str, str]) -> None:
    (ws / "memory.md").write_text("legacy\n")
    p = run(["doctor", "--workspace", str(ws), "--json"], env)
    doc = orjson.loads(p.stdout)
    assert p.returncode == 1 and doc["ok"] is False
    root = next(c for c in doc["checks"] if c["name"] == "root memory file")
    assert root["level"] == "error"
    fixed = run(["doctor", "--fix", "--workspace", str(ws), "--json"], env)
    root = next(c for c in orjson.loads(fixed.stdout)["checks"] if c["name"] == "root memory file")
    assert root["fixed"] is True and not (ws / "memory.md").exists()


def test_doctor_tells_a_symlinked_root_file_once_as_status_does_before_and_after_a_sync(
        ws: Path, env: dict[str, str], tmp_path: Path) -> None:
    """doctor's own root-file check and the status problem it adds after a sync are one problem:
    the same message, level and fix as ``status`` lists, reported once, with or without an index."""
    (tmp_path / "real.md").write_bytes((ws / "MEMORY.md").read_bytes())
    (ws / "MEMORY.md").unlink()
    (ws / "MEMORY.md").symlink_to(tmp_path / "real.md")
    expected = {"name": "root memory file", "level": "error",
                "detail": "MEMORY.md is not indexed: symlink (not followed)", "hint": LINK_FIX, "fixed": False}
    before = orjson.loads(run(["doctor", "--workspace", str(ws), "--json"], env).stdout)
    assert run(["index", "--workspace", str(ws)], env).returncode == 0
    status = orjson.loads(run(["status", "--workspace", str(ws), "--json"], env).stdout)
    assert {"check": "memory file", "message": expected["detail"], "hint": LINK_FIX} in status["problems"]
    after = orjson.loads(run(["doctor", "--workspace", str(ws), "--json"], env).stdout)
    for doc in (before, after):
        told = [c for c in doc["checks"] if "MEMORY.md" in c["detail"] and "symlink" in c["detail"]]
        assert told == [expected] and doc["ok"] is False


def test_doctor_tells_the_legacy_split_in_the_words_of_status(ws: Path, env: dict[str, str]) -> None:
    """Both root files: doctor's root-file check says what ``status`` lists, once."""
    (ws / "memory.md").write_text("legacy\n")
    assert run(["index", "--workspace", str(ws)], env).returncode == 0
    status = orjson.loads(run(["status", "--workspace", str(ws), "--json"], env).stdout)
    problem = next(p for p in status["problems"] if "legacy memory.md" in p["message"])
    doctor = orjson.loads(run(["doctor", "--workspace", str(ws), "--json"], env).stdout)
    told = [c for c in doctor["checks"] if "legacy memory.md" in c["detail"]]
    assert told == [{"name": "root memory file", "level": "error", "detail": problem["message"],
                     "hint": problem["hint"], "fixed": False}]


def test_an_extra_path_whose_pattern_admits_nothing_is_a_problem(ws: Path, env: dict[str, str],
                                                                 tmp_path: Path) -> None:
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "a.md").write_text("a note\n")
    (notes / "b.txt").write_text("not memory\n")
    cfg = tmp_path / "openclaw.json5"
    cfg.write_text(f"{{agents: {{defaults: {{memorySearch: {{extraPaths: [{{path: '{notes}', pattern: '*.txt'}}]}}}}}}}}")
    common = ["--workspace", str(ws), "--config", str(cfg)]
    assert run(["index", *common], env).returncode == 0
    problem = {"check": "memory paths",
               "message": f"extra path pattern can never match a memory file: {notes} (pattern *.txt; "
                          "memory files end in .md)",
               "hint": 'memory files are Markdown: give the entry a pattern whose names end in .md '
                       '(the default is "**/*.md"), or remove it from memorySearch.extraPaths'}
    status = run(["status", *common, "--json"], env)
    assert status.returncode == 0 and orjson.loads(status.stdout)["problems"] == [problem]
    doctor = run(["doctor", *common, "--json"], env)
    assert doctor.returncode == 1
    failed = [c for c in orjson.loads(doctor.stdout)["checks"] if c["level"] == "error"]
    assert [(c["name"], c["detail"], c["hint"]) for c in failed] == [
        ("memory paths", problem["message"], problem["hint"])], failed


# The fix of every symlink status lists: a note, a folder in memory/, memory/ itself.
LINK_FIX = ("symlinks are never followed: replace the link with what it points to, or add the "
            "target's real path to memorySearch.extraPaths")


def test_a_symlinked_memory_folder_is_a_problem_with_a_fix(ws: Path, env: dict[str, str],
                                                          tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere"
    (ws / "memory").rename(outside)
    (ws / "memory").symlink_to(outside)
    assert run(["index", "--workspace", str(ws)], env).returncode == 0
    status = run(["status", "--workspace", str(ws), "--json"], env)
    assert orjson.loads(status.stdout)["problems"] == [{
        "check": "memory paths", "message": f"memory directory is a symlink (not followed): {ws / 'memory'}",
        "hint": LINK_FIX}]


def test_a_symlinked_note_or_sub_folder_is_a_problem_with_the_same_fix(ws: Path, env: dict[str, str],
                                                                       tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "n.md").write_text("# n\n")
    (ws / "memory" / "linked").symlink_to(outside)
    (ws / "memory" / "linked.md").symlink_to(outside / "n.md")
    assert run(["index", "--workspace", str(ws)], env).returncode == 0
    status = run(["status", "--workspace", str(ws), "--json"], env)
    assert orjson.loads(status.stdout)["problems"] == [
        {"check": "memory file", "message": f"memory/{name} is not indexed: symlink (not followed)",
         "hint": LINK_FIX} for name in ("linked", "linked.md")]


@pytest.mark.slow
def test_serve_answers_json_lines_and_stops_on_sigterm(ws: Path, env: dict[str, str]) -> None:
    exe = shutil.which("qmdbridge")
    assert exe
    proc = subprocess.Popen([exe, "serve", "--workspace", str(ws)], env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdin and proc.stdout
        proc.stdin.write(b'{"id": 1, "tool": "memory_search", "params": {"query": "Atlas rollback"}}\n')
        proc.stdin.write(b'{"id": 2, "tool": "memory_get", "params": {"path": "MEMORY.md", "lines": 1}}\n')
        proc.stdin.write(b'{"id": 3, "tool": "memory_get", "params": {"path": "../x.md"}}\n')
        proc.stdin.write(b'not json\n')
        proc.stdin.flush()
        replies = [orjson.loads(proc.stdout.readline()) for _ in range(4)]
        assert replies[0]["id"] == 1 and replies[0]["result"]["results"][0]["path"].startswith("memory/2026-11-")
        assert replies[1]["result"]["text"].startswith("# MEMORY\n\n[More content available. Use from=2")
        assert replies[2]["result"]["refused"] is True and replies[2]["result"]["disabled"] is True
        assert replies[3]["id"] is None and replies[3]["error"].startswith("invalid JSON")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
        assert b"qmdbridge serve: stopped" in proc.stderr.read()  # type: ignore[union-attr]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _qmd_config(tmp_path: Path) -> Path:
    launcher = REPO / ".tools" / "bin" / "qmd"
    if not launcher.exists():
        if os.environ.get("CI"):
            pytest.fail("real qmd missing: run scripts/install-qmd.sh")
        pytest.skip("real qmd missing: run scripts/install-qmd.sh")
    cfg = tmp_path / "qmd.json5"
    # a generous search deadline: this test is about the commands, not about a loaded machine
    cfg.write_text(f"{{memory: {{backend: 'qmd', qmd: {{command: '{launcher}', limits: {{timeoutMs: 20000}}}}}}}}")
    return cfg


@pytest.mark.slow
def test_qmd_operator_commands_and_warmup_under_ci(tmp_path: Path, ws: Path, env: dict[str, str]) -> None:
    cfg = _qmd_config(tmp_path)
    cols = run(["qmd", "collections", "--workspace", str(ws), "--config", str(cfg), "--json"], env)
    assert cols.returncode == 0, cols.stderr
    names = {c["name"]: c for c in orjson.loads(cols.stdout)["collections"]}
    assert names["memory-root-main"]["pattern"] == "MEMORY.md" and names["memory-root-main"]["managed"]
    assert names["memory-dir-main"]["path"] == str(ws.resolve() / "memory")
    upd = run(["qmd", "update", "--workspace", str(ws), "--config", str(cfg), "--json"], env)
    assert upd.returncode == 0 and orjson.loads(upd.stdout) == {"ok": True, "action": "update"}
    hit = run(["search", "Parquet schema", "--workspace", str(ws), "--config", str(cfg), "--json"], env)
    doc = orjson.loads(hit.stdout)
    assert doc["backend"] == "qmd" and doc["results"][0]["path"] == "memory/2026-11-17.md"
    warm = run(["warmup", "--workspace", str(ws), "--config", str(cfg), "--json"], {**env, "CI": "true"})
    assert warm.returncode == 1
    report = orjson.loads(warm.stdout)
    assert report["ok"] is False and report["steps"][0]["step"] == "embed"
    assert "refuses model operations while the CI environment variable is set" in report["steps"][0]["error"]
    offline = run(["warmup", "--workspace", str(ws), "--config", str(cfg)],
                  {**env, "HF_ENDPOINT": "http://127.0.0.1:9"})
    assert offline.returncode == 1
    message = offline.stderr.decode()
    assert message.startswith("qmdbridge warmup: offline: cannot reach 127.0.0.1:9")
    assert "hf:ggml-org/embeddinggemma-300M-GGUF/embeddinggemma-300M-Q8_0.gguf" in message


def test_usage_errors_honour_json_and_huge_numbers_are_refused(ws: Path, env: dict[str, str]) -> None:
    p = run(["get", "MEMORY.md", "--from", "abc", "--workspace", str(ws), "--json"], env)
    assert p.returncode == 2
    doc = orjson.loads(p.stdout)
    assert doc["errorType"] == "UsageError" and "invalid int value: 'abc'" in doc["error"]
    huge = run(["get", "MEMORY.md", "--from", "99999999999999999999", "--workspace", str(ws), "--json"], env)
    assert huge.returncode == 2
    assert orjson.loads(huge.stdout)["error"] == "from must be between 1 and 2147483647"
    missing_ws = run(["search", "router", "--workspace", str(ws / "nope"), "--json"], env)
    assert missing_ws.returncode == 2
    assert orjson.loads(missing_ws.stdout)["error"].startswith("workspace does not exist: ")


@pytest.mark.slow
def test_serve_survives_bad_requests(ws: Path, env: dict[str, str]) -> None:
    lines = [b'{"id": 8, "tool": "memory_get", "params": {"path": "MEMORY.md", "from": 100000000000000000000000}}',
             b'{"id": 9, "tool": "memory_search", "params": null}',
             b'{"id": 10, "tool": "memory_search", "params": {"query": "Atlas"}, "sessionKey": {"x": 1}}',
             b'{"id": 11, "tool": "status"}',
             b'{"id": 12, "tool": "memory_search", "params": {"query": "Atlas rollback"},'
             b' "sessionKey": "agent:main:subagent:7f3c", "sessionKeys": ["agent:main:main"]}',
             b'{"id": 13, "tool": "memory_search", "params": {"query": "Atlas"}, "sessionKeys": "main"}',
             b'{"id": 14, "tool": "memory_search", "params": {"query": "Atlas", "maxResults": "5"}}']
    p = run_cli(["serve", "--workspace", str(ws)], env, stdin=b"\n".join(lines) + b"\n")  # reads stdin to EOF
    assert p.returncode == 0, p.stderr
    replies = [orjson.loads(line) for line in p.stdout.splitlines()]
    assert [r["id"] for r in replies] == [8, 9, 10, 11, 12, 13, 14]
    assert replies[0]["result"]["error"] == "from must be between 1 and 2147483647"
    assert replies[1]["result"]["results"] == [] and replies[1]["result"]["disabled"] is True
    assert replies[2]["result"]["error"] == "session key must be a string"
    assert replies[3]["result"]["backend"] == "builtin"
    # a sub-agent searches through the session that spawned it (the scope rules allow direct chats)
    assert replies[4]["result"]["denied"] is None and replies[4]["result"]["results"]
    assert replies[5]["result"]["error"] == "inherited session keys must be a list of strings"
    # as the MCP tool schema says (mcp refuses it the same way): a string is not a number
    assert replies[6]["result"] == {"results": [], "disabled": True,
                                    "error": "maxResults must be an integer, not '5'"}


@pytest.mark.slow
def test_qmd_embed_fails_fast_offline_and_under_ci(tmp_path: Path, ws: Path, env: dict[str, str]) -> None:
    cfg = _qmd_config(tmp_path)
    offline = run(["qmd", "embed", "--workspace", str(ws), "--config", str(cfg), "--json"],
                  {**env, "HF_ENDPOINT": "http://127.0.0.1:9"})
    assert offline.returncode == 1
    err = orjson.loads(offline.stdout)["error"]
    assert "qmd embed skipped: offline: cannot reach 127.0.0.1:9" in err
    assert "embeddinggemma-300M-Q8_0.gguf" in err
    ci = run(["qmd", "embed", "--workspace", str(ws), "--config", str(cfg)], {**env, "CI": "true"})
    assert ci.returncode == 1 and b"refuses model operations while the CI environment" in ci.stderr


@pytest.mark.slow
def test_sigterm_during_a_qmd_call_reaps_the_children(tmp_path: Path, ws: Path, env: dict[str, str]) -> None:
    import time

    import psutil

    launcher = REPO / ".tools" / "bin" / "qmd"
    if not launcher.exists():
        pytest.skip("real qmd missing: run scripts/install-qmd.sh")
    hang = REPO / "tests" / "qmdbridge" / "standins" / "hang.py"
    wrapper = tmp_path / "qmd-hang"
    wrapper.write_text(f"#!/bin/sh\ncase \"$1\" in search) exec {sys.executable} {hang} ;; "
                       f"*) exec {launcher} \"$@\" ;; esac\n")
    wrapper.chmod(0o755)
    cfg = tmp_path / "hang.json5"
    cfg.write_text(f"{{memory: {{backend: 'qmd', qmd: {{command: '{wrapper}', limits: {{timeoutMs: 60000}}}}}}}}")
    pidfile = tmp_path / "pids"
    exe = shutil.which("qmdbridge")
    assert exe
    proc = subprocess.Popen([exe, "search", "router", "--workspace", str(ws), "--config", str(cfg)],
                            env={**env, "STANDIN_PIDFILE": str(pidfile)}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while not pidfile.exists():
            assert time.monotonic() < deadline, proc.stderr.read() if proc.poll() is not None else "no pidfile"  # type: ignore[union-attr]
            time.sleep(0.05)
        grandchildren = [int(p) for p in pidfile.read_text().split()]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 130
        deadline = time.monotonic() + 60  # a bound: a loaded machine reaps slowly
        while any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
                  for p in grandchildren):
            assert time.monotonic() < deadline, "qmd's children survived the SIGTERM"
            time.sleep(0.05)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_files_indexed_with_a_caveat_are_neither_skipped_nor_problems(ws: Path, env: dict[str, str]) -> None:
    # three notes indexed with a caveat (NUL padding stripped, a Latin-1 name, invalid UTF-8
    # replaced) and one note really skipped (binary): only the binary one is "not indexed"
    (ws / "memory" / "padded.md").write_bytes(b"# Padded\nThe kayak is in the garage.\n" + b"\x00" * 64)
    with open(os.path.join(os.fsencode(ws / "memory"), b"caf\xe9.md"), "wb") as fh:
        fh.write(b"# Espresso\nThe grinder setting for espresso is 7.\n")
    (ws / "memory" / "bad.md").write_bytes(b"caf\xe9 au lait\n")
    (ws / "memory" / "blob.md").write_bytes(b"\x00\x01binary")
    indexed = run(["index", "--workspace", str(ws)], env)
    assert indexed.returncode == 0, indexed.stderr
    assert indexed.stdout.decode() == (
        "Memory index updated (main): 18 files, 26 chunks, 1 skipped, 3 indexed with a caveat.\n")
    found = orjson.loads(run(["search", "kayak garage", "--workspace", str(ws), "--json"], env).stdout)
    assert [h["path"] for h in found["results"]] == ["memory/padded.md"]
    status = orjson.loads(run(["status", "--workspace", str(ws), "--json"], env).stdout)
    assert [(p["check"], p["message"]) for p in status["problems"]] == [
        ("memory file", "memory/blob.md is not indexed: binary file (NUL bytes)")]
    human = run(["status", "--workspace", str(ws)], env).stdout.decode()
    assert "Skipped: memory/blob.md: binary file (NUL bytes)\n" in human
    assert "Indexed with a caveat: memory/padded.md: NUL bytes stripped (64 bytes)\n" in human
    assert "Indexed with a caveat: memory/caf\\xe9.md: file name is not valid UTF-8" in human
    assert "Indexed with a caveat: memory/bad.md: invalid UTF-8 (bytes replaced with U+FFFD)\n" in human
    assert "Problems: 1\n" in human
    doctor = orjson.loads(run(["doctor", "--workspace", str(ws), "--json"], env).stdout)
    failed = [c["detail"] for c in doctor["checks"] if c["name"] == "memory file"]
    assert failed == ["memory/blob.md is not indexed: binary file (NUL bytes)"]


def test_an_empty_workspace_or_config_argument_is_a_usage_error(ws: Path, env: dict[str, str], tmp_path: Path) -> None:
    # `--workspace "$WS"` with WS unset must not index the current folder into the agent's store
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    assert run(["index", "--workspace", str(ws)], env).returncode == 0
    for cmd in (["search", "router"], ["get", "MEMORY.md"], ["status"], ["index"], ["doctor"]):
        p = run([*cmd, "--workspace", "", "--json"], env, cwd=cwd)
        assert p.returncode == 2, cmd
        assert orjson.loads(p.stdout)["error"].endswith("argument --workspace: must not be empty"), cmd
    blank_config = run(["search", "router", "--workspace", str(ws), "--config", " ", "--json"], env)
    assert blank_config.returncode == 2
    assert orjson.loads(blank_config.stdout)["error"].endswith("argument --config: must not be empty")
    assert orjson.loads(run(["status", "--workspace", str(ws), "--json"], env).stdout)["files"] == 15
