"""What a new user meets from the ``qmdbridge`` command (run in this process; the daemon it talks
to is a real ``serve`` process): the version, the keyword-only notice,
unknown agents, ``get`` with absolute paths and past the end, one stderr line per event,
``status`` and ``doctor`` sharing one problem list, and neither creating a store without a
workspace."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from tests.e2e.cli_proc import cli_argv, run_cli_in_process, without_progress

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "workspace"
NOTICE = 'keyword-only: no embedding provider — see README "Semantic search"\n'


def run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``qmdbridge <args>`` run in this process, its output decoded."""
    p = run_cli_in_process(args, env)
    return subprocess.CompletedProcess(p.args, p.returncode, p.stdout.decode(), p.stderr.decode())


def test_version(env: dict[str, str]) -> None:
    match = re.search(r'^version = "([^"]+)"$', (REPO / "pyproject.toml").read_text(), re.M)
    assert match
    version = match.group(1)
    p = run(["--version"], env)
    assert (p.returncode, p.stdout) == (0, f"qmdbridge {version}\n")


def test_keyword_only_search_says_so_once(ws: Path, env: dict[str, str], tmp_path: Path) -> None:
    plain = run(["search", "router dropped the WAN link", "--workspace", str(ws)], env)
    assert plain.returncode == 0 and without_progress(plain.stderr) == NOTICE
    assert plain.stdout.startswith("1.000 memory/2026-11-05.md:")
    as_json = run(["search", "router", "--workspace", str(ws), "--json"], env)
    assert as_json.stderr == "" and orjson.loads(as_json.stdout)["mode"] == "fts-only"
    off = tmp_path / "none.json5"
    off.write_text("{agents: {defaults: {memorySearch: {provider: 'none'}}}}")
    chosen = run(["search", "router", "--workspace", str(ws), "--config", str(off)], env)
    assert chosen.returncode == 0 and chosen.stderr == ""  # keyword-only on purpose: no notice


def test_unknown_agent_names_the_known_ones(ws: Path, env: dict[str, str], tmp_path: Path) -> None:
    p = run(["status", "--agent", "bob", "--workspace", str(ws)], env)
    assert (p.returncode, p.stderr) == (2, "qmdbridge: unknown agent 'bob' (known: main)\n")
    cfg = tmp_path / "agents.json5"
    cfg.write_text("{agents: {list: [{id: 'main', default: true}, {id: 'Ops Bot'}]}}")
    q = run(["search", "x", "--agent", "bob", "--config", str(cfg), "--json"], env)
    assert q.returncode == 2
    assert orjson.loads(q.stdout)["error"] == "unknown agent 'bob' (known: main, ops-bot)"
    ok = run(["status", "--agent", "OPS BOT", "--config", str(cfg), "--workspace", str(ws), "--json"], env)
    assert ok.returncode == 0 and orjson.loads(ok.stdout)["agentId"] == "ops-bot"
    # an id that names no file is a bad argument, not a config problem ("<config>: agent: ...")
    bad = run(["status", "--agent", "../x", "--workspace", str(ws)], env)
    assert (bad.returncode, bad.stderr) == (
        2, "qmdbridge: --agent: invalid agent id '../x' (expected a name without path separators or '..')\n")
    listed = tmp_path / "bad-id.json5"
    listed.write_text("{agents: {list: [{id: 'main'}, {id: 'a/b'}]}}")
    in_file = run(["status", "--config", str(listed), "--workspace", str(ws)], env)
    assert (in_file.returncode, in_file.stderr) == (2, f"qmdbridge: {listed}: agents.list[1].id: invalid agent "
                                                       "id 'a/b' (expected a name without path separators or '..')\n")


def test_get_absolute_paths_past_the_end_and_the_cli_continuation(ws: Path, env: dict[str, str]) -> None:
    inside = run(["get", str(ws / "memory" / "2026-11-05.md"), "--lines", "1", "--workspace", str(ws), "--json"], env)
    assert inside.returncode == 0, inside.stderr
    assert orjson.loads(inside.stdout)["path"] == "memory/2026-11-05.md"
    outside = run(["get", "/etc/passwd", "--workspace", str(ws)], env)
    assert outside.returncode == 3
    assert outside.stderr == (f"qmdbridge: path refused: '/etc/passwd': outside the workspace {ws} and its "
                              "extra paths (memory is MEMORY.md, memory/**/*.md and memorySearch.extraPaths)\n")
    not_memory = run(["get", str(ws / "notes.txt"), "--workspace", str(ws)], env)
    assert not_memory.returncode == 3 and not_memory.stderr == "qmdbridge: path refused: 'notes.txt': not a memory path\n"
    page = run(["get", "MEMORY.md", "--lines", "2", "--workspace", str(ws)], env)
    assert page.stdout.endswith("\n\n[More content available. Use --from 3 to continue.]\n")
    past = run(["get", "MEMORY.md", "--from", "500", "--workspace", str(ws)], env)
    assert (past.returncode, past.stdout) == (0, "")
    assert past.stderr == ("qmdbridge: --from 500 is past the end of MEMORY.md (nothing from that line on); "
                           "try a smaller --from\n")


