"""The ``qmdbridge`` process on a degraded builtin engine: a SQLite without FTS5 (keyword search
by substring, said in the answer and in status), and an embedding provider that rate-limits or
never answers (searches answer or fail within ``query.timeoutMs``; ``index`` writes keyword
rows and status shows the chunks waiting for vectors)."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import sqlite3
import struct
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import orjson
import pytest

from tests.e2e.cli_proc import run_cli, run_cli_in_process
from tests.fallback.child_procs import unprivileged_prefix
from tests.fallback.embeddings_fake_server import Recorded, Reply, serve

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "workspace"


def _argv(args: list[str]) -> list[str]:
    exe = shutil.which("qmdbridge")
    return [exe, *args] if exe else [
        sys.executable, "-c", "import sys; from qmdbridge.cli.main import main; sys.exit(main())", *args]


def run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[bytes]:
    """``qmdbridge <args>`` run in this process; ``serve`` and the runs as another user (whose
    file modes apply to a process of theirs) start real processes (``_argv``)."""
    return run_cli_in_process(args, env)


def test_search_without_fts5_answers_by_substring_and_warns(ws: Path, env: dict[str, str]) -> None:
    (ws / "memory" / "tickets.md").write_text("# Tickets\nThe outage ticket is ABC-1234.\n")
    assert run(["index", "--workspace", str(ws), "--json"], env).returncode == 0
    db = Path(env["OPENCLAW_STATE_DIR"]) / "memory" / "main.sqlite"
    with sqlite3.connect(db) as conn:  # what a SQLite without FTS5 leaves (migration m002)
        conn.execute("DROP TABLE chunks_fts")
        conn.execute("DROP TABLE chunks_trigram")
        conn.execute("INSERT OR REPLACE INTO meta(key, value) VALUES ('fts_error', 'no such module: fts5')")
    p = run(["search", "ABC-1234", "--workspace", str(ws), "--json"], env)
    assert p.returncode == 0, p.stderr
    doc = orjson.loads(p.stdout)
    assert [(r["path"], r["startLine"], r["endLine"]) for r in doc["results"]] == [
        ("memory/tickets.md", 1, 2)]
    assert doc["warnings"] == ["FTS5 is unavailable in this SQLite (no such module: fts5): keyword "
                               "search is a substring scan of the chunks, without BM25 ranking"]
    status = orjson.loads(run(["status", "--workspace", str(ws), "--json"], env).stdout)
    assert status["fts"]["keyword"] == "substring" and status["fts"]["available"] is False
    human = run(["status", "--workspace", str(ws)], env).stdout.decode()
    assert "FTS: unavailable unicode61 (keyword search: substring scan)" in human


# -- an embedding provider that rate-limits or never answers (a real server on 127.0.0.1) ----

LIMITED_ERROR = ("memory search unavailable: openai-compatible: query embedding failed: "
                 "openai-compatible embedding failed (HTTP 429): Rate limit reached for requests")


def _provider_config(tmp_path: Path, url: str, *, keyword_fallback: bool = False,
                     silent: bool = False) -> Path:
    """The provider's config; the deadlines are short (1 s, 1.5 s) for a ``silent`` provider only:
    a loaded machine can take longer than that to answer from the server in this process."""
    batch_s, query_ms = (1, 1500) if silent else (120, 120_000)
    cfg = tmp_path / "openclaw.json5"
    cfg.write_text(
        "{agents: {defaults: {memorySearch: {provider: 'openai-compatible', model: 'mini-embed',"
        f" remote: {{baseUrl: '{url}'}}, sync: {{embeddingBatchTimeoutSeconds: {batch_s}}},"
        f" query: {{timeoutMs: {query_ms}, keywordFallback: {'true' if keyword_fallback else 'false'}}}"
        "}}}}")
    return cfg


def _limited(req: Recorded) -> Reply:
    return Reply(429, {"error": {"message": "Rate limit reached for requests"}},
                 {"Retry-After": "3600"})


def _silent(req: Recorded) -> Reply:
    return Reply(200, {"data": []}, delay_s=600)


def test_rate_limited_provider_index_writes_keywords_and_search_fails_fast(
        tmp_path: Path, ws: Path, env: dict[str, str]) -> None:
    with serve(_limited, max_requests=1000) as srv:
        cfg = _provider_config(tmp_path, srv.url)
        common = ["--workspace", str(ws), "--config", str(cfg), "--json"]
        indexed = run(["index", *common], env)
        assert indexed.returncode == 0, indexed.stderr
        status = orjson.loads(indexed.stdout)["status"]
        assert status["files"] == 15 and status["chunks"] == status["vector"]["pending"] > 0
        assert status["dirty"] is True and status["healthy"] is False
        assert status["vector"]["providerError"].startswith(
            "openai-compatible embedding failed (HTTP 429): Rate limit reached for requests")
        found = run(["search", "router dropped the WAN link", *common], env)
        assert found.returncode == 1
        assert orjson.loads(found.stdout)["error"] == LIMITED_ERROR
        opted = _provider_config(tmp_path, srv.url, keyword_fallback=True)
        p = run(["search", "router dropped the WAN link", "--workspace", str(ws), "--config",
                 str(opted), "--json"], env)
        assert p.returncode == 0, p.stderr
        doc = orjson.loads(p.stdout)
        assert doc["results"][0]["path"] == "memory/2026-11-05.md"
        assert doc["warnings"] == [LIMITED_ERROR.removeprefix(
            "memory search unavailable: openai-compatible: ") + "; results come from keyword search only"]


def test_a_query_embedding_failure_of_one_search_is_in_the_next_processs_status(
        tmp_path: Path, ws: Path, env: dict[str, str]) -> None:
    def fails_on_quokka(req: Recorded) -> Reply:
        texts = req.json["input"]
        if any("quokka" in t for t in texts):
            return Reply(500, {"error": {"message": "model overloaded"}})
        return Reply(200, {"data": [{"index": i, "embedding": [1.0, float(len(t) % 7), 0.5]}
                                    for i, t in enumerate(texts)]})

    with serve(fails_on_quokka, max_requests=1000) as srv:
        cfg = _provider_config(tmp_path, srv.url, keyword_fallback=True)
        common = ["--workspace", str(ws), "--config", str(cfg), "--json"]
        assert run(["index", *common], env).returncode == 0
        found = run(["search", "quokka router dropped the WAN link", *common], env)
        assert found.returncode == 0, found.stderr
        failure = ("query embedding failed: openai-compatible embedding failed (HTTP 500): "
                   "model overloaded")
        assert orjson.loads(found.stdout)["warnings"] == [
            f"{failure}; results come from keyword search only"]
        status = orjson.loads(run(["status", *common], env).stdout)  # another process
        assert (status["healthy"], status["lastError"], status["vector"]["providerError"]) == (
            False, None, failure)
        assert run(["search", "router dropped the WAN link", *common], env).returncode == 0
        status = orjson.loads(run(["status", *common], env).stdout)
        assert (status["healthy"], status["vector"]["providerError"]) == (True, None)
    gone = run(["search", "router dropped the WAN link", *common], env)  # the provider went away
    assert gone.returncode == 0 and orjson.loads(gone.stdout)["warnings"] == [
        "query embedding failed: openai-compatible embedding failed: request failed: All connection "
        "attempts failed; results come from keyword search only"]
    assert orjson.loads(gone.stdout)["results"][0]["path"] == "memory/2026-11-05.md"


@pytest.mark.slow
def test_silent_provider_costs_serve_its_deadline_only(tmp_path: Path, ws: Path,
                                                      env: dict[str, str]) -> None:
    with serve(_silent, max_requests=1000) as srv:
        cfg = _provider_config(tmp_path, srv.url, silent=True)
        lines = [b'{"id": 1, "tool": "memory_search", "params": {"query": "Atlas rollback"}}',
                 b'{"id": 2, "tool": "status"}']
        p = subprocess.run(_argv(["serve", "--workspace", str(ws), "--config", str(cfg)]),
                           env=env, capture_output=True, timeout=120,
                           input=b"\n".join(lines) + b"\n")
        assert p.returncode == 0, p.stderr
        replies = {r["id"]: r["result"] for r in map(orjson.loads, p.stdout.splitlines())}
        assert replies[1]["disabled"] is True and replies[1]["results"] == []
        assert replies[1]["error"] == (
            "memory search unavailable: openai-compatible: query embedding failed: "
            "openai-compatible embedding failed: query embedding timed out after 1500 ms "
            "(query.timeoutMs)")
        assert replies[2]["backend"] == "builtin"
        opted = _provider_config(tmp_path, srv.url, keyword_fallback=True, silent=True)
        found = run(["search", "Atlas rollback", "--workspace", str(ws), "--config", str(opted),
                     "--json"], env)
        assert found.returncode == 0, found.stderr
        doc = orjson.loads(found.stdout)
        assert doc["results"] and doc["results"][0]["path"].startswith("memory/2026-11-")
        assert doc["warnings"][0].endswith(
            "query embedding timed out after 1500 ms (query.timeoutMs); results come from "
            "keyword search only")


def test_qmd_missing_and_the_builtin_fallback_failing_closed_names_both_reasons(
        tmp_path: Path, ws: Path, env: dict[str, str]) -> None:
    cfg = tmp_path / "openclaw.json5"
    cfg.write_text(f"{{memory: {{backend: 'qmd', qmd: {{command: '{tmp_path / 'no-qmd'}'}}}}, "
                   "agents: {defaults: {memorySearch: {provider: 'openai'}}}}")
    common = ["search", "router", "--workspace", str(ws), "--config", str(cfg)]
    p = run([*common, "--json"], env)
    assert (p.returncode, orjson.loads(p.stdout)) == (1, {
        "error": f"qmd unavailable: qmd not found (command '{tmp_path / 'no-qmd'}'); searched: "
                 f"{tmp_path}; builtin fallback unavailable: no API key found for openai",
        "errorType": "BackendUnavailableError", "exitCode": 1})
    plain = run(common, env)  # the next start-up is put off: said with the wait
    assert plain.returncode == 1 and plain.stdout == b""
    assert re.fullmatch(rf"qmdbridge: qmd unavailable: qmd not found \(command '{re.escape(str(tmp_path))}"
                        r"/no-qmd'\); searched: .* \(start-up retry in \d+s\); builtin fallback "
                        r"unavailable: no API key found for openai\n", plain.stderr.decode()), plain.stderr


# -- a corrupt index store, met by a one-shot search ---------------------------------------------

def test_corrupt_store_is_told_on_stderr_and_only_the_newest_copies_are_kept(
        ws: Path, env: dict[str, str]) -> None:
    """Real processes: the copies are named by the second they were moved aside in, and runs in
    this process follow each other within one."""
    run = run_cli  # this test only: the in-process runner is shadowed

    from fallback.store.files import CORRUPT_BACKUPS_KEPT

    assert run(["index", "--workspace", str(ws)], env).returncode == 0
    db = Path(env["OPENCLAW_STATE_DIR"]) / "memory" / "main.sqlite"
    told: list[str] = []
    for _ in range(CORRUPT_BACKUPS_KEPT + 1):  # the last one removes the oldest copy
        db.write_bytes(b"this is not an SQLite database" * 100)
        p = run(["search", "router dropped the WAN link", "--workspace", str(ws)], env)
        assert p.returncode == 0, p.stderr
        assert p.stdout.decode().startswith("1.000 memory/2026-11-05.md:1-5"), p.stdout  # rebuilt, answered
        notes = re.findall(r"^warning: index store was corrupt \(index store is corrupt: file is not a "
                           rf"database \({re.escape(str(db))}\)\); moved aside to (main\.sqlite\.corrupt-"
                           r"\d{8}T\d{6}Z(?:-\d+)?) and rebuilt from the memory files$",
                           p.stderr.decode(), flags=re.MULTILINE)
        assert len(notes) == 1, p.stderr
        told.append(notes[0])
    kept = sorted(f.name for f in db.parent.iterdir() if ".corrupt-" in f.name)
    assert kept == sorted(told[-CORRUPT_BACKUPS_KEPT:])
    again = run(["index", "--workspace", str(ws)], env)  # told once: the next command is quiet
    assert again.returncode == 0 and b"warning" not in again.stderr, again.stderr
    db.write_bytes(b"this is not an SQLite database" * 100)
    index = run(["index", "--workspace", str(ws)], env)
    assert index.returncode == 0 and re.search(
        rb"^warning: index store was corrupt .*; moved aside to main\.sqlite\.corrupt-", index.stderr,
        flags=re.MULTILINE), index.stderr


def test_a_damaged_full_text_index_is_moved_aside_and_rebuilt_and_a_match_failure_scans(
        ws: Path, env: dict[str, str]) -> None:
    """``PRAGMA quick_check`` does not read FTS5's own pages: a store whose ``chunks_fts`` data is
    lost is told corrupt by FTS5's integrity-check, moved aside and rebuilt. A ``MATCH`` that
    fails without damage the store can see (here FTS5's config row of another format version)
    is answered by a LIKE scan of the query's words, rank 0."""
    common = ["--workspace", str(ws), "--json"]
    assert run(["index", *common], env).returncode == 0
    db = Path(env["OPENCLAW_STATE_DIR"]) / "memory" / "main.sqlite"
    with sqlite3.connect(db) as conn:
        conn.execute("DELETE FROM chunks_fts_data")
    p = run(["search", "router dropped the WAN link", *common], env)
    assert p.returncode == 0, p.stdout
    doc = orjson.loads(p.stdout)
    assert (doc["results"][0]["path"], doc["results"][0]["startLine"]) == ("memory/2026-11-05.md", 1)
    assert len(doc["warnings"]) == 1 and re.fullmatch(
        r"index store was corrupt \(index store is corrupt \(a virtual table is damaged\): vtable "
        rf"constructor failed: chunks_fts \({re.escape(str(db))}\)\); moved aside to main\.sqlite\."
        r"corrupt-\d{8}T\d{6}Z and rebuilt from the memory files", doc["warnings"][0]), doc["warnings"]
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE chunks_fts_config SET v = 99 WHERE k = 'version'")
    scan = orjson.loads(run(["search", "router", *common], env).stdout)
    assert [(r["path"], r["startLine"], r["score"]) for r in scan["results"]] == [
        ("MEMORY.md", 10, 1.0), ("memory/2026-11-05.md", 1, 1.0)]


# -- one agent's store, searched for two workspaces ----------------------------------------------

def test_switching_workspaces_tells_once_per_switch_that_the_store_is_reindexed(
        ws: Path, env: dict[str, str], tmp_path: Path) -> None:
    other = tmp_path / "other"
    shutil.copytree(ws, other)
    (other / "MEMORY.md").write_text("# Other\nThe router of the other workspace.\n")
    db = Path(env["OPENCLAW_STATE_DIR"]) / "memory" / "main.sqlite"

    def search(where: Path) -> str:
        p = run(["search", "router", "--workspace", str(where), "--json"], env)
        assert p.returncode == 0, p.stderr
        assert b"warning" not in p.stderr, p.stderr  # --json: the warnings are in the document
        return "\n".join(orjson.loads(p.stdout)["warnings"])

    def note(held: Path, now: Path) -> str:
        return (f"index store {db} held workspace {held}; re-indexing it for {now} (one index per "
                "agent: every switch re-indexes it; to keep both indexed, give each workspace its "
                "own agent (--agent, agents.list) or state dir (OPENCLAW_STATE_DIR))")

    assert search(ws) == ""  # the first index of the store: nothing was switched
    assert search(other) == note(ws, other)
    assert search(other) == ""  # told once per switch
    plain = run(["search", "router", "--workspace", str(ws)], env)
    assert plain.returncode == 0 and f"warning: {note(other, ws)}\n" in plain.stderr.decode()
    assert search(ws) == ""
    index = run(["index", "--workspace", str(other)], env)
    assert index.returncode == 0 and f"warning: {note(ws, other)}\n" in index.stderr.decode()


def _other_workspace(tmp_path: Path) -> Path:
    other = tmp_path / "other"
    (other / "memory").mkdir(parents=True)
    (other / "MEMORY.md").write_text("# Other\nThe router of the other workspace is a MikroTik.\n")
    return other


def test_without_sync_on_search_a_store_of_another_workspace_is_reindexed_before_answering(
        ws: Path, env: dict[str, str], tmp_path: Path) -> None:
    """``sync.onSearch: false`` keeps a search from syncing an index of this workspace; an index
    of another one (the same agent's store, ``--workspace`` switched) is not this workspace's
    memory, so the search re-indexes it first and says so, as ``onSearch: true`` does."""
    other = _other_workspace(tmp_path)
    cfg = tmp_path / "no-sync.json5"
    cfg.write_text("{agents: {defaults: {memorySearch: {sync: {onSearch: false}}}}}")
    db = Path(env["OPENCLAW_STATE_DIR"]) / "memory" / "main.sqlite"

    def search(where: Path) -> tuple[list[str], list[str]]:
        p = run(["search", "router", "--workspace", str(where), "--config", str(cfg), "--json"], env)
        assert p.returncode == 0, p.stderr
        doc = orjson.loads(p.stdout)
        return sorted({r["path"] for r in doc["results"]}), doc["warnings"]

    note = (f"index store {db} held workspace {ws}; re-indexing it for {other} (one index per "
            "agent: every switch re-indexes it; to keep both indexed, give each workspace its "
            "own agent (--agent, agents.list) or state dir (OPENCLAW_STATE_DIR))")
    mine = search(ws)
    assert mine == (["MEMORY.md", "memory/2026-11-05.md"], [])
    held = orjson.loads(run(["status", "--workspace", str(other), "--config", str(cfg), "--json"],
                            env).stdout)
    assert (held["dirty"], held["dirtyReason"]) == (True, f"index holds workspace {ws}")
    assert search(other) == (["MEMORY.md"], [note])
    assert search(other) == (["MEMORY.md"], [])
    back, told = search(ws)
    assert back == mine[0] and told[0].startswith(f"index store {db} held workspace {other};")
    (other / "memory" / "2026-12-01.md").write_text("The router got a new firmware.\n")
    assert search(ws) == (mine[0], [])  # onSearch off: this workspace's index is not synced again


@pytest.mark.slow
def test_a_read_only_store_of_another_workspace_answers_nothing_and_says_why(
        ws: Path, env: dict[str, str], tmp_path: Path) -> None:
    other = _other_workspace(tmp_path)
    state = Path(env["OPENCLAW_STATE_DIR"])
    db = state / "memory" / "main.sqlite"
    assert run(["index", "--workspace", str(ws)], env).returncode == 0
    with _read_only(state, env) as run_ro:
        p = run_ro(["search", "router", "--workspace", str(other), "--json"])
        assert p.returncode == 0, p.stderr
        doc = orjson.loads(p.stdout)
        assert doc["results"] == []
        assert doc["warnings"][-1] == (
            f"index store {db} holds workspace {ws}, not {other}, and cannot be re-indexed: no "
            "results from it")
        plain = run_ro(["search", "router", "--workspace", str(other)])
        assert plain.returncode == 0 and plain.stdout == b"No matches.\n"
        assert f"warning: index store {db} holds workspace {ws}, not {other}".encode() in plain.stderr


# -- a state dir this process may not write ------------------------------------------------------

@contextlib.contextmanager
def _read_only(state: Path, env: dict[str, str]
               ) -> Iterator[Callable[[list[str]], subprocess.CompletedProcess[bytes]]]:
    """``state`` and everything under it made read-only for the block, which gets a runner of
    the CLI for which those modes apply (:func:`unprivileged_prefix`); the modes are restored
    after it."""
    modes = {p: p.stat().st_mode for p in [state, *state.rglob("*")]}
    for p in modes:
        p.chmod(modes[p] & ~0o222)
    prefix = unprivileged_prefix()

    def run_ro(args: list[str]) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run([*prefix, *_argv(args)], env=env, capture_output=True, timeout=120)

    try:
        yield run_ro
    finally:
        for p, mode in modes.items():
            p.chmod(mode)


def _warnings_after_a_new_note(run_ro: Callable[[list[str]], subprocess.CompletedProcess[bytes]],
                               ws: Path, query: list[str],
                               hits: list[tuple[str, int, int]]) -> list[str]:
    """Write a new note the read-only engine cannot index, search again: the hits must be the
    ones before it; returns the answer's warnings."""
    (ws / "memory" / "2026-11-30.md").write_text("The router dropped the WAN link again.\n")
    stale = run_ro(query)
    assert stale.returncode == 0, stale.stderr
    doc = orjson.loads(stale.stdout)
    assert [(r["path"], r["startLine"], r["endLine"]) for r in doc["results"]] == hits
    return list(doc["warnings"])


@pytest.mark.slow
def test_read_only_state_dir_searches_answer_from_the_index_and_say_it_is_not_updated(
        ws: Path, env: dict[str, str]) -> None:
    state = Path(env["OPENCLAW_STATE_DIR"])
    db = state / "memory" / "main.sqlite"
    query = ["search", "router dropped the WAN link", "--workspace", str(ws), "--json"]
    first = run(query, env)  # indexes, and records the one-shot settings
    assert first.returncode == 0, first.stderr
    hits = [(r["path"], r["startLine"], r["endLine"]) for r in orjson.loads(first.stdout)["results"]]
    with _read_only(state, env) as run_ro:
        denied = subprocess.run([*unprivileged_prefix(), sys.executable, "-c", f"open({str(db.parent / 'x')!r}, 'w')"],
                                capture_output=True, timeout=60)
        assert b"PermissionError" in denied.stderr, denied.stderr  # the folder really is read-only
        fast = run_ro(query)  # nothing changed: answered from the index as it is, and said so
        assert fast.returncode == 0, fast.stderr
        assert [(r["path"], r["startLine"], r["endLine"]) for r in orjson.loads(fast.stdout)["results"]] == hits
        assert orjson.loads(fast.stdout)["warnings"] == [
            "index store is read-only (its directory is read-only): attempt to write a readonly "
            f"database ({db}); answered from the index as it was last written, without updating "
            f"it (check the permissions of {db.parent})"]
        assert _warnings_after_a_new_note(run_ro, ws, query, hits) == [
            "index store is read-only (its directory is read-only): attempt to write a readonly "
            f"database ({db}); answered from the index as it was last written, without updating "
            f"it (check the permissions of {db.parent})"]
        plain = run_ro(query[:-1])
        assert plain.returncode == 0 and b"warning: index store is read-only" in plain.stderr
        status = run_ro(["status", "--workspace", str(ws), "--json"])
        assert status.returncode == 0, status.stderr
        problems = orjson.loads(status.stdout)["problems"]
        assert [p["check"] for p in problems] == ["index"] and problems[0]["message"].endswith(
            f"searches answer from the index as it was last written, and memory files are not "
            f"indexed until {db.parent} can be written")
        index = run_ro(["index", "--workspace", str(ws)])
        assert index.returncode == 1 and index.stderr.startswith(b"qmdbridge: index store is read-only")
        assert sorted(p.name for p in db.parent.iterdir()) == ["main.sqlite", "main.sqlite.lock"]


def test_a_store_on_a_read_only_mount_answers_from_the_index_and_says_it_is_not_updated(
        ws: Path, env: dict[str, str]) -> None:
    """On a read-only file system SQLite cannot open the store ``mode=rw`` at all: every search
    failed with 'index store cannot be opened: unable to open database file'."""
    state = Path(env["OPENCLAW_STATE_DIR"])
    db = state / "memory" / "main.sqlite"
    env = {**env, "QMDBRIDGE_CLI_CACHE": "off", "QMDBRIDGE_DAEMON": "off"}
    query = ["search", "router dropped the WAN link", "--workspace", str(ws), "--json"]
    first = run(query, env)
    assert first.returncode == 0, first.stderr
    if subprocess.run(["mount", "--bind", str(state), str(state)], capture_output=True).returncode != 0:
        pytest.skip("cannot bind-mount the state dir here")
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(state)], check=True, capture_output=True)
        p = run(query, env)
        assert p.returncode == 0, p.stderr
        doc = orjson.loads(p.stdout)
        assert doc["results"] == orjson.loads(first.stdout)["results"]
        assert doc["warnings"] == [
            f"index store is read-only (the file cannot be written): Read-only file system ({db}); answered "
            f"from the index as it was last written, without updating it (check the permissions of {db.parent})"]
        index = run(["index", "--workspace", str(ws)], env)
        assert (index.returncode, index.stderr.decode()) == (
            1, f"qmdbridge: index store is read-only (the file cannot be written): Read-only file system ({db})\n"
            f"  fix: make {db.parent} and the store file writable for this user (their permissions, or a "
            "read-only mount), then run `qmdbridge index`\n")
        # doctor opens the store as searches do: it said 'unable to open database file', fix: rebuild it
        doctor = run(["doctor", "--workspace", str(ws), "--json"], env)
        assert [(c["name"], c["detail"]) for c in orjson.loads(doctor.stdout)["checks"] if c["level"] == "error"] == [
            ("index", f"index store is read-only (the file cannot be written): Read-only file system ({db}); "
                      "searches answer from the index as it was last written, and memory files are not "
                      f"indexed until {db.parent} can be written")]
    finally:
        subprocess.run(["umount", str(state)], check=True)


