"""The warm ``qmd mcp`` child of long-lived mode over stdio (``qmdbridge/qmd/warm.py``).

With the real qmd 2.8.3: its ``query`` answers equal the spawned ``qmd query``'s, hit for hit
(paths, lines, scores, snippets, collections); concurrent searches and calls each get their own
answer, also after a call left at its deadline; the child listens on no socket; a child killed
with SIGKILL is replaced while the spawn path answers; ``search``-mode questions reach it in one
call per collection and get the spawned calls' hits; nothing is left behind. With a real small
process: ``PR_SET_PDEATHSIG`` (the stdio stand-ins, and children that never answer or exit at
once, are in ``test_qmd_warm_standins.py``).

The workspace and environment (``qmd_query_ws``) let qmd's ``query`` run without its GGUF
models: strong BM25 hits, ``rerank: false``, model paths that do not exist.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import orjson
import psutil
import pytest

from fallback.background import BackgroundTasks
from fallback.errors import BackendTimeoutError
from qmdbridge import MemoryManager
from qmdbridge.config import parse_config, resolve_agent
from qmdbridge.qmd.backend import QmdBackend
from qmdbridge.qmd.errors import QmdMcpError
from qmdbridge.qmd.locate import QmdLocation
from qmdbridge.qmd.results_json import parse_qmd_json
from qmdbridge.qmd.runner import parent_death_argv
from qmdbridge.qmd.search_calls import CallPlan, search_collections
from qmdbridge.qmd.warm import WarmChild, entries_from_mcp, strip_line_numbers

sys.path.insert(0, str(Path(__file__).resolve().parent))
from qmd_query_ws import QUERIES, make_workspace, model_free_env  # noqa: E402

from fallback.request import SearchRequest

# Longest wait for a child to start, restart or die, seconds (a bound, never a timing assertion).
DEADLINE_S = 60


async def _ready_child(b: QmdBackend, tasks: BackgroundTasks) -> WarmChild:
    """Start ``b`` in long-lived mode and wait (up to :data:`DEADLINE_S`) for its warm child."""
    await b.start(tasks)
    warm = b.warm
    assert warm is not None
    with anyio.fail_after(DEADLINE_S):
        await warm.wait_for(lambda w: w.ready)
    return warm


@asynccontextmanager
async def _warm_and_spawned(tmp_path: Path, qmd_bin: Path, base_path_env: str,
                            **qmd: Any) -> AsyncIterator[tuple[QmdBackend, WarmChild, QmdBackend]]:
    """A long-lived ``search``-mode backend with its child ready, and a one-shot one that
    spawns qmd, over the same workspace and qmd home (``qmd``: more ``memory.qmd`` settings);
    both closed on exit."""
    spawn = _backend(tmp_path, qmd_bin, base_path_env, "cli", searchMode="search", **qmd)
    await spawn.start()
    b = _backend(tmp_path, qmd_bin, base_path_env, "full", searchMode="search", **qmd)
    try:
        async with BackgroundTasks() as tasks:
            yield b, await _ready_child(b, tasks), spawn
            await b.close()
    finally:
        await spawn.close()


async def _same_hits_through_the_child(b: QmdBackend, warm: WarmChild, spawn: QmdBackend,
                                       questions: list[str]) -> None:
    """Each question through ``b``'s ready child: one call per collection, none spawned, and
    hits (not none) equal to the one-shot backend ``spawn``'s."""
    for i, q in enumerate(questions):
        hits = (await b.search(SearchRequest.of(q))).results
        assert warm.answered == len(b.collections) * (i + 1) and warm.spawn_fallbacks == 0
        assert hits and hits == (await spawn.search(SearchRequest.of(q))).results


def _env(tmp_path: Path) -> dict[str, str]:
    env = model_free_env(tmp_path)
    env["HOME"] = str(tmp_path / "home")
    return env