def test_denial_and_fallback_are_one_stderr_line_each(ws: Path, env: dict[str, str], tmp_path: Path) -> None:
    deny = tmp_path / "deny.json5"
    deny.write_text("{memory: {qmd: {scope: {default: 'deny', rules: [{action: 'allow', match: {chatType: 'direct'}}]}}}}")
    p = run(["search", "router", "--workspace", str(ws), "--config", str(deny),
             "--session-key", "agent:main:telegram:group:123"], env)
    assert p.returncode == 0 and p.stderr == ""
    assert p.stdout == ("Search denied by scope: denied by default (deny); chatType=group channel=telegram; "
                        'to allow it, add {action: "allow", match: {chatType: "group"}} to memory.qmd.scope.rules\n')
    missing = tmp_path / "qmd.json5"
    missing.write_text(f"{{memory: {{backend: 'qmd', qmd: {{command: '{tmp_path / 'no-qmd'}'}}}}}}")
    q = run(["search", "router", "--workspace", str(ws), "--config", str(missing)], env)
    assert q.returncode == 0
    lines = without_progress(q.stderr).splitlines()
    assert len(lines) == 2 and lines[0].startswith("note: answered by builtin (qmd unavailable: qmd not found")
    assert lines[1] + "\n" == NOTICE


def test_status_and_doctor_without_a_workspace_create_nothing(env: dict[str, str], tmp_path: Path) -> None:
    state = Path(env["OPENCLAW_STATE_DIR"])
    st = run(["status"], env)
    assert st.returncode == 2
    assert st.stderr == (f"qmdbridge: workspace does not exist: {state / 'workspace'} (create it, pass "
                         "--workspace or set agents.defaults.workspace)\n")
    doc = run(["doctor", "--json"], env)
    assert doc.returncode == 1
    checks = {c["name"]: c for c in orjson.loads(doc.stdout)["checks"]}
    assert checks["workspace"]["level"] == "error"
    # `qmdbridge index` alone would fail on the missing workspace (exit 2): both hints say so
    then_index = f"create the workspace {state / 'workspace'}, then run `qmdbridge index`"
    assert (checks["workspace"]["hint"], checks["index"]["hint"]) == (
        f"{then_index}; or pass --workspace / set agents.defaults.workspace", then_index)
    assert not list(state.rglob("*.sqlite*")) and not (state / "memory").exists()


def test_doctor_and_status_tell_a_workspace_that_is_a_file_alike(env: dict[str, str], tmp_path: Path) -> None:
    """A file where the workspace should be: doctor's workspace check says what ``status`` says
    (it said ``workspace missing``, as for a path that does not exist)."""
    ws = tmp_path / "notes.md"
    ws.write_text("not a folder\n")
    st = run(["status", "--workspace", str(ws)], env)
    assert st.returncode == 2
    doc = orjson.loads(run(["doctor", "--workspace", str(ws), "--json"], env).stdout)
    check = next(c for c in doc["checks"] if c["name"] == "workspace")
    assert f"qmdbridge: {check['detail']}\n" == st.stderr == (
        f"qmdbridge: workspace is not a directory: {ws} (pass --workspace or set agents.defaults.workspace)\n")
    index = next(c for c in doc["checks"] if c["name"] == "index")  # not "create the workspace" alone
    assert index["hint"] == f"move the file {ws} away, create the workspace {ws}, then run `qmdbridge index`"