@pytest.mark.slow
def test_read_only_state_dir_with_wal_files_left_behind_is_read_only_too(
        ws: Path, env: dict[str, str]) -> None:
    """A writer killed (or still running elsewhere) leaves ``-wal`` and ``-shm`` next to the
    store: SQLite then opens the read-only file for writing without complaint, and only the
    sync failed later, on the writer lock, while status said no problem and not dirty."""
    state = Path(env["OPENCLAW_STATE_DIR"])
    db = state / "memory" / "main.sqlite"
    query = ["search", "router dropped the WAN link", "--workspace", str(ws), "--json"]
    first = run(query, env)
    assert first.returncode == 0, first.stderr
    hits = [(r["path"], r["startLine"], r["endLine"]) for r in orjson.loads(first.stdout)["results"]]
    killed = subprocess.run(  # a reader that dies without closing: its -wal and -shm stay
        [sys.executable, "-c", "import os, sqlite3, sys; c = sqlite3.connect(sys.argv[1]);"
         " c.execute('SELECT count(*) FROM chunks').fetchall(); os._exit(0)", str(db)],
        capture_output=True, timeout=60)
    assert killed.returncode == 0, killed.stderr
    assert sorted(p.name for p in db.parent.iterdir()) == [
        "main.sqlite", "main.sqlite-shm", "main.sqlite-wal", "main.sqlite.lock"]
    with _read_only(state, env) as run_ro:
        assert _warnings_after_a_new_note(run_ro, ws, query, hits) == [
            "index store is read-only (the file cannot be written): Permission denied "
            f"({db}); answered from the index as it was last written, without updating "
            f"it (check the permissions of {db.parent})"]
        status = run_ro(["status", "--workspace", str(ws), "--json"])
        assert status.returncode == 0, status.stderr
        assert [p["check"] for p in orjson.loads(status.stdout)["problems"]] == ["index"]
        index = run_ro(["index", "--workspace", str(ws)])
        assert index.returncode == 1 and index.stderr.startswith(b"qmdbridge: index store is read-only")