def _agent(tmp_path: Path, qmd_bin: Path, **qmd: Any) -> Any:
    cfg = parse_config({"memory": {"backend": "qmd", "qmd": {
        "command": str(qmd_bin), "searchMode": "query", "rerank": False,
        "limits": {"timeoutMs": 20000},
        "update": {"waitForBootSync": True, "interval": "0", "embedInterval": "0"}, **qmd}},
        "agents": {"defaults": {"memorySearch": {"provider": "none"}}}})
    ws = tmp_path / "ws" if (tmp_path / "ws").is_dir() else make_workspace(tmp_path)
    return resolve_agent(cfg, "main", workspace=ws, env={"OPENCLAW_STATE_DIR": str(tmp_path / "state")})


def _backend(tmp_path: Path, qmd_bin: Path, base_path_env: str, mode: str, **qmd: Any) -> QmdBackend:
    loc = QmdLocation(path=str(qmd_bin), found=True, runtime_ok=True, version="2.8.3", reason=None,
                      searched=[], path_env=base_path_env, child_path=base_path_env)
    return QmdBackend(_agent(tmp_path, qmd_bin, **qmd), location=loc, mode=mode,  # type: ignore[arg-type]
                      env=_env(tmp_path))


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


# -- mapping qmd's MCP answer ------------------------------------------------------------------


def test_strip_line_numbers_undoes_qmds_numbering() -> None:
    assert strip_line_numbers("90: @@ -89,4 @@ (88 before, 30 after)\n91: a: b\n92: \n93: 7: x", 90) == \
        "@@ -89,4 @@ (88 before, 30 after)\na: b\n\n7: x"
    with pytest.raises(QmdMcpError, match=r"snippet line 2 lacks its '4: ' prefix") as ei:
        strip_line_numbers("3: a\n5: b", 3)
    assert ei.value.transport is False


def test_mcp_results_map_to_the_entries_of_the_cli_json() -> None:
    cli = orjson.dumps([
        {"docid": "#2b1d3f", "score": 0.9, "file": "qmd://memory-dir-main/2026-03-01.md", "line": 3,
         "title": "Zanzibar trip", "snippet": "@@ -2,2 @@ (1 before, 0 after)\n\nZanzibar: ferry"},
        {"score": 0.5, "file": "qmd://memory-dir-main/a b.md", "line": 1, "title": "x"}]).decode()
    structured = {"results": [
        {"docid": "#2b1d3f", "file": "memory-dir-main/2026-03-01.md", "title": "Zanzibar trip",
         "score": 0.9, "context": None, "line": 3,
         "snippet": "3: @@ -2,2 @@ (1 before, 0 after)\n4: \n5: Zanzibar: ferry"},
        {"docid": "#", "file": "memory-dir-main/a b.md", "title": "x", "score": 0.5, "context": None,
         "line": 1, "snippet": "1: "}]}
    assert entries_from_mcp(structured) == parse_qmd_json(cli, command="query")
    for bad in ({}, {"results": {}}, {"results": [1]}):
        with pytest.raises(QmdMcpError, match="results is not a list of objects"):
            entries_from_mcp(bad)
    for bad in ({"results": [{"file": 42}]}, {"results": [{"file": None, "score": 1}]}, {"results": [{}]}):
        with pytest.raises(QmdMcpError, match="a result names no file") as ei:
            entries_from_mcp(bad)
        assert ei.value.transport is False  # the child answered on purpose: kept, qmd spawned


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux only")
def test_parent_death_argv_kills_the_child_when_its_parent_is_killed(tmp_path: Path) -> None:
    """An intermediate process starts ``sleep`` through the wrapper and is SIGKILLed: the
    kernel kills the sleep too (with no wrapper it would live on, re-parented)."""
    starter = ("import subprocess,sys,time,psutil\n"
               "from qmdbridge.qmd.runner import parent_death_argv\n"
               "p = subprocess.Popen(parent_death_argv(['sleep', '300']), start_new_session=True)\n"
               "while psutil.Process(p.pid).cmdline()[:1] != ['sleep']: time.sleep(0.01)\n"
               "print(p.pid, flush=True)\ntime.sleep(300)\n")
    assert parent_death_argv(["qmd", "mcp"])[-3:] == [str(os.getpid()), "qmd", "mcp"]
    proc = subprocess.Popen([sys.executable, "-c", starter], stdout=subprocess.PIPE, env=os.environ)
    assert proc.stdout is not None
    pid = int(proc.stdout.readline())
    child = psutil.Process(pid)
    assert child.cmdline() == ["sleep", "300"]  # the wrapper exec'd in place: same pid
    proc.kill()
    proc.wait()
    gone, alive = psutil.wait_procs([child], timeout=DEADLINE_S)
    assert [p.pid for p in gone] == [pid] and alive == []