def test_status_and_doctor_report_the_same_problems(ws: Path, env: dict[str, str], tmp_path: Path) -> None:
    cfg = tmp_path / "cfg.json5"
    cfg.write_text("{agents: {defaults: {memorySearch: {maxFileBytes: 2000, extraPaths: ['notes', 'journal.md']}}}}")
    (ws / "memory" / "2026-12-01.md").write_text("# Long day\n\n" + "A long note line.\n" * 200)
    (ws / "journal.md").write_text("# Journal\n")
    (ws / "memory" / ".draft.md").write_text("# not yet\n")
    args = ["--workspace", str(ws), "--config", str(cfg)]
    assert run(["index", *args, "--json"], env).returncode == 0
    status = orjson.loads(run(["status", *args, "--json"], env).stdout)
    assert status["problems"] == [
        {"check": "memory file", "message": "memory/2026-12-01.md is not indexed: too large (3612 bytes > cap 2000)",
         "hint": "split the file, or raise memorySearch.maxFileBytes"},
        {"check": "memory paths", "message": f"extra path missing: {ws / 'notes'}",
         "hint": "create it, or fix or remove its entry in memorySearch.extraPaths or memory.qmd.paths"}]
    assert status["roots"][0] == {"kind": "root", "path": str(ws / "MEMORY.md"), "pattern": "MEMORY.md", "exists": True}
    assert [(r["kind"], r["path"], r["exists"]) for r in status["roots"][1:]] == [
        ("memory", str(ws / "memory"), True), ("extra", str(ws / "notes"), False),
        ("extra", str(ws / "journal.md"), True)]
    human = run(["status", *args], env).stdout
    assert "Problems: 2\n  [memory file] memory/2026-12-01.md is not indexed: too large" in human
    assert f"Root: {ws / 'notes'} (**/*.md) (missing)\n" in human
    doctor = run(["doctor", *args, "--json"], env)
    assert doctor.returncode == 1
    failed = [(c["name"], c["detail"]) for c in orjson.loads(doctor.stdout)["checks"] if c["level"] == "error"]
    assert failed == [(p["check"], p["message"]) for p in status["problems"]]
    (ws / "notes").mkdir()
    (ws / "memory" / "2026-12-01.md").write_text("# Short day\n")
    assert run(["index", *args, "--json"], env).returncode == 0
    clean = run(["doctor", *args, "--json"], env)
    assert clean.returncode == 0 and orjson.loads(clean.stdout)["ok"] is True
    assert "Problems: none\n" in run(["status", *args], env).stdout


def test_status_says_a_rebuild_is_pending_and_when_the_provider_cannot_work(ws: Path, env: dict[str, str],
                                                                         tmp_path: Path) -> None:
    assert run(["index", "--workspace", str(ws)], env).returncode == 0
    remote = tmp_path / "remote.json5"
    remote.write_text("{agents: {defaults: {memorySearch: {provider: 'openai-compatible', model: 'm',"
                      " remote: {baseUrl: 'http://127.0.0.1:9/v1'}}}}}")
    human = run(["status", "--workspace", str(ws), "--config", str(remote)], env).stdout
    assert "Dirty: yes (rebuild pending: model changed (fts-only -> m))\n" in human
    broken = tmp_path / "local.json5"
    broken.write_text(f"{{agents: {{defaults: {{memorySearch: {{provider: 'local', local: {{modelPath: "
                      f"'{tmp_path / 'gone.gguf'}'}}}}}}}}}}")
    st = run(["status", "--workspace", str(ws), "--config", str(broken)], env)
    assert "Mode: fts-only" not in st.stdout
    reason = f"memory search unavailable: local: local model file not found: {tmp_path / 'gone.gguf'}"
    assert f"Mode: unavailable, search fails until this is fixed ({reason})\n" in st.stdout
    doc = orjson.loads(run(["status", "--workspace", str(ws), "--config", str(broken), "--json"], env).stdout)
    assert doc["searchMode"] == "unavailable" and doc["dirty"] is False
    assert doc["problems"][-1]["message"] == reason


@pytest.mark.slow
def test_a_running_daemon_answers_with_the_same_problems_paths_and_continuation(ws: Path, env: dict[str, str]) -> None:
    import signal

    from tests.qmdbridge.server_procs import start, stop

    (ws / "memory" / "blob.md").write_bytes(b"\x00\x01binary")
    assert run(["index", "--workspace", str(ws), "--json"], env).returncode == 0
    proc, _ = start(["serve", "--no-stdin", "--workspace", str(ws)], env, ready="daemon socket")
    try:
        served = orjson.loads(run(["status", "--workspace", str(ws), "--json"], env).stdout)
        assert served["servedBy"] == "daemon"
        assert served["problems"] == [{"check": "memory file", "message": "memory/blob.md is not indexed: "
                                       "binary file (NUL bytes)", "hint": "memory files are Markdown text; "
                                       "move the file out of the memory folders"}]
        human = run(["status", "--workspace", str(ws)], env).stdout
        assert "Problems: 1\n  [memory file] memory/blob.md is not indexed: binary file (NUL bytes)\n" in human
        assert f"Root: {ws / 'memory'} (**/*.md)\n" in human
        page = run(["get", "MEMORY.md", "--lines", "2", "--workspace", str(ws)], env)
        assert page.stdout.endswith("\n\n[More content available. Use --from 3 to continue.]\n")
        absolute = run(["get", str(ws / "MEMORY.md"), "--lines", "1", "--workspace", str(ws), "--json"], env)
        doc = orjson.loads(absolute.stdout)
        assert (doc["path"], doc["servedBy"]) == ("MEMORY.md", "process")
        past = run(["get", "MEMORY.md", "--from", "500", "--workspace", str(ws)], env)
        assert (past.returncode, past.stdout) == (0, "") and "is past the end of MEMORY.md" in past.stderr
    finally:
        assert stop(proc, signal.SIGTERM) == 0


