"""Every route that answers ``qmdbridge search`` gives the in-process answer, over generated
workspaces, configs and store states.

Each case is drawn from a seeded generator: notes of words from a small vocabulary (so queries
hit several of them), a config with random keyword-only settings (citations, maxResults,
minScore, candidateMultiplier, chunking, extraPaths, sync.onSearch, temporal decay, sessions
with a transcript, MMR, section chunking, the trigram tokenizer, a size cap, extra paths with
patterns, a misspelt key (a config warning, which every route tells on stderr), and per command
--max-results, --min-score, --session-key under scope rules and --corpus), and a store state after the first search recorded its settings (unchanged,
a note changed, a note added, a binary note, a note the sync cannot read, the workspace gone,
or a foreign index: one written with other chunking, a file another tool wrote at the store's
path, an index of another workspace). Each query is answered by the in-process engine
(``QMDBRIDGE_CLI_CACHE=off``, daemon off) and by every other route: the command as a user runs
it without a daemon (recorded settings on: the read-only route whenever it may answer), and
through a running daemon (``serve``'s socket listener and its long-lived manager, which the CLI
finds by itself). Stdout, stderr and the exit code must be the same, warnings included (the
daemon's JSON says ``"servedBy": "daemon"`` where the others say ``process``). A foreign index
is put back before each route, so each meets it first. Each case also reads with ``get`` served
and in-process: a blank path, and one of a page of ``MEMORY.md``, a missing note, a note of an
extra path, the binary note.

The CLI runs in this process (``qmdbridge.cli.main.main``) and so does the daemon (one event
loop for the module, one manager and socket per case): process start-up and signals are not the
subject here (``test_cli_fast_search.py`` runs what a fresh process loads, and a store another
user cannot write, as real processes; ``test_cli_first_run.py`` a real ``serve``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import orjson
import pytest
from anyio.from_thread import BlockingPortal, start_blocking_portal

import qmdbridge.cli.daemon_client as daemon_client
import qmdbridge.cli.fast_search as fast_search
from qmdbridge.cli.main import main
from qmdbridge.cli.serve import start_daemon_socket
from qmdbridge.config import load_config, resolve_agent
from qmdbridge.manager import MemoryManager
from qmdbridge.server.wire import socket_path
from tests.e2e.cli_proc import without_progress

PAST_NS = 1_600_000_000_000_000_000  # well before any sync: no note is racily clean
WORDS = ("router", "firmware", "kestrel", "backup", "wan", "link", "dns", "alpha", "rollout",
         "quokka", "lte", "modem", "vlan", "printer", "東京", "garden", "heron", "feeder")
STATES = ("unchanged", "changed", "added", "binary", "folder", "gone", "identity", "tool", "workspace")
FOREIGN = ("identity", "tool", "workspace")  # a foreign index, put back before each route
CASES = 27


def _note(rng: random.Random, lines: int) -> str:
    body = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 9))) for _ in range(lines)]
    return "# Notes\n\n" + "\n".join(f"- {line}" for line in body) + "\n"


def _workspace(rng: random.Random, root: Path) -> Path:
    ws = root / "ws"
    (ws / "memory").mkdir(parents=True)
    (ws / "MEMORY.md").write_text(_note(rng, rng.randint(3, 12)))
    for day in rng.sample(range(1, 28), rng.randint(2, 7)):
        (ws / "memory" / f"2026-11-{day:02d}.md").write_text(_note(rng, rng.randint(2, 40)))
    extra = root / "notes"
    extra.mkdir()
    (extra / "wan.md").write_text(_note(rng, 5))
    return ws


def _config(rng: random.Random) -> dict[str, Any]:
    search: dict[str, Any] = {
        "provider": rng.choice(["none", "auto"]),
        "query": {"maxResults": rng.randint(1, 8), "minScore": rng.choice([0.0, 0.2, 0.35, 0.6]),
                  "hybrid": {"candidateMultiplier": rng.choice([1, 2, 4, 6]),
                             "mmr": {"enabled": rng.random() < 0.3, "lambda": rng.choice([0.3, 0.7])}}},
        "chunking": {"tokens": rng.choice([40, 100, 400]), "overlap": rng.choice([0, 10]),
                     "sections": rng.random() < 0.7},
        "sync": {"onSearch": rng.random() < 0.8},
        "store": {"fts": {"tokenizer": rng.choice(["unicode61", "unicode61", "trigram"])}},
    }
    if rng.random() < 0.2:
        search["maxFileBytes"] = 400  # the longer notes are skipped as too large
    if rng.random() < 0.5:
        search["extraPaths"] = [rng.choice(["../notes", {"path": "../notes", "pattern": "w*.md"}])]
    if rng.random() < 0.3:
        search["query"]["hybrid"]["temporalDecay"] = {"enabled": True, "halfLifeDays": 30}
    if rng.random() < 0.25:
        search["sources"] = ["memory", "sessions"]
        search["experimental"] = {"sessionMemory": True}
    scope = {"default": "deny", "rules": [{"action": "allow", "match": {"chatType": "direct"}}]}
    return {"memory": {"citations": rng.choice(["auto", "on", "off"]), "qmd": {"scope": scope}},
            "agents": {"defaults": {"memorySearch": search}}}


def _flags(rng: random.Random) -> list[str]:
    """Options of one search command: limits, the caller's session key, the corpus."""
    flags: list[str] = []
    if rng.random() < 0.3:
        flags += ["--max-results", str(rng.randint(1, 5))]
    if rng.random() < 0.3:
        flags += ["--min-score", str(rng.choice([0, 0.1, 0.5]))]
    if rng.random() < 0.3:
        flags += ["--session-key", rng.choice(["agent:main:main", "agent:main:telegram:group:42",
                                               "agent:main:slack:dm:u1"])]
    if rng.random() < 0.25:
        flags += ["--corpus", rng.choice(["memory", "sessions", "all", "wiki"])]
    return flags