# -- the real qmd ---------------------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.qmd
async def test_warm_answers_equal_the_spawned_commands(tmp_path: Path, qmd_bin: Path,
                                                       base_path_env: str) -> None:
    """Same workspace, same qmd home: a one-shot backend spawns ``qmd query`` per collection, a
    long-lived one asks its child; entries per collection and the mapped hits are equal."""
    spawn = _backend(tmp_path, qmd_bin, base_path_env, "cli")
    await spawn.start()
    warm = _backend(tmp_path, qmd_bin, base_path_env, "full")
    before = _children()
    async with BackgroundTasks() as tasks:
        await warm.start(tasks)
        assert warm.warm is not None and spawn.warm is None
        with anyio.fail_after(DEADLINE_S):
            await warm.warm.wait_for(lambda w: w.ready)
        for q in QUERIES:
            for coll in warm.collections:
                plan = CallPlan("query", 6, True, anyio.current_time() + 20, 20_000, tmp_path)
                by_child = await warm.warm.search(q, coll, plan)
                by_spawn = await search_collections(q, [coll], plan, run=spawn._run_search)
                assert by_child is not None and by_child == [e for e, _ in by_spawn]
            assert (await warm.search(SearchRequest.of(q))).results == (await spawn.search(SearchRequest.of(q))).results
        hits = (await warm.search(SearchRequest.of("zanzibar ferry"))).results
        assert [(h.path, h.start_line, h.end_line, h.score, h.source) for h in hits] == [
            ("MEMORY.md", 3, 5, 1.0, "memory"), ("memory/2026-03-01.md", 2, 3, 1.0, "memory"),
            ("memory/2026-03-02.md", 90, 93, 0.5, "memory")]
        assert hits[2].snippet.splitlines()[1] == "Checked the zanzibar ferry timetable again."
        st = (await warm.status()).custom["qmd"]["warm"]
        assert (st["state"], st["answered"], st["spawnFallbacks"], st["restarts"]) == ("ready", 10, 0, 0)
        assert (st["serves"], st["transport"], st["serverVersion"]) == (
            ["query", "search"], "stdio", "2.8.3")
        assert (await spawn.status()).custom["qmd"]["warm"] == {
            "enabled": False, "state": "off", "reason": "one-shot commands spawn qmd"}
        child = psutil.Process(st["pid"])
        assert child.cwd() == str(warm.agent.workspace_dir)
        assert child.environ()["XDG_CACHE_HOME"] == warm.child_env["XDG_CACHE_HOME"]
        assert os.getpgid(child.pid) == child.pid  # its own process group
        await warm.close()
    await spawn.close()
    assert _children() <= before and not psutil.pid_exists(st["pid"])


