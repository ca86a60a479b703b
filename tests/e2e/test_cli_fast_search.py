"""A one-shot ``qmdbridge search`` without a daemon: once a search recorded its settings, the next
one on an index in sync answers without the config models, pydantic, anyio or the engine (the
import budget is pinned by the modules a real process loads, not by time), with the same bytes
on stdout and stderr as the engine's run; anything changed runs the engine as before. Only the
import budget needs a fresh interpreter; the other tests run the command in this process."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from fallback.index.racy import racily_clean, wall_clock_ms
from tests.e2e.cli_proc import run_cli_in_process
from tests.fallback.same_stamps import rewrite_keeping_size_and_mtime

# Made lazy for this path (`regex` too: an ASCII query without a connector, a year or an
# apostrophe, whose snippets need no cut inside a line, compiles no Unicode-property pattern;
# `orjson` too: scores print alike through the standard library); loading one of them again is a
# regression.
NOT_LOADED = ("pydantic", "pydantic_core", "anyio", "asyncio", "numpy", "llama_cpp", "watchdog", "mcp",
              "rich", "httpx", "tenacity", "filelock", "psutil", "json5", "wcmatch", "regex", "socket",
              "shutil", "hashlib", "orjson", "qmdbridge.config", "qmdbridge.manager", "qmdbridge.cli.commands",
              "fallback.models", "fallback.settings", "fallback.engine.builtin", "fallback.store.db",
              "fallback.embeddings", "fallback.index.indexer", "fallback.search.pipeline",
              "fallback.search.rerank")
# Never needed by a keyword-only one-shot search, even one that syncs first.
NEVER_LOADED = ("numpy", "llama_cpp", "watchdog", "mcp", "rich", "httpx", "fallback.search.rerank",
                "fallback.engine.live", "fallback.sources.watcher", "fallback.store.vectors",
                "qmdbridge.server.mcp_server", "qmdbridge.server.socket_listener")

# A stamp for notes a test writes, well before any sync reads them (a note stamped within a tick
# of the scan that read it is racily clean and left to the engine: fallback/index/racy.py).
PAST_NS = 1_600_000_000_000_000_000

PROBE = """
import json, sys
from qmdbridge.cli.main import main
code = main(sys.argv[1:])
sys.stdout.flush()
names = NAMES
loaded = sorted(n for n in names if n in sys.modules)
sys.stderr.write("\\nPROBE " + json.dumps({"code": code, "loaded": loaded,
                 "inProcess": "qmdbridge.cli.commands" in sys.modules}))