def test_qmd_not_answering_is_a_problem_in_status_and_doctor(ws: Path, env: dict[str, str], tmp_path: Path) -> None:
    cfg = tmp_path / "qmd.json5"
    cfg.write_text(f"{{memory: {{backend: 'qmd', qmd: {{command: '{tmp_path / 'no-qmd'}'}}}}}}")
    args = ["--workspace", str(ws), "--config", str(cfg)]
    assert run(["search", "router", *args], env).returncode == 0  # answered by the builtin engine
    status = orjson.loads(run(["status", *args, "--json"], env).stdout)
    qmd = [p for p in status["problems"] if p["check"] == "qmd"]
    assert len(qmd) == 1 and qmd[0]["message"].startswith(f"qmd is not answering: qmd not found (command '{tmp_path / 'no-qmd'}')")
    assert qmd[0]["message"].endswith("; the builtin engine answers meanwhile")
    doctor = run(["doctor", *args, "--json"], env)
    assert doctor.returncode == 1
    failed = [c["detail"] for c in orjson.loads(doctor.stdout)["checks"] if c["level"] == "error"]
    assert any(d.startswith("qmd is not answering: qmd not found") for d in failed)


def test_status_before_the_first_sync_says_files_are_not_checked_yet(ws: Path, env: dict[str, str]) -> None:
    # memory files and paths are checked by a sync: before one, "Problems: none" would be a guess
    (ws / "memory" / "blob.md").write_bytes(b"\x00\x01binary")
    args = ["--workspace", str(ws)]
    before = run(["status", *args], env)
    assert before.returncode == 0, before.stderr
    assert "Dirty: yes (not synced yet)\n" in before.stdout
    assert ("Problems: none found yet: memory files are checked by the first sync "
            "(run `qmdbridge index`)\n") in before.stdout
    assert orjson.loads(run(["status", *args, "--json"], env).stdout)["lastSyncAtMs"] is None
    assert run(["index", *args], env).returncode == 0
    after = run(["status", *args], env).stdout
    assert "Problems: 1\n  [memory file] memory/blob.md is not indexed: binary file (NUL bytes)\n" in after


def test_qmd_mode_status_after_searches_does_not_ask_for_an_index_run(ws: Path, env: dict[str, str], tmp_path: Path,
                                                                      qmd_bin: Path) -> None:
    """qmd indexed the files for the searches; before, status still said they were not checked
    (the builtin engine, which never ran, had no sync time) and told the user to run index."""
    cfg = tmp_path / "qmd.json5"
    cfg.write_text(f"{{memory: {{backend: 'qmd', qmd: {{command: '{qmd_bin}'}}}}}}")
    args = ["--workspace", str(ws), "--config", str(cfg)]
    for query in ("router", "Atlas rollback"):
        found = run(["search", query, *args, "--json"], env)
        assert orjson.loads(found.stdout)["backend"] == "qmd", found.stderr
    status = run(["status", *args], env).stdout
    assert "Backend: qmd\n" in status and "Problems: none\n" in status
    assert "none found yet" not in status