@pytest.mark.anyio
@pytest.mark.qmd
async def test_killed_child_spawn_answers_then_child_is_back(tmp_path: Path, qmd_bin: Path) -> None:
    """Through the manager: answered by the child; SIGKILL; the next search is answered by a
    spawned qmd (same hits, breaker closed); the child comes back on a new pid and answers."""
    agent = _agent(tmp_path, qmd_bin)
    before = _children()
    async with MemoryManager(agent, mode="full", env=_env(tmp_path)) as m:
        await m.start()
        backend: Any = m.sidecar.backend if m.sidecar else None
        assert backend is not None and backend.warm is not None
        warm: WarmChild = backend.warm
        with anyio.fail_after(DEADLINE_S):
            await warm.wait_for(lambda w: w.ready)
        first = await m.search("zanzibar ferry")
        assert (first.backend, first.fallback, warm.answered) == ("qmd", None, 2)
        status = await m.status()
        assert status.custom["qmd"]["warm"]["answered"] == 2
        old_pid = warm.pid
        assert old_pid is not None
        os.kill(old_pid, signal.SIGKILL)
        with anyio.fail_after(DEADLINE_S):
            await warm.wait_for(lambda w: w.state == "down")
        assert (warm.last_error or "").startswith(
            f"qmd mcp child (pid {old_pid}) exited "
            "(signal 9; last output: ")
        again = await m.search("zanzibar ferry")
        assert (again.backend, again.fallback, again.results) == ("qmd", None, first.results)
        assert warm.answered == 2 and warm.spawn_fallbacks == 2  # both collections spawned
        with anyio.fail_after(DEADLINE_S):
            await warm.wait_for(lambda w: w.ready and w.starts == 2)
        assert warm.restarts == 1 and warm.pid != old_pid and not psutil.pid_exists(old_pid)
        third = await m.search("zanzibar ferry")
        assert (third.results, warm.answered) == (first.results, 4)
        assert m.breaker.state.failures == 0
        new_pid = warm.pid
    assert _children() <= before and new_pid is not None and not psutil.pid_exists(new_pid)


@pytest.mark.anyio
@pytest.mark.qmd
async def test_concurrent_searches_and_a_cancelled_call_each_leave_every_answer_its_own(
        tmp_path: Path, qmd_bin: Path, base_path_env: str) -> None:
    """Two searches at once through the child (two collections each) and two raw calls at
    once on its connection each get their own answer; a call cancelled after it was sent
    leaves nothing the next call could read as its own; the child listens on no socket."""
    spawn = _backend(tmp_path, qmd_bin, base_path_env, "cli")
    await spawn.start()
    b = _backend(tmp_path, qmd_bin, base_path_env, "full")
    async with BackgroundTasks() as tasks:
        warm = await _ready_child(b, tasks)
        want = {q: (await spawn.search(SearchRequest.of(q))).results for q in QUERIES}
        assert [h.path for h in want["zanzibar ferry"]] != [h.path for h in want["spice zanzibar"]]
        got: dict[str, Any] = {}

        async def search(q: str) -> None:
            got[q] = (await b.search(SearchRequest.of(q))).results

        async with anyio.create_task_group() as tg:
            for q in QUERIES:
                tg.start_soon(search, q)
        assert got == want and (warm.answered, warm.spawn_fallbacks) == (4, 0)

        client = warm._client
        assert client is not None
        calls = {("zanzibar ferry", "memory-dir-main"): "memory-dir-main/2026-03-01.md",
                 ("spice zanzibar", "memory-root-main"): "memory-root-main/MEMORY.md"}
        raw: dict[str, str] = {}

        async def call(q: str, coll: str) -> None:
            answer = await client.call_tool("query", {"query": q, "limit": 6, "minScore": 0,
                                                      "collections": [coll], "rerank": False})
            raw[coll] = answer["results"][0]["file"]

        with anyio.fail_after(DEADLINE_S):
            async with anyio.create_task_group() as tg:
                for q, coll in calls:
                    tg.start_soon(call, q, coll)
        assert raw == {coll: file for (_, coll), file in calls.items()}

        sent = client.requests_sent
        with anyio.fail_after(DEADLINE_S):
            async with anyio.create_task_group() as tg:
                tg.start_soon(call, "zanzibar ferry", "memory-dir-main")
                while client.requests_sent == sent:  # until the request is on the pipe
                    await anyio.sleep(0)
                tg.cancel_scope.cancel()
            await call("spice zanzibar", "memory-root-main")
        assert raw["memory-root-main"] == "memory-root-main/MEMORY.md"
        assert client.broken is None and warm.ready and warm.starts == 1

        child = psutil.Process(warm.pid or 0)
        assert [c for c in child.net_connections(kind="all") if c.status == psutil.CONN_LISTEN] == []
        if sys.platform.startswith("linux"):  # its stdin and stdout are pipes to this process
            assert {os.readlink(f"/proc/{child.pid}/fd/{fd}").split(":")[0] for fd in (0, 1)} == {"pipe"}
        await b.close()
    await spawn.close()