sys.exit(code)
""".replace("NAMES", repr(sorted(set(NOT_LOADED) | set(NEVER_LOADED))))


def probe_process(argv: list[str], env: dict[str, str], cwd: Path | None = None) -> dict[str, Any]:
    """Run ``qmdbridge <argv>`` in a fresh interpreter; its exit code, output and loaded modules
    (what a process loads is the subject, so this one starts a process)."""
    p = subprocess.run([sys.executable, "-c", PROBE, *argv], env=env, capture_output=True, timeout=120,
                       cwd=cwd)
    stderr, _, tail = p.stderr.decode().rpartition("\nPROBE ")
    report = json.loads(tail)
    assert p.returncode == report["code"], p.stderr
    return {**report, "stdout": p.stdout, "stderr": stderr}


def probe(argv: list[str], env: dict[str, str], cwd: Path | None = None) -> dict[str, Any]:
    """Run ``qmdbridge <argv>`` in this process (``run_cli_in_process``): its exit code, output,
    and whether the engine answered (``inProcess``: the command reached
    ``qmdbridge.cli.commands.run_command``, which an answer from the recorded settings never
    calls; the real function runs either way)."""
    import qmdbridge.cli.commands as commands

    calls: list[str] = []
    run_command = commands.run_command

    def counted(*args: Any, **kwargs: Any) -> int:
        calls.append(args[0].command)
        return run_command(*args, **kwargs)

    commands.run_command = counted
    try:
        p = run_cli_in_process(argv, env, cwd=cwd)
    finally:
        commands.run_command = run_command
    return {"code": p.returncode, "stdout": p.stdout, "stderr": p.stderr.decode(), "inProcess": bool(calls)}


def config_settled(env: dict[str, str]) -> None:
    """Wait until the config file's last change is out of the racy window of a run starting
    now: a run that took its key within that window of a config write records nothing (the
    config is racily clean then, fallback/index/racy.py), and runs in this process follow each
    other well within it."""
    cfg = Path(env["OPENCLAW_STATE_DIR"]) / "openclaw.json"
    if cfg.exists():
        changed_ns = cfg.stat().st_ctime_ns
        while racily_clean(changed_ns, wall_clock_ms()):
            time.sleep(0.005)


def settled(argv: list[str], env: dict[str, str]) -> dict[str, Any]:
    """The run after an engine run that recorded its settings: once the config is out of the
    racy window (:func:`config_settled`), one more engine run may come first (it records them)."""
    config_settled(env)
    report = probe(argv, env)
    return probe(argv, env) if report["inProcess"] else report


@pytest.fixture
def fenv(env: dict[str, str]) -> dict[str, str]:
    return {**env, "QMDBRIDGE_DAEMON": "off"}


@pytest.mark.slow
def test_a_search_that_changes_nothing_loads_none_of_the_heavy_modules(ws: Path, fenv: dict[str, str]) -> None:
    argv = ["search", "router dropped the WAN link", "--workspace", str(ws), "--json"]
    first = probe_process(argv, fenv)  # indexes the workspace, records the settings
    assert first["inProcess"] and first["code"] == 0
    assert [m for m in first["loaded"] if m in NEVER_LOADED] == []
    second = probe_process(argv, fenv)
    assert not second["inProcess"] and second["code"] == 0
    assert second["loaded"] == []
    assert second["stdout"] == first["stdout"] and second["stderr"] == first["stderr"] == ""
    doc = orjson.loads(second["stdout"])
    assert doc["servedBy"] == "process" and doc["results"][0]["path"] == "memory/2026-11-05.md"


QUERIES = [
    ["router dropped the WAN link", "--json"],
    ["router dropped the WAN link"],
    ["東京チーム", "--json"],
    ["Parquet schema"],
    ["nonexistent_xyz_keyword"],
    ["nonexistent_xyz_keyword", "--json"],
    ["backup", "--max-results", "2", "--json"],
    ["the team meeting notes", "--min-score", "0", "--max-results", "20", "--json"],
]


def _assert_same_but_decay(fast: Any, engine: Any) -> None:
    """Equal documents but for the scores, which may differ by 1e-4: temporal decay reads the
    clock, which moves between two processes (a 7-day half-life moves a score by about 1e-6 a
    second). Rounding both to a few decimals is not enough: two scores on either side of a
    rounding boundary differ in the last digit however close they are."""
    scores = [r["score"] for r in engine["results"]]
    assert [r["score"] for r in fast["results"]] == pytest.approx(scores, abs=1e-4)
    assert ({**fast, "results": [{**r, "score": None} for r in fast["results"]]}
            == {**engine, "results": [{**r, "score": None} for r in engine["results"]]})


@pytest.mark.parametrize("config", [
    {}, {"memory": {"citations": "off"}},
    {"agents": {"defaults": {"memorySearch": {
        "query": {"maxResults": 3, "hybrid": {"temporalDecay": {"enabled": True, "halfLifeDays": 7}}},
        "extraPaths": [{"path": "memory/projects", "pattern": "*.md"}]}}}},
])
def test_the_answer_is_the_in_process_answer_byte_for_byte(ws: Path, fenv: dict[str, str],
                                                           config: dict[str, Any]) -> None:
    state = Path(fenv["OPENCLAW_STATE_DIR"])
    state.mkdir()
    (state / "openclaw.json").write_text(json.dumps(config))
    config_settled(fenv)
    decay = "agents" in config
    off = {**fenv, "QMDBRIDGE_CLI_CACHE": "off"}
    for q in QUERIES:
        argv = ["search", *q, "--workspace", str(ws)]
        engine = probe(argv, off)
        assert engine["inProcess"]
        probe(argv, fenv)  # records the settings of this command line
        fast = probe(argv, fenv)
        assert not fast["inProcess"], q
        assert (fast["code"], fast["stderr"]) == (engine["code"], engine["stderr"]), q
        if decay and "--json" in q:
            _assert_same_but_decay(orjson.loads(fast["stdout"]), orjson.loads(engine["stdout"]))
        elif not decay:
            assert fast["stdout"] == engine["stdout"], q
    footer = b"Source: memory/2026-11-05.md#L" in probe(
        ["search", "router dropped the WAN link", "--workspace", str(ws)], fenv)["stdout"]
    assert footer is (config != {"memory": {"citations": "off"}})


def test_a_dirty_index_is_synced_before_the_search(ws: Path, fenv: dict[str, str]) -> None:
    def search(query: str) -> dict[str, Any]:
        report = probe(["search", query, "--workspace", str(ws), "--json"], fenv)
        return {**report, "paths": [r["path"] for r in orjson.loads(report["stdout"])["results"]]}

    assert search("Kestrel")["inProcess"]
    assert not search("Kestrel")["inProcess"]
    note = ws / "memory" / "2026-11-28.md"
    note.write_text(note.read_text() + "\n- zanzibar uplink ordered\n")
    os.utime(note, ns=(PAST_NS, PAST_NS))  # saved well before the sync reads it: not racily clean
    changed = search("zanzibar")
    assert changed["inProcess"] and changed["paths"] == ["memory/2026-11-28.md"]
    again = search("zanzibar")
    assert not again["inProcess"] and again["paths"] == ["memory/2026-11-28.md"]
    (ws / "memory" / "2026-12-01.md").write_text("# 2026-12-01\n\n- quokka audit passed\n")
    os.utime(ws / "memory" / "2026-12-01.md", ns=(PAST_NS, PAST_NS))
    added = search("quokka")
    assert added["inProcess"] and added["paths"] == ["memory/2026-12-01.md"]
    (ws / "memory" / "2026-12-01.md").unlink()
    gone = search("quokka")
    assert gone["inProcess"] and gone["paths"] == []
    (ws / "memory" / ".draft.md").write_text("quokka draft\n")  # skipped: status must list it
    assert search("quokka")["inProcess"]
    status = probe(["status", "--workspace", str(ws), "--json"], fenv)
    assert {"path": "memory/.draft.md", "reason": "hidden name (not memory)"} in orjson.loads(
        status["stdout"])["skipped"]
    assert not search("quokka")["inProcess"]


def test_a_changed_config_runs_in_process_and_is_used_from_then_on(ws: Path, fenv: dict[str, str]) -> None:
    argv = ["search", "router dropped the WAN link", "--workspace", str(ws)]
    assert probe(argv, fenv)["inProcess"]
    assert not probe(argv, fenv)["inProcess"]
    cfg = Path(fenv["OPENCLAW_STATE_DIR"]) / "openclaw.json"
    cfg.write_text("{memory: {citations: 'off'}}")
    edited = probe(argv, fenv)
    assert edited["inProcess"] and b"Source: " not in edited["stdout"]
    fast = settled(argv, fenv)
    assert not fast["inProcess"] and fast["stdout"] == edited["stdout"]
    cfg.write_text("{memory: {citations: 'off', qmd: {limits: {timeoutMs: 'soon'}}}}")
    bad = probe(argv, fenv)
    assert bad["code"] == 2 and bad["inProcess"]  # the loader's error, as without recorded settings
    assert bad["stderr"].splitlines()[0] == (
        f"qmdbridge: {cfg}: memory.qmd.limits.timeoutMs: invalid value 'soon' (expected a "
        "valid integer, unable to parse string as an integer)")


def test_errors_are_the_in_process_ones(ws: Path, fenv: dict[str, str]) -> None:
    assert probe(["search", "router", "--workspace", str(ws)], fenv)["inProcess"]
    for argv, message in [(["search", "   "], "query must not be empty"),
                          (["search", "router", "--max-results", "0"],
                           "max results must be between 1 and 2147483647"),
                          (["search", "router", "--min-score", "2"], "min score must be between 0 and 1")]:
        p = probe([*argv, "--workspace", str(ws)], fenv)
        assert p["code"] == 2 and p["inProcess"] and p["stderr"].startswith(f"qmdbridge: {message}\n")
    for f in sorted(ws.rglob("*"), reverse=True):
        f.unlink() if f.is_file() else f.rmdir()
    ws.rmdir()
    p = probe(["search", "router", "--workspace", str(ws)], fenv)
    assert p["code"] == 2 and p["inProcess"]
    assert p["stderr"].startswith(f"qmdbridge: workspace does not exist: {ws}")


def test_verbose_says_why_it_runs_in_process(ws: Path, fenv: dict[str, str]) -> None:
    argv = ["search", "router", "--workspace", str(ws), "-v"]
    probe(argv, fenv)
    (ws / "memory" / "2026-11-28.md").write_text("# replaced\n")
    report = probe(argv, fenv)
    assert report["inProcess"]
    assert "INFO qmdbridge.cli: one-shot search runs the engine: changed: memory/2026-11-28.md\n" in report["stderr"]
    assert not os.path.exists(Path(fenv["OPENCLAW_STATE_DIR"]) / "daemon")


def test_a_config_rewritten_in_place_with_its_size_and_mtime_is_still_a_change(
        ws: Path, fenv: dict[str, str]) -> None:
    cfg = Path(fenv["OPENCLAW_STATE_DIR"]) / "openclaw.json"
    cfg.parent.mkdir()
    cfg.write_text('{agents: {defaults: {memorySearch: {query: {maxResults: 6}}}}}')
    argv = ["search", "the", "--workspace", str(ws), "--min-score", "0", "--json"]
    assert probe(argv, fenv)["inProcess"]
    six = settled(argv, fenv)
    assert not six["inProcess"] and len(orjson.loads(six["stdout"])["results"]) == 6
    before = cfg.stat()
    with open(cfg, "r+") as f:  # same inode, same size, and the old mtime put back
        f.write('{agents: {defaults: {memorySearch: {query: {maxResults: 2}}}}}')
    os.utime(cfg, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = cfg.stat()
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (before.st_ino, before.st_size, before.st_mtime_ns)
    two = probe(argv, fenv)
    assert two["inProcess"] and len(orjson.loads(two["stdout"])["results"]) == 2
    assert not settled(argv, fenv)["inProcess"]


def test_a_workspace_or_store_reached_through_a_retargeted_symlink_is_searched_where_it_points_now(
        ws: Path, fenv: dict[str, str], tmp_path: Path) -> None:
    other = tmp_path / "other"
    shutil.copytree(ws, other)
    (other / "memory" / "2026-11-05.md").write_text("# 2026-11-05\n\n- the router was replaced by a quokka\n")
    (tmp_path / "stores-a").mkdir()
    (tmp_path / "stores-b").mkdir()
    agent, stores = tmp_path / "agent", tmp_path / "stores"
    agent.symlink_to(ws)
    stores.symlink_to(tmp_path / "stores-a")
    cfg = Path(fenv["OPENCLAW_STATE_DIR"]) / "openclaw.json"
    cfg.parent.mkdir()
    cfg.write_text(json.dumps({"agents": {"defaults": {
        "workspace": str(agent), "memorySearch": {"store": {"path": str(stores / "{agentId}.sqlite")}}}}}))
    argv = ["search", "router", "--json"]

    def paths(report: dict[str, Any]) -> list[str]:
        return [r["path"] for r in orjson.loads(report["stdout"])["results"]]

    assert probe(argv, fenv)["inProcess"]
    assert not settled(argv, fenv)["inProcess"]
    agent.unlink()
    agent.symlink_to(other)  # the configured workspace is another folder now
    moved = probe(argv, fenv)
    assert moved["inProcess"] and paths(moved)[0] == "memory/2026-11-05.md"
    assert "quokka" in orjson.loads(moved["stdout"])["results"][0]["snippet"]
    assert not probe(argv, fenv)["inProcess"]
    stores.unlink()
    stores.symlink_to(tmp_path / "stores-b")  # the configured store is another (new) file now
    assert probe(argv, fenv)["inProcess"]
    assert (tmp_path / "stores-b" / "main.sqlite").is_file()
    assert not probe(argv, fenv)["inProcess"]


def test_a_cache_folder_others_may_write_is_not_trusted_and_is_made_private_again(
        ws: Path, fenv: dict[str, str]) -> None:
    argv = ["search", "router", "--workspace", str(ws), "-v"]
    assert probe(argv, fenv)["inProcess"]
    folder = Path(fenv["OPENCLAW_STATE_DIR"]) / "cli-cache"
    (recorded,) = folder.iterdir()
    assert (folder.stat().st_mode & 0o777, recorded.stat().st_mode & 0o777) == (0o700, 0o600)
    assert not probe(argv, fenv)["inProcess"]
    os.chmod(folder, 0o777)
    report = probe(argv, fenv)
    assert report["inProcess"]
    assert f"INFO qmdbridge.cli: one-shot search runs the engine: {folder} is writable by group or others\n" in (
        report["stderr"])
    assert folder.stat().st_mode & 0o777 == 0o700
    assert not probe(argv, fenv)["inProcess"]


def test_a_note_saved_again_in_the_tick_it_was_indexed_is_not_answered_from_the_old_text(
        ws: Path, fenv: dict[str, str]) -> None:
    argv = ["search", "quokka", "--workspace", str(ws), "--json", "-v"]
    note = ws / "memory" / "2026-11-28.md"
    note.write_text("# 2026-11-28\n\n- [ ] quokka audit\n")
    future = (int(time.time()) + 3600) * 1_000_000_000  # stamped at or after the sync's start
    os.utime(note, ns=(future, future))
    first = probe(argv, fenv)
    assert first["inProcess"] and "- [ ] quokka audit" in first["stdout"].decode()
    unchanged = probe(argv, fenv)  # its row may hold an earlier save of the same stamps
    assert unchanged["inProcess"]
    assert "INFO qmdbridge.cli: one-shot search runs the engine: racily clean: memory/2026-11-28.md\n" in (
        unchanged["stderr"])
    note.write_text("# 2026-11-28\n\n- [x] quokka audit\n")  # same size, the same stamp
    os.utime(note, ns=(future, future))
    ticked = probe(argv, fenv)
    assert ticked["inProcess"]
    # a save in the very tick would keep the ctime too, and be racily clean as above; this one
    # came later, so its ctime tells it apart
    assert "INFO qmdbridge.cli: one-shot search runs the engine: changed: memory/2026-11-28.md\n" in (
        ticked["stderr"])
    assert "- [x] quokka audit" in orjson.loads(ticked["stdout"])["results"][0]["snippet"]


def test_a_note_rewritten_with_its_size_and_mtime_put_back_is_answered_from_the_new_text(
        ws: Path, fenv: dict[str, str]) -> None:
    def search(query: str) -> dict[str, Any]:
        report = probe(["search", query, "--workspace", str(ws), "--json", "-v"], fenv)
        return {**report, "snippets": [(r["path"], r["snippet"])
                                       for r in orjson.loads(report["stdout"])["results"]]}

    before = search("Priya payments")
    assert before["inProcess"] and before["snippets"][0][0] == "memory/2026-11-28.md"
    assert not search("Priya payments")["inProcess"]
    note = ws / "memory" / "2026-11-28.md"
    # an in-place save of the same size whose mtime is put back (touch -r, cp -p, rsync -t)
    rewrite_keeping_size_and_mtime(note, b"Priya: payments", b"Quokk: payments")
    renamed = search("Quokk payments")
    assert renamed["inProcess"]
    assert "INFO qmdbridge.cli: one-shot search runs the engine: changed: memory/2026-11-28.md\n" in (
        renamed["stderr"])
    assert renamed["snippets"][0][0] == "memory/2026-11-28.md"
    assert "- Quokk: payments error rate back to baseline" in renamed["snippets"][0][1]
    again = search("Quokk payments")
    assert not again["inProcess"] and again["snippets"] == renamed["snippets"]
    assert [p for p, _ in search("Quokk")["snippets"]] == ["memory/2026-11-28.md"]


@pytest.mark.slow  # runs as another user: a real process
def test_a_store_this_process_cannot_write_gets_the_in_process_warning(ws: Path, fenv: dict[str, str]) -> None:
    from tests.fallback.child_procs import unprivileged_prefix

    prefix = unprivileged_prefix()
    argv = ["search", "router dropped the WAN link", "--workspace", str(ws), "--json"]
    probe(argv, fenv)  # indexes the workspace and records the settings
    assert not probe(argv, fenv)["inProcess"]
    store = Path(fenv["OPENCLAW_STATE_DIR"]) / "memory" / "main.sqlite"
    off = {**fenv, "QMDBRIDGE_CLI_CACHE": "off"}

    def run(env: dict[str, str]) -> dict[str, Any]:
        p = subprocess.run([*prefix, sys.executable, "-c", PROBE, *argv], env=env, capture_output=True,
                           timeout=120)
        stderr, _, tail = p.stderr.decode().rpartition("\nPROBE ")
        return {**json.loads(tail), "stdout": p.stdout, "stderr": stderr}

    for locked, mode in ((store.parent, 0o555), (store, 0o444)):
        before = locked.stat().st_mode
        locked.chmod(mode)
        try:
            engine, fast = run(off), run(fenv)
        finally:
            locked.chmod(before)
        assert engine["inProcess"] and fast["inProcess"] is (locked == store.parent)
        assert fast["stdout"] == engine["stdout"] and fast["stderr"] == engine["stderr"]
        warnings = orjson.loads(fast["stdout"])["warnings"]
        what = ("the file cannot be written): Permission denied" if locked == store
                else "its directory is read-only): attempt to write a readonly database")
        assert warnings == [f"index store is read-only ({what} ({store}); answered from the index as it "
                            f"was last written, without updating it (check the permissions of {store.parent})"]


def test_a_binary_note_does_not_keep_every_search_in_process(ws: Path, fenv: dict[str, str]) -> None:
    blob = ws / "memory" / "scan.md"
    blob.write_bytes(b"\x00\x01\x02 router dump\n")
    os.utime(blob, ns=(PAST_NS, PAST_NS))
    argv = ["search", "router dropped the WAN link", "--workspace", str(ws), "--json"]
    first = probe(argv, fenv)  # indexes the workspace (the note skipped as binary), records the settings
    assert first["inProcess"]
    fast = probe(argv, fenv)
    assert not fast["inProcess"] and fast["stdout"] == first["stdout"]
    status = orjson.loads(probe(["status", "--workspace", str(ws), "--json"], fenv)["stdout"])
    assert {"path": "memory/scan.md", "reason": "binary file (NUL bytes)"} in status["skipped"]


def test_a_corpus_other_than_all_is_searched_as_asked(ws: Path, fenv: dict[str, str]) -> None:
    argv = ["search", "router dropped the WAN link", "--workspace", str(ws), "--json"]
    assert probe(argv, fenv)["inProcess"]  # records the settings
    assert not probe(argv, fenv)["inProcess"]
    for corpus, paths, warnings in [
        ("wiki", [], ["no wiki corpus is configured: corpus 'wiki' has nothing to search "
                      "(use memory, sessions or all)"]),
        ("sessions", [], ['session transcripts are not indexed: add "sessions" to memorySearch.sources '
                          "and set memorySearch.experimental.sessionMemory to true"]),
        ("memory", ["memory/2026-11-05.md"], []),
    ]:
        p = probe([*argv, "--corpus", corpus], fenv)
        doc = orjson.loads(p["stdout"])
        assert p["code"] == 0
        assert (doc["corpus"], [r["path"] for r in doc["results"]][:1], doc["warnings"]) == (corpus, paths, warnings)


def test_config_warnings_are_told_on_stderr_by_every_search_and_keep_it_in_process(
        ws: Path, fenv: dict[str, str]) -> None:
    cfg = Path(fenv["OPENCLAW_STATE_DIR"]) / "openclaw.json"
    cfg.parent.mkdir(parents=True)
    cfg.write_text('{agents: {defaults: {memorySearch: {provder: "local", provider: "none", '
                   'remote: {baseUrl: "${QB_UNSET_HOST}"}}}}}')
    env = {k: v for k, v in fenv.items() if k != "QB_UNSET_HOST"}
    expected = (f"qmdbridge: config {cfg}: agents.defaults.memorySearch.remote.baseUrl: "
                "${QB_UNSET_HOST} is not set; left as written\n"
                f"qmdbridge: config {cfg}: agents.defaults.memorySearch.provder: unknown key, "
                "ignored (did you mean provider?)\n")
    argv = ["search", "router", "--workspace", str(ws)]
    first = probe(argv, env)
    config_settled(env)
    for report in (first, probe(argv, env), probe([*argv, "--json"], env)):
        assert report["code"] == 0 and report["inProcess"]  # the warnings are read fresh each time
        told = "".join(line for line in report["stderr"].splitlines(keepends=True)
                       if not line.startswith("indexing: "))  # a sync past 1 s shows progress
        assert told == expected
    verbose = probe_process([*argv, "-v"], env)  # a real process: logging's own stderr handler
    assert verbose["code"] == 0
    assert verbose["stderr"].count("provder: unknown key") == 1, verbose["stderr"]