@pytest.mark.slow
def test_a_writer_lock_file_that_cannot_be_written_is_named_with_its_cause(
        ws: Path, env: dict[str, str]) -> None:
    """The store's writer lock file (``main.sqlite.lock``, which records the writer's pid) left
    unwritable: the store is read-only as far as this process goes, and every surface says
    which file and why, as it does for the store's own files."""
    db = Path(env["OPENCLAW_STATE_DIR"]) / "memory" / "main.sqlite"
    lock = db.with_name("main.sqlite.lock")
    query = ["search", "router dropped the WAN link", "--workspace", str(ws), "--json"]
    first = run(query, env)
    assert first.returncode == 0, first.stderr
    hits = [(r["path"], r["startLine"], r["endLine"]) for r in orjson.loads(first.stdout)["results"]]
    prefix = unprivileged_prefix()

    def run_up(args: list[str]) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run([*prefix, *_argv(args)], env=env, capture_output=True, timeout=120)

    error = f"index store is read-only (its writer lock {lock} cannot be written): Permission denied ({db})"
    lock.chmod(0o444)
    try:
        assert _warnings_after_a_new_note(run_up, ws, query, hits) == [
            f"{error}; answered from the index as it was last written, without updating it (check "
            f"the permissions of {db.parent})"]
        index = run_up(["index", "--workspace", str(ws), "--json"])
        assert index.returncode == 1 and orjson.loads(index.stdout)["error"] == error
        status = run_up(["status", "--workspace", str(ws), "--json"])
        assert [(p["check"], p["message"]) for p in orjson.loads(status.stdout)["problems"]] == [
            ("index", f"{error}; searches answer from the index as it was last written, and memory "
                      f"files are not indexed until {db.parent} can be written")]
    finally:
        lock.chmod(0o644)
    assert run(["index", "--workspace", str(ws)], env).returncode == 0