@pytest.mark.anyio
@pytest.mark.qmd
async def test_a_failed_tool_call_keeps_the_child_and_a_stopped_childs_client_fails(
        tmp_path: Path, qmd_bin: Path, base_path_env: str) -> None:
    b = _backend(tmp_path, qmd_bin, base_path_env, "full")
    async with BackgroundTasks() as tasks:
        warm = await _ready_child(b, tasks)
        client = warm._client
        assert client is not None
        with pytest.raises(QmdMcpError) as ei:
            await client.call_tool("query", {})
        assert (ei.value.transport, ei.value.reason) == (
            False, "qmd mcp query: Error: provide either 'query' (plain text) or 'searches' "
                   "(typed sub-queries)")
        assert warm.ready and warm.starts == 1
        await b.close()
        with pytest.raises(QmdMcpError) as ei:
            await client.call_tool("query", {"query": "x"})
        assert (ei.value.transport, ei.value.reason) == (
            True, "qmd mcp tools/call: the connection to the child is closed")


@pytest.mark.anyio
@pytest.mark.qmd
async def test_search_mode_questions_go_to_the_child_in_one_call_per_collection(
        tmp_path: Path, qmd_bin: Path, base_path_env: str) -> None:
    """``search`` mode starts the child with the backend; a question's lexical searches (the
    content words ANDed, then each word alone) reach it as qmd's typed ``lex`` sub-searches,
    one call per collection, and give the hits the spawned calls give (the same notes, whose
    passages the bridge ranks). A query in qmd's syntax still spawns ``qmd search``."""
    before = _children()
    # the child is started with the backend, no search needed
    async with _warm_and_spawned(tmp_path, qmd_bin, base_path_env) as (b, warm, spawn):
        colls = len(b.collections)
        await _same_hits_through_the_child(
            b, warm, spawn, ["When is the zanzibar ferry leaving?", "spice tour", "ferry"])
        hits = (await b.search(SearchRequest.of("When is the zanzibar ferry leaving?"))).results
        assert [h.path for h in hits][:3] == ["MEMORY.md", "memory/2026-03-01.md",
                                              "memory/2026-03-02.md"]
        assert hits[0].score == 1.0 and hits[2].snippet_start_line <= 91 <= hits[2].snippet_end_line
        phrase = (await b.search(SearchRequest.of('"zanzibar ferry"'))).results  # qmd's syntax: qmd search's own lines
        assert warm.answered == colls * 4 and [h.path for h in phrase] == [
            h.path for h in (await spawn.search(SearchRequest.of('"zanzibar ferry"'))).results]
        st = (await b.status()).custom["qmd"]["warm"]
        assert (st["state"], st["serves"], st["spawnFallbacks"]) == ("ready", ["query", "search"], 0)
    assert _children() <= before