def _transcript(rng: random.Random, state_dir: Path) -> None:
    folder = state_dir / "agents" / "main" / "sessions"
    folder.mkdir(parents=True)
    lines = [{"type": "message", "message": {"role": role, "content": " ".join(rng.sample(WORDS, 4))}}
             for role in ("user", "assistant") * rng.randint(1, 4)]
    (folder / "s1.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))


def _backdate(root: Path) -> None:
    for f in root.rglob("*"):
        if f.is_file() and not f.is_symlink():
            os.utime(f, ns=(PAST_NS, PAST_NS))


def _foreign(state: str, ws: Path, state_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Put a foreign index where the agent's store is."""
    store = state_dir / "memory" / "main.sqlite"
    if state == "identity":  # an index of this workspace written with other chunking
        other = json.loads((state_dir / "openclaw.json").read_text())
        chunking = other["agents"]["defaults"]["memorySearch"]["chunking"]
        chunking["tokens"] = 40 if chunking["tokens"] != 40 else 400
        (state_dir / "other.json").write_text(json.dumps(other))
        code, _, err = _run(["search", "router", "--workspace", str(ws), "--config",
                             str(state_dir / "other.json"), "--json"], capsys)
        assert code == 0, err
    elif state == "tool":  # another tool's SQLite file at the store's path
        for f in store.parent.glob("main.sqlite*"):
            if not f.name.endswith(".lock"):
                f.unlink()
        with sqlite3.connect(store) as db:
            db.execute("CREATE TABLE documents (id INTEGER PRIMARY KEY, body TEXT)")
            db.execute("INSERT INTO documents (body) VALUES ('router firmware dns')")
        db.close()
    elif state == "workspace":  # the index of another workspace of this agent
        with sqlite3.connect(store) as db:
            db.execute("UPDATE meta SET value = ? WHERE key = 'workspace_dir'", (json.dumps("/elsewhere/ws"),))
        db.close()


def _change(state: str, rng: random.Random, ws: Path) -> None:
    notes = sorted((ws / "memory").glob("*.md"))
    if state == "changed":
        notes[0].write_text(notes[0].read_text() + f"- {rng.choice(WORDS)} replaced\n")
    elif state == "added":
        (ws / "memory" / "2026-12-01.md").write_text(_note(rng, 4))
    elif state == "binary":
        (ws / "memory" / "scan.md").write_bytes(b"\x00\x01\x02 router dump\n")
    elif state == "folder":
        (ws / "memory" / "loop.md").mkdir()  # a folder named like a note
    elif state == "gone":
        shutil.rmtree(ws)
        return
    _backdate(ws)


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


def _daemon_stdout(routed: tuple[int, str, str]) -> tuple[int, str, str]:
    """A daemon's answer as the in-process command prints it (``servedBy`` names the route)."""
    return routed[0], routed[1].replace('"servedBy": "daemon"', '"servedBy": "process"'), routed[2]


@pytest.fixture
def daemon_loop() -> Iterator[BlockingPortal]:
    """The event loop a case's daemon runs on (a thread; its worker threads end with it)."""
    with start_blocking_portal() as portal:
        yield portal


async def _daemon(ws: Path, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
    """``qmdbridge serve --no-stdin --workspace ws`` without its process (signals, stdin): the
    long-lived manager and ``serve``'s socket listener, until ``stop``."""
    agent = resolve_agent(load_config(None), None, workspace=str(ws))
    stop = anyio.Event()
    async with MemoryManager(agent, mode="full") as manager:
        await manager.start()
        async with anyio.create_task_group() as tg:
            assert await start_daemon_socket(tg, manager, agent, argparse.Namespace(config=None, backend=None))
            task_status.started(stop)
            await stop.wait()
            tg.cancel_scope.cancel()


@contextmanager
def _serving(portal: BlockingPortal, ws: Path) -> Iterator[None]:
    future, stop = portal.start_task(_daemon, ws)
    try:
        yield
    finally:
        portal.call(stop.set)
        future.result(timeout=120)


def _daemon_sync(state_dir: Path) -> None:
    """Have the daemon index the changes now (its watcher would, a little later); returns once
    no sync of the daemon runs (a sync request awaits a running one)."""
    daemon_client.exchange(socket_path(str(state_dir), "main"), {"id": 1, "tool": "sync", "params": {}})


def _same(routed: tuple[int, str, str], engine: tuple[int, str, str], *, decay: bool) -> None:
    assert routed[0] == engine[0] and without_progress(routed[2]) == without_progress(engine[2])
    if not decay or routed[0] != 0:
        assert routed[1] == engine[1]
        return
    # temporal decay reads the clock, which moves between two runs: scores may differ by 1e-4
    a, b = orjson.loads(routed[1]), orjson.loads(engine[1])
    assert [r["score"] for r in a["results"]] == pytest.approx([r["score"] for r in b["results"]], abs=1e-4)
    assert ({**a, "results": [{**r, "score": None} for r in a["results"]]}
            == {**b, "results": [{**r, "score": None} for r in b["results"]]})


@pytest.mark.parametrize("seed", range(CASES))
def test_every_route_gives_the_in_process_answer(seed: int, tmp_path: Path, env: dict[str, str],
                                                 capsys: pytest.CaptureFixture[str],
                                                 monkeypatch: pytest.MonkeyPatch,
                                                 daemon_loop: BlockingPortal) -> None:
    rng = random.Random(seed)
    ws = _workspace(rng, tmp_path)
    state_dir = Path(env["OPENCLAW_STATE_DIR"])
    state_dir.mkdir()
    config = _config(rng)
    search = config["agents"]["defaults"]["memorySearch"]
    warned = seed % 4 == 1  # a misspelt key: every route tells its warning, on stderr
    if warned:
        search["provder"] = "local"
    (state_dir / "openclaw.json").write_text(json.dumps(config))
    if "sources" in search:
        _transcript(rng, state_dir)
    _backdate(tmp_path)
    for key in [k for k in os.environ if k not in env]:
        monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    fast_answers: list[int | None] = []
    daemon_answers: list[int | None] = []
    answer, served = fast_search.answer_recorded, daemon_client._print

    def counted(*a: Any, **k: Any) -> int | None:
        fast_answers.append(answer(*a, **k))
        return fast_answers[-1]

    def counted_daemon(*a: Any, **k: Any) -> int | None:
        daemon_answers.append(served(*a, **k))
        return daemon_answers[-1]

    monkeypatch.setattr(fast_search, "answer_recorded", counted)
    monkeypatch.setattr(daemon_client, "_print", counted_daemon)
    queries = [" ".join(rng.sample(WORDS, rng.randint(1, 3))) for _ in range(3)]
    state = STATES[seed % len(STATES)]
    decay = "temporalDecay" in search["query"]["hybrid"]
    routes = {"engine": {"QMDBRIDGE_DAEMON": "off", "QMDBRIDGE_CLI_CACHE": "off"},
              "no daemon": {"QMDBRIDGE_DAEMON": "off"}, "daemon": {}}
    with _serving(daemon_loop, ws):
        _daemon_sync(state_dir)  # after its boot sync: no sync of its own races the cases
        capsys.readouterr()  # the daemon's start-up line
        for n, query in enumerate(queries):
            text = n == 1 and not decay  # the plain output prints decayed scores rounded: JSON then
            argv = ["search", query, "--workspace", str(ws), *_flags(rng), *([] if text else ["--json"])]
            monkeypatch.setenv("QMDBRIDGE_DAEMON", "off")
            first = _run(argv, capsys)  # indexes the workspace, records this command line's settings
            assert first[0] == (2 if state == "gone" and n else 0), first[2]
            if n == 0 and state not in FOREIGN:
                _change(state, rng, ws)
                _daemon_sync(state_dir)
            answers = {}
            for route, route_env in routes.items():
                for key in ("QMDBRIDGE_DAEMON", "QMDBRIDGE_CLI_CACHE"):
                    monkeypatch.delenv(key, raising=False)
                for key, value in route_env.items():
                    monkeypatch.setenv(key, value)
                if state in FOREIGN:
                    _foreign(state, ws, state_dir, capsys)
                answers[route] = _run(argv, capsys)
            if warned:
                assert answers["engine"][2].startswith(
                    f"qmdbridge: config {state_dir / 'openclaw.json'}: agents.defaults.memorySearch.provder: "
                    "unknown key, ignored (did you mean provider?)\n")
            _same(answers["no daemon"], answers["engine"], decay=decay)
            _same(_daemon_stdout(answers["daemon"]), answers["engine"], decay=decay)
            if state in FOREIGN:  # re-indexed in this process (a denied search left it foreign), so
                monkeypatch.setenv("QMDBRIDGE_DAEMON", "off")  # the daemon's sync below tells nothing
                assert _run(["search", "router", "--workspace", str(ws)], capsys)[0] == 0
            _daemon_sync(state_dir)  # the sync a served search started (a session start) is over
        if state != "gone":  # `get`, served or not: pages, refusals, a missing note
            pages = [["MEMORY.md", "--from", str(rng.randint(1, 4)), "--lines", str(rng.randint(1, 3))],
                     ["memory/2030-01-01.md"], ["../notes/wan.md"], ["memory/scan.md"]]
            for page in [[" "], rng.choice(pages)]:
                get = ["get", *page, "--workspace", str(ws), *([] if rng.random() < 0.5 else ["--json"])]
                monkeypatch.setenv("QMDBRIDGE_DAEMON", "off")
                in_process = _run(get, capsys)
                monkeypatch.delenv("QMDBRIDGE_DAEMON")
                assert _daemon_stdout(_run(get, capsys)) == in_process
                if page == [" "]:
                    assert in_process[0] == 3 and "path refused: ' ': empty path" in in_process[1] + in_process[2]
    plain_keyword = search["provider"] == "none" and "sources" not in search and not warned
    if plain_keyword and state not in ("gone", *FOREIGN):  # the read-only route answered (else it was declined)
        assert any(code == 0 for code in fast_answers), fast_answers
    if state != "gone":  # the daemon answered
        assert any(code == 0 for code in daemon_answers), daemon_answers