# A process that cannot write the store's folder keeps a VectorIndex open (serve): it prints the
# best chunk of a search, waits for a line on stdin, and searches again.
_VECTOR_READER = """
import sys
from pathlib import Path
from fallback.store.vectors import VectorIndex
index = VectorIndex(Path(sys.argv[1]), extension_path="/nonexistent/vec0")  # numpy brute force
for _ in range(2):
    hits = index.search_scored([0.0, 1.0, 0.0], model="m1", sources=["memory"], limit=1).hits
    print(hits[0][0] if hits else "-", flush=True)
    sys.stdin.readline()
"""


def _put_vector(conn: sqlite3.Connection, chunk_id: str, vec: list[float]) -> None:
    conn.execute(
        "INSERT INTO chunks(id, path, source, start_line, end_line, hash, model, text, vector,"
        " dims, updated_at) VALUES (?, ?, 'memory', 1, 1, 'h', 'm1', 't', ?, ?, 1)",
        (chunk_id, f"memory/{chunk_id}.md", struct.pack(f"<{len(vec)}f", *vec), len(vec)))


@pytest.mark.slow
def test_vector_search_over_a_read_only_folder_sees_commits_once_it_is_writable(
        tmp_path: Path) -> None:
    """A long-lived reader that opened the store as an immutable file (its folder could not be
    written) reads the file again for every search, so the chunks written after the owner
    fixed the folder's permissions are found without a restart."""
    folder = tmp_path / "memory"
    folder.mkdir()
    db = folder / "main.sqlite"
    conn = sqlite3.connect(db, isolation_level=None)
    try:  # a WAL store, as the engine writes: a reader needs a -shm file beside it
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("CREATE TABLE chunks(id TEXT PRIMARY KEY, path TEXT NOT NULL, source TEXT"
                     " NOT NULL, start_line INTEGER NOT NULL, end_line INTEGER NOT NULL, hash TEXT"
                     " NOT NULL, model TEXT NOT NULL, text TEXT NOT NULL, vector BLOB, dims INTEGER,"
                     " updated_at INTEGER NOT NULL)")
        _put_vector(conn, "old", [1.0, 0.2, 0.0])
    finally:
        conn.close()  # the last connection checkpoints and removes the -wal and -shm files
    modes = {p: p.stat().st_mode for p in (folder, db)}
    for p, mode in modes.items():
        p.chmod(mode & ~0o222)
    child = subprocess.Popen([*unprivileged_prefix(), sys.executable, "-c", _VECTOR_READER, str(db)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=REPO)
    try:
        assert child.stdout is not None and child.stdin is not None
        assert child.stdout.readline() == b"old\n"  # read while the folder was read-only
        assert not list(folder.glob("main.sqlite-*"))  # it could not write a -shm, nor did it
        for p, mode in modes.items():
            p.chmod(mode)  # the owner fixes the permissions; the writer adds a chunk
        writer = sqlite3.connect(db, isolation_level=None)
        _put_vector(writer, "new", [0.0, 1.0, 0.0])  # committed into the -wal, left open
        assert (folder / "main.sqlite-wal").stat().st_size > 0
        child.stdin.write(b"\n")
        child.stdin.flush()
        assert child.stdout.readline() == b"new\n"
        child.stdin.write(b"\n")
        child.stdin.flush()
        assert child.wait(timeout=60) == 0, child.stderr.read() if child.stderr else b""
        writer.close()
    finally:
        for p, mode in modes.items():
            p.chmod(mode)
        if child.poll() is None:
            child.kill()
            child.wait()