@pytest.mark.anyio
@pytest.mark.qmd
async def test_search_mode_repairs_collections_removed_behind_the_childs_back(
        tmp_path: Path, qmd_bin: Path, base_path_env: str) -> None:
    """qmd's MCP ``query`` tool answers an empty list for a collection its index no longer
    has, where a spawned ``qmd search -c`` says "Collection not found" and the backend re-adds
    the collections: with every managed collection removed from qmd's index (``qmd collection
    remove``), a long-lived search-mode question still finds its notes (the spawn path's
    repair), and the next one goes to the child again."""
    b = _backend(tmp_path, qmd_bin, base_path_env, "full", searchMode="search")
    async with BackgroundTasks() as tasks:
        warm = await _ready_child(b, tasks)
        q = "When is the zanzibar ferry leaving?"
        found = [h.path for h in (await b.search(SearchRequest.of(q))).results]
        assert found[:3] == ["MEMORY.md", "memory/2026-03-01.md", "memory/2026-03-02.md"]
        for coll in b.collections:  # behind the bridge's back, as a user would
            res = await anyio.run_process(b.argv(["collection", "remove"], [coll.name]),
                                          env=b.child_env, cwd=b.agent.workspace_dir)
            assert res.returncode == 0
        assert (await b.index_counts.read())[0] == {}
        assert [h.path for h in (await b.search(SearchRequest.of(q))).results] == found
        answered = warm.answered
        assert [h.path for h in (await b.search(SearchRequest.of(q))).results] == found
        assert warm.answered == answered + len(b.collections)
        await b.close()


@pytest.mark.anyio
@pytest.mark.qmd
@pytest.mark.parametrize("warm_child", [True, False])
async def test_search_re_adds_one_collection_removed_behind_its_back(
        tmp_path: Path, qmd_bin: Path, base_path_env: str, warm_child: bool,
        caplog: pytest.LogCaptureFixture) -> None:
    """One managed collection removed from qmd's index (``qmd collection remove``) while the
    others keep their documents: a long-lived search no longer finds a document of it in qmd's
    index, so it would search the others only, through the child or spawned, and the
    collection's notes would be missing until a restart (no update re-adds a collection). The
    search sees that qmd's collections were edited since its last reconcile, re-adds the
    collection, and finds its notes; a collection that is merely empty costs no reconcile."""
    (make_workspace(tmp_path) / "empty").mkdir()
    b = _backend(tmp_path, qmd_bin, base_path_env, "full", searchMode="search",
                 mcp={"enabled": warm_child}, paths=[{"name": "empty", "path": "empty"}])
    reconciles = "reconciling the collections"
    async with BackgroundTasks() as tasks:
        await b.start(tasks)
        if warm_child:
            warm = await _ready_child(b, tasks)
        q = "When is the zanzibar ferry leaving?"
        found = [h.path for h in (await b.search(SearchRequest.of(q))).results]
        assert found[:3] == ["MEMORY.md", "memory/2026-03-01.md", "memory/2026-03-02.md"]
        assert "empty-main" not in (await b.index_counts.read())[0]
        assert reconciles not in caplog.text
        res = await anyio.run_process(b.argv(["collection", "remove"], ["memory-dir-main"]),
                                      env=b.child_env, cwd=b.agent.workspace_dir)
        assert res.returncode == 0
        assert "memory-dir-main" not in (await b.index_counts.read())[0]
        assert [h.path for h in (await b.search(SearchRequest.of(q))).results] == found
        assert (await b.index_counts.read())[0].get("memory-dir-main", 0) > 40
        assert caplog.text.count(reconciles) == 1
        answered = warm.answered if warm_child else 0
        assert [h.path for h in (await b.search(SearchRequest.of(q))).results] == found
        assert caplog.text.count(reconciles) == 1
        if warm_child:  # the two collections with documents, through the child again
            assert warm.answered == answered + 2
        await b.close()


@pytest.mark.anyio
@pytest.mark.qmd
async def test_search_mode_question_spawned_while_the_child_is_down_counts_each_collection(
        tmp_path: Path, qmd_bin: Path, base_path_env: str) -> None:
    """``spawnFallbacks`` counts collection searches spawned instead (as in ``query`` mode): a
    question the child cannot take is spawned for every collection, and says so; the spawned
    answer has the notes the child found."""
    b = _backend(tmp_path, qmd_bin, base_path_env, "full", searchMode="search")
    async with BackgroundTasks() as tasks:
        warm = await _ready_child(b, tasks)
        q = "When is the zanzibar ferry leaving?"
        found = [h.path for h in (await b.search(SearchRequest.of(q))).results]
        colls = len(b.collections)
        assert colls > 1 and (warm.answered, warm.spawn_fallbacks) == (colls, 0)
        old_pid = warm.pid
        assert old_pid is not None
        os.kill(old_pid, signal.SIGKILL)
        with anyio.fail_after(DEADLINE_S):
            await warm.wait_for(lambda w: w.state == "down")
        assert sorted(h.path for h in (await b.search(SearchRequest.of(q))).results) == sorted(found)
        st = (await b.status()).custom["qmd"]["warm"]
        assert (st["answered"], st["spawnFallbacks"]) == (colls, colls)
        await b.close()