def test_a_search_waiting_for_another_process_s_first_index_says_so(ws: Path, env: dict[str, str],
                                                                    tmp_path: Path) -> None:
    """A first search while another process holds the index's writer lock (building the
    first index) printed nothing until the lock came free: its first stderr line now names
    the wait and the other process, then the search answers once the lock is released."""
    db = tmp_path / "state" / "memory" / "main.sqlite"
    db.parent.mkdir(parents=True)
    holder = subprocess.Popen(
        [sys.executable, str(REPO / "tests" / "fallback" / "store_child.py"),
         json.dumps({"role": "hold-lock", "db": str(db)})],
        text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=REPO, env=env)
    search = None
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        search = subprocess.Popen(cli_argv(["search", "router", "--workspace", str(ws)]), env=env,
                                  text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert search.stderr is not None
        assert search.stderr.readline() == (
            f"indexing: waiting for the index another process (pid {holder.pid}) is building\n")
    finally:
        holder.communicate("\n", timeout=60)
        if search is not None:
            out, _ = search.communicate(timeout=120)
    assert search is not None and search.returncode == 0 and "router" in out.lower(), out


def test_memory_paths_that_are_not_notes_say_what_to_do(tmp_path: Path, env: dict[str, str]) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "MEMORY.md").write_text("# Notes\n\nThe router dropped the WAN link.\n")
    (ws / "memory").write_text("a file where the daily-notes folder belongs\n")
    (ws / "notes.txt").write_text("plain text\n")
    os.mkfifo(ws / "pipe.md")
    cfg = tmp_path / "cfg.json5"
    cfg.write_text("{agents: {defaults: {memorySearch: {extraPaths: ['notes.txt', 'pipe.md', 'more']}}}}")
    (ws / "more").mkdir()
    os.mkfifo(ws / "more" / "queue.md")
    args = ["--workspace", str(ws), "--config", str(cfg)]
    assert run(["index", *args], env).returncode == 0
    status = orjson.loads(run(["status", *args, "--json"], env).stdout)
    other = "point the entry at a .md file or a folder, or remove it from memorySearch.extraPaths"
    assert status["problems"] == [
        {"check": "memory file", "message": "more/queue.md is not indexed: not a regular file",
         "hint": "memory files are regular Markdown files; move it out of the memory folders"},
        {"check": "memory paths", "message": f"memory is not a directory: {ws / 'memory'}",
         "hint": "rename that file (move its notes into MEMORY.md): memory/ is the folder of the daily notes"},
        {"check": "memory paths", "message": f"extra path is not a Markdown file: {ws / 'notes.txt'}",
         "hint": other},
        {"check": "memory paths", "message": f"extra path is not a regular file or folder: {ws / 'pipe.md'}",
         "hint": other}]
    hits = orjson.loads(run(["search", "router WAN", *args, "--json"], env).stdout)["results"]
    assert [(h["path"], h["startLine"], h["endLine"]) for h in hits] == [("MEMORY.md", 1, 3)]


def test_index_says_why_it_rebuilt_in_full(tmp_path: Path, env: dict[str, str]) -> None:
    from tests.fallback.embeddings_fake_server import serve
    from tests.fallback.test_embeddings_http import openai_reply

    ws = tmp_path / "ws"
    (ws / "extra").mkdir(parents=True)
    (ws / "MEMORY.md").write_text("# Notes\n\nThe router dropped the WAN link.\n")
    (ws / "extra" / "more.md").write_text("# More\n\nThe switch was replaced.\n")
    cfg = tmp_path / "cfg.json5"
    args = ["index", "--workspace", str(ws), "--config", str(cfg)]
    with serve(openai_reply, max_requests=1000) as srv:
        steps = [
            ("{provider: 'none'}", None),
            ("{provider: 'none', extraPaths: ['extra']}", "scope changed"),
            (f"{{provider: 'openai', model: 'text-embedding-3-small', extraPaths: ['extra'], "
             f"remote: {{baseUrl: '{srv.url}', apiKey: 'sk-test-1', headers: {{'X-Team': 'a'}}}}}}",
             "model changed (fts-only -> text-embedding-3-small)"),
            (f"{{provider: 'openai', model: 'text-embedding-3-small', extraPaths: ['extra'], "
             f"remote: {{baseUrl: '{srv.url}', apiKey: 'sk-test-1', headers: {{'X-Team': 'b'}}}}}}",
             "provider settings changed"),
            (f"{{provider: 'mistral', model: 'text-embedding-3-small', extraPaths: ['extra'], "
             f"remote: {{baseUrl: '{srv.url}', apiKey: 'sk-test-1', headers: {{'X-Team': 'b'}}}}}}",
             "provider changed (openai -> mistral)"),
        ]
        for search, why in steps:
            cfg.write_text(f"{{agents: {{defaults: {{memorySearch: {search}}}}}}}")
            first = run(args, env)
            files = 1 if why is None else 2
            assert (first.returncode, first.stdout) == (0, f"Memory index updated (main): {files} files, {files} "
                                                           f"chunks{f'; rebuilt in full ({why})' if why else ''}.\n")
            again = orjson.loads(run([*args, "--json"], env).stdout)  # nothing changed since
            assert (again["forced"], again["rebuilt"]) == (False, None)
        forced = orjson.loads(run([*args, "--force", "--json"], env).stdout)
        assert (forced["forced"], forced["rebuilt"]) == (True, "force")
