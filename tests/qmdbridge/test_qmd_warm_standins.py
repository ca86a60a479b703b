"""The stdio MCP client and the warm child's supervisor against small real processes.

``standins/mcp_stdio.py`` answers the ``initialize`` handshake as ``qmd mcp`` does and then
misbehaves on purpose: garbage on stdout, an exit, a late answer to a call whose caller left,
requests of its own. Each test runs it as a real child process over real pipes. The
supervisor also meets children that never answer and children that exit at once.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import psutil
import pytest

from fallback.background import BackgroundTasks, RetryPolicy
from fallback.errors import BackendTimeoutError
from qmdbridge.qmd.collections import ManagedCollection
from qmdbridge.qmd.errors import QmdMcpError
from qmdbridge.qmd.mcp_client import EOF_REASON, McpStdioClient
from qmdbridge.qmd.results_json import QmdEntry
from qmdbridge.qmd.search_calls import CallPlan
from qmdbridge.qmd.warm import WarmChild

# Longest wait for a child to start, restart or die, seconds (a bound, never a timing assertion).
DEADLINE_S = 60
STANDIN = Path(__file__).resolve().parent / "standins" / "mcp_stdio.py"
ARGS = {"query": "zanzibar", "limit": 6, "minScore": 0, "collections": ["memory-dir-main"]}


@asynccontextmanager
async def _connected(mode: str) -> AsyncIterator[McpStdioClient]:
    """A stand-in in ``mode`` with an initialized client; the reader runs in a task."""
    process = await anyio.open_process([sys.executable, str(STANDIN), mode], stdin=subprocess.PIPE,
                                       stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert process.stdin is not None and process.stdout is not None
    client = McpStdioClient(process.stdin, process.stdout)
    async with process, anyio.create_task_group() as tg:
        tg.start_soon(client.run)
        with anyio.fail_after(DEADLINE_S):
            info = await client.initialize()
        assert (info.serverInfo.name, info.serverInfo.version) == ("qmd", "0-standin")
        yield client
        client.close()
        with contextlib.suppress(ProcessLookupError):  # a stand-in that exits may be reaped already
            process.kill()


def _warm(tmp_path: Path, mode: str) -> WarmChild:
    return WarmChild(argv=[sys.executable, str(STANDIN), mode], env=dict(os.environ), cwd=tmp_path,
                     startup_budget_ms=30_000, policy=RetryPolicy(base_ms=20, max_ms=20))


def _plan(tmp_path: Path, seconds: float) -> CallPlan:
    return CallPlan("query", 6, True, anyio.current_time() + seconds, int(seconds * 1000), tmp_path)


def _coll(tmp_path: Path, name: str = "memory-dir-main") -> ManagedCollection:
    return ManagedCollection(name=name, path=tmp_path, pattern="**/*.md", kind="memory")


def _files(entries: list[QmdEntry] | None) -> list[str]:
    assert entries is not None
    return [e.file for e in entries]


# -- the client ---------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_a_late_answer_is_dropped_and_never_read_as_the_next_calls() -> None:
    """The first call leaves at its deadline; the stand-in then answers it just before the
    second call's answer: the second caller gets its own, the late one is counted stale."""
    async with _connected("late") as client:
        with anyio.fail_after(DEADLINE_S):
            async with anyio.create_task_group() as tg:
                tg.start_soon(client.call_tool, "query", {**ARGS, "query": "first"})
                while client.requests_sent < 2:  # initialize, then this call, on the pipe
                    await anyio.sleep(0)
                tg.cancel_scope.cancel()  # its caller leaves; the stand-in never answers it alone
        with anyio.fail_after(DEADLINE_S):
            second = await client.call_tool("query", {**ARGS, "query": "second"})
        assert second["results"][0]["file"] == "memory-dir-main/second.md"
        assert (client.stale_answers, client.requests_sent, client.broken) == (1, 3, None)


@pytest.mark.anyio
async def test_server_requests_are_answered_and_notes_ignored() -> None:
    async with _connected("ping") as client:
        with anyio.fail_after(DEADLINE_S):
            got = await client.call_tool("query", ARGS)
        assert got["results"][0]["file"] == "memory-dir-main/zanzibar.md"
        assert client.stale_answers == 0


@pytest.mark.anyio
async def test_garbage_on_stdout_fails_the_waiting_call_and_every_later_one() -> None:
    async with _connected("garbage") as client:
        with pytest.raises(QmdMcpError) as ei, anyio.fail_after(DEADLINE_S):
            await client.call_tool("query", ARGS)
        reason = "not a JSON-RPC message on stdout: '\ufffd\ufffd not json {oops'"
        assert (ei.value.transport, ei.value.reason, client.broken) == (
            True, f"qmd mcp tools/call: {reason}", reason)
        with pytest.raises(QmdMcpError, match=re.escape(f"qmd mcp tools/call: {reason}")):
            await client.call_tool("query", ARGS)


@pytest.mark.anyio
async def test_a_child_that_exits_fails_the_call_as_a_closed_stdout() -> None:
    async with _connected("exit") as client:
        with pytest.raises(QmdMcpError) as ei, anyio.fail_after(DEADLINE_S):
            await client.call_tool("query", ARGS)
        assert (ei.value.transport, ei.value.reason) == (True, f"qmd mcp tools/call: {EOF_REASON}")
        assert client.broken == EOF_REASON