@pytest.mark.anyio
@pytest.mark.qmd
async def test_search_mode_pool_is_not_cut_by_collection_order(
        tmp_path: Path, qmd_bin: Path, base_path_env: str) -> None:
    """The child ranks each collection's notes on their own (reciprocal rank: every
    collection's best note scores 1), so the notes of several collections must not be cut to
    the pool in collection order: with ``maxResults`` 1 (a pool of 4 notes) and four
    collections before it whose best note holds one word of the question, the only note
    holding every word (in the fifth) is the answer, as the spawned calls find it."""
    ws = make_workspace(tmp_path)
    (ws / "memory" / "gondola.md").write_text("# Lifts\n\nA gondola in the memory folder.\n")
    paths = []
    for name in ("p0", "p1", "p2", "p3"):
        (ws / name).mkdir()
        (ws / name / "lift.md").write_text(f"# Lift {name}\n\nThe gondola of {name} was slow.\n")
        paths.append({"path": name, "name": name})
    (ws / "p3" / "trip.md").write_text("# Trip\n\nThe gondola ride over the glacier at Zermatt "
                                       "cost 80 francs.\n")
    async with _warm_and_spawned(tmp_path, qmd_bin, base_path_env, paths=paths) as (b, warm, spawn):
        q = "How much did the gondola ride over the glacier at Zermatt cost?"
        hits = (await b.search(SearchRequest.of(q, max_results=1))).results
        assert warm.answered == len(b.collections) and warm.spawn_fallbacks == 0
        assert [h.path for h in hits] == ["p3/trip.md"]
        assert [h.path for h in (await spawn.search(SearchRequest.of(q, max_results=1))).results] == ["p3/trip.md"]


@pytest.mark.anyio
@pytest.mark.qmd
async def test_a_cjk_question_goes_to_the_child_as_written_then_word_by_word(
        tmp_path: Path, qmd_bin: Path, base_path_env: str) -> None:
    """A CJK question's lexical searches (the question as written, then its words: qmd matches
    a CJK term as the phrase of its characters) reach the child in one call per collection and
    give the spawned calls' hits."""
    ws = tmp_path / "ws"
    (ws / "memory").mkdir(parents=True)
    (ws / "MEMORY.md").write_text("# 记忆\n\n用户喜欢喝乌龙茶。\n")
    (ws / "memory" / "2026-03-05.md").write_text(
        "# 周五\n\n今天讨论了记忆系统升级。\n周五晚上去了支持小组，大家分享了故事。\n")
    async with _warm_and_spawned(tmp_path, qmd_bin, base_path_env) as (b, warm, spawn):
        await _same_hits_through_the_child(b, warm, spawn, ["我们什么时候去了支持小组？", "用户喜欢喝什么茶"])
        assert [h.path for h in (await b.search(SearchRequest.of("用户喜欢喝什么茶"))).results][:1] == ["MEMORY.md"]


@pytest.mark.anyio
@pytest.mark.qmd
async def test_a_note_found_by_a_prefix_alone_scores_0_through_the_child_and_spawned(
        tmp_path: Path, qmd_bin: Path, base_path_env: str) -> None:
    """qmd reads ``Dr`` as a prefix and finds a note saying only "draft"; it holds none of the
    question's words, so it scores 0 on both paths (qmd's own score is 1/rank through the child
    and BM25 spawned), and the same ``minScore`` keeps the same hits."""
    ws = tmp_path / "ws"
    (ws / "memory").mkdir(parents=True)
    (ws / "MEMORY.md").write_text("# People\n\nDr. Okafor is our family dentist in Leeds.\n")
    (ws / "memory" / "2026-11-22.md").write_text("# Sunday\n\nSent the draft of the budget.\n")
    async with _warm_and_spawned(tmp_path, qmd_bin, base_path_env) as (b, warm, spawn):
        for floor in (0.0, 0.35):
            hits = (await b.search(SearchRequest.of("Who is Dr. Okafor?", min_score=floor))).results
            assert hits == (await spawn.search(SearchRequest.of("Who is Dr. Okafor?", min_score=floor))).results
            assert [(h.path, h.score) for h in hits] == [("MEMORY.md", 1.0), *(
                [("memory/2026-11-22.md", 0.0)] if floor == 0.0 else [])]
        assert warm.answered == 2 * len(b.collections) and warm.spawn_fallbacks == 0


@pytest.mark.anyio
@pytest.mark.qmd
async def test_a_hung_child_is_replaced_after_a_search_mode_question_times_out(
        tmp_path: Path, qmd_bin: Path, base_path_env: str) -> None:
    """A child that stops answering (SIGSTOP): the question fails at ``limits.timeoutMs`` as a
    spawned call would, and since ``lex`` sub-searches take milliseconds the child is replaced,
    so the next questions are the new child's again (a ``query``-mode child, which may load
    models that long, is kept)."""
    b = _backend(tmp_path, qmd_bin, base_path_env, "full", searchMode="search",
                 limits={"timeoutMs": 3000})
    before = _children()
    async with BackgroundTasks() as tasks:
        warm = await _ready_child(b, tasks)
        first = (await b.search(SearchRequest.of("When is the zanzibar ferry leaving?"))).results
        hung = warm.pid
        assert hung is not None and first
        os.kill(hung, signal.SIGSTOP)
        with pytest.raises(BackendTimeoutError, match="memory.qmd.limits.timeoutMs"):
            await b.search(SearchRequest.of("When is the zanzibar ferry leaving?"))
        assert "did not answer within 3000 ms; restarting it" in (warm.last_error or "")
        with anyio.fail_after(DEADLINE_S):
            await warm.wait_for(lambda w: w.ready and w.starts == 2)
        assert warm.pid != hung and not psutil.pid_exists(hung)
        answered = warm.answered
        assert (await b.search(SearchRequest.of("When is the zanzibar ferry leaving?"))).results == first
        assert warm.answered == answered + len(b.collections)
        await b.close()
    assert _children() <= before


@pytest.mark.anyio
@pytest.mark.qmd
async def test_the_child_can_be_turned_off(tmp_path: Path, qmd_bin: Path, base_path_env: str) -> None:
    """``mcp.enabled: false``; ``mcporter.enabled: false`` gives the same ``warm_child`` setting
    (:func:`test_warm_child_setting_resolution`), which is all the backend reads."""
    b = _backend(tmp_path, qmd_bin, base_path_env, "full", mcp={"enabled": False})
    async with BackgroundTasks() as tasks:
        await b.start(tasks)
        assert b.warm is None
        assert [h.path for h in (await b.search(SearchRequest.of("spice zanzibar"))).results] == ["MEMORY.md", "memory/2026-03-01.md"]
        assert (await b.status()).custom["qmd"]["warm"] == {
            "enabled": False, "state": "off", "reason": "memory.qmd.mcp.enabled is false"}
        await b.close()


def test_warm_child_setting_resolution() -> None:
    def warm(qmd: dict[str, Any]) -> bool:
        return parse_config({"memory": {"qmd": qmd}}).memory.qmd.warm_child

    assert warm({}) is True
    assert warm({"mcp": {"enabled": False}}) is False
    assert warm({"mcporter": {"enabled": False}}) is False
    assert warm({"mcporter": {"enabled": True, "serverName": "qmd", "startDaemon": True}}) is True
    assert warm({"mcp": {"enabled": True}, "mcporter": {"enabled": False}}) is True