# -- the supervisor ------------------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize(("mode", "error"), [
    ("garbage", r"qmd mcp child \(pid {pid}\) while serving: not a JSON-RPC message on stdout: "
                r"'\ufffd\ufffd not json \{{oops' \(last stderr: note notifications/initialized\)"),
    ("exit", r"qmd mcp child \(pid {pid}\) exited \(code 5; last output: stand-in: exiting on "
             r"tools/call\) while serving"),
])
async def test_a_broken_child_sends_the_search_to_the_spawn_path_and_is_restarted(
        tmp_path: Path, mode: str, error: str) -> None:
    warm = _warm(tmp_path, mode)
    async with BackgroundTasks() as tasks:
        warm.attach(tasks)
        warm.launch()
        with anyio.fail_after(DEADLINE_S):
            await warm.wait_for(lambda w: w.ready)
        first_pid = warm.pid
        assert warm.server_version == "0-standin" and first_pid is not None
        assert await warm.search("zanzibar", _coll(tmp_path), _plan(tmp_path, DEADLINE_S)) is None
        assert (warm.answered, warm.spawn_fallbacks) == (0, 1)
        with anyio.fail_after(DEADLINE_S):
            await warm.wait_for(lambda w: w.ready and w.starts == 2)
        assert re.fullmatch(error.format(pid=first_pid), warm.last_error or "")
        assert warm.restarts == 1 and warm.pid != first_pid and not psutil.pid_exists(first_pid)
        await warm.close()


@pytest.mark.anyio
async def test_a_call_past_its_deadline_times_out_and_the_next_search_gets_its_own_answer(
        tmp_path: Path) -> None:
    """The child holds the first call (its search times out, naming the setting); the late
    answer it then sends before the second one's is dropped, and the child is kept."""
    warm = _warm(tmp_path, "late")
    async with BackgroundTasks() as tasks:
        warm.attach(tasks)
        warm.launch()
        with anyio.fail_after(DEADLINE_S):
            await warm.wait_for(lambda w: w.ready)
        with pytest.raises(BackendTimeoutError) as ei:
            await warm.search("first", _coll(tmp_path), _plan(tmp_path, 0.5))
        assert ei.value.setting == "memory.qmd.limits.timeoutMs"
        assert f"(warm qmd mcp, pid {warm.pid})" in str(ei.value)
        second = await warm.search("second", _coll(tmp_path, "memory-root-main"), _plan(tmp_path, DEADLINE_S))
        assert _files(second) == ["qmd://memory-root-main/second.md"]
        client = warm._client
        assert client is not None and client.stale_answers == 1
        assert (warm.answered, warm.spawn_fallbacks, warm.starts, warm.ready) == (1, 0, 1, True)
        await warm.close()


@pytest.mark.anyio
async def test_concurrent_searches_each_get_their_own_answer(tmp_path: Path) -> None:
    warm = _warm(tmp_path, "ping")
    got: dict[str, list[str]] = {}

    async def one(q: str, coll: str) -> None:
        got[q] = _files(await warm.search(q, _coll(tmp_path, coll), _plan(tmp_path, DEADLINE_S)))

    async with BackgroundTasks() as tasks:
        warm.attach(tasks)
        warm.launch()
        with anyio.fail_after(DEADLINE_S):
            await warm.wait_for(lambda w: w.ready)
            async with anyio.create_task_group() as tg:
                for i in range(6):
                    tg.start_soon(one, f"q{i}", f"coll-{i % 2}")
        assert got == {f"q{i}": [f"qmd://coll-{i % 2}/q{i}.md"] for i in range(6)}
        assert (warm.answered, warm.spawn_fallbacks) == (6, 0)
        await warm.close()


# -- the supervisor with children that never answer or exit at once -----------------------------------------------------


@pytest.mark.anyio
async def test_a_child_that_never_answers_fails_its_start_within_the_budget(tmp_path: Path) -> None:
    pids: list[int] = []
    warm = WarmChild(argv=[sys.executable, "-c", "import time; time.sleep(300)"],
                     env=dict(os.environ), cwd=tmp_path, startup_budget_ms=300,
                     policy=RetryPolicy(base_ms=20, max_ms=20))
    async with BackgroundTasks() as tasks:
        warm.attach(tasks)
        assert warm.launch() and not warm.launch()  # one supervisor
        with anyio.fail_after(DEADLINE_S):
            await warm.wait_for(lambda w: w.state == "starting" and w.pid is not None)
            pids.append(warm.pid or 0)
            await warm.wait_for(lambda w: w.restarts >= 2)
        st = warm.describe()
        assert st["lastError"].endswith(
            "did not start: no answer within 300ms (memory.qmd.update.commandTimeoutMs)")
        assert (st["answered"], warm.ready) == (0, False)
        await warm.close()
        assert warm.describe()["state"] == "stopped"
    assert not psutil.pid_exists(pids[0]) and not (set(pids) & {p.pid for p in psutil.Process().children(recursive=True)})


@pytest.mark.anyio
async def test_a_child_that_exits_at_once_is_reported_and_retried(tmp_path: Path) -> None:
    script = "import sys; print('QMD Error: cannot open the index', file=sys.stderr); sys.exit(3)"
    warm = WarmChild(argv=[sys.executable, "-c", script], env=dict(os.environ),
                     cwd=tmp_path, startup_budget_ms=30_000, policy=RetryPolicy(base_ms=20, max_ms=20))
    async with BackgroundTasks() as tasks:
        warm.attach(tasks)
        warm.launch()
        with anyio.fail_after(DEADLINE_S):
            await warm.wait_for(lambda w: w.restarts >= 1 and w.last_error is not None)
        assert re.fullmatch(r"qmd mcp child \(pid \d+\) exited \(code 3; last output: QMD Error: "
                            r"cannot open the index\) before it answered", warm.last_error or "")
        await warm.close()
