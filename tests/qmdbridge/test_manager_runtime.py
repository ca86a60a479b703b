"""The manager's runtime: one task group for both backends' background work (closed with
nothing left behind), the last background error in ``status()``, and qmd start-up budgets that
are not the search deadline and never open the search breaker. Real qmd, real processes, a real
HTTP server for the embedding provider."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

import anyio
import psutil
import pytest

from qmdbridge.config import parse_config, resolve_agent
from qmdbridge.manager import BlockingMemoryManager, MemoryManager
from tests.fallback.embeddings_fake_server import Reply, serve

pytestmark = pytest.mark.anyio

STANDINS = Path(__file__).resolve().parent / "standins"
DEADLINE_S = 60.0
NOW_MS = 1_770_681_600_000


def _workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    (ws / "memory").mkdir(parents=True)
    (ws / "MEMORY.md").write_text("# Memory\n\nRouter: Omada ER605 with AdGuard at 192.168.10.2.\n")
    (ws / "memory" / "2026-03-01.md").write_text("# 2026-03-01\n\nThe zebra migration is done.\n")
    return ws


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "OPENAI_API_KEY")}
    env.update(OPENCLAW_STATE_DIR=str(tmp_path / "state"), HOME=str(tmp_path / "home"), **extra)
    return env


def _agent(tmp_path: Path, memory: dict[str, Any], search: dict[str, Any] | None = None,
           env: dict[str, str] | None = None) -> Any:
    cfg = parse_config({"memory": memory,
                        "agents": {"defaults": {"memorySearch": search or {"provider": "none"}}}})
    return resolve_agent(cfg, "main", workspace=_workspace(tmp_path), env=env or _env(tmp_path))


def _hang_on(tmp_path: Path, qmd_bin: Path, command: str) -> Path:
    """A qmd whose ``command`` hangs (with grandchildren) and whose other commands are real."""
    wrapper = tmp_path / f"qmd-hang-{command}"
    wrapper.write_text(f"#!/bin/sh\ncase \"$1\" in {command}) exec {sys.executable} "
                       f"{STANDINS / 'hang.py'} ;; *) exec {qmd_bin} \"$@\" ;; esac\n")
    wrapper.chmod(0o755)
    return wrapper


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def _pending_tasks() -> set[asyncio.Task[Any]]:
    return {t for t in asyncio.all_tasks() if not t.done()}


async def _eventually(check: Any, what: str) -> None:
    try:
        with anyio.fail_after(DEADLINE_S):
            while not await check():
                await anyio.sleep(0.05)
    except TimeoutError:
        pytest.fail(f"not reached within {DEADLINE_S}s: {what}")


@pytest.mark.qmd
async def test_close_cancels_every_background_task_and_reaps_a_hanging_update(
        tmp_path: Path, qmd_bin: Path) -> None:
    pidfile = tmp_path / "hang.pids"
    env = _env(tmp_path, STANDIN_PIDFILE=str(pidfile))
    command = _hang_on(tmp_path, qmd_bin, "update")
    agent = _agent(tmp_path, {"backend": "qmd", "qmd": {
        "command": str(command), "limits": {"timeoutMs": 15000},
        "update": {"updateTimeoutMs": 600_000}}}, env=env)
    children, tasks_before = _children(), _pending_tasks()
    async with MemoryManager(agent, mode="full", env=env) as m:
        await m.start()

        async def boot_update_hangs() -> bool:
            st = await m.status()
            return pidfile.exists() and st.backends["qmd"]["startup"]["state"] == "ready"
        await _eventually(boot_update_hangs, "qmd started and its boot update hangs")
        resp = await m.search("zebra migration")  # waits at most 500 ms for the running update
        assert (resp.backend, resp.fallback, resp.results[0].path) == (
            "qmd", None, "memory/2026-03-01.md")
        st = await m.status()
        assert st.background is not None
        assert set(st.background.tasks) - {"builtin: boot sync"} == {  # it may be done already
            "builtin: file watcher", "builtin: rescan", "qmd: boot update", "qmd: file watcher",
            "qmd: interval update", "qmd: qmd mcp child"}
        hung = [int(p) for p in pidfile.read_text().split()]
    assert m.tasks.running == 0
    assert _pending_tasks() == tasks_before
    assert _children() == children  # the hanging update and its grandchildren are gone
    assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
                   for p in hung)


@pytest.mark.qmd
async def test_start_up_timeout_is_reported_and_never_opens_the_search_breaker(
        tmp_path: Path, qmd_bin: Path) -> None:
    command = _hang_on(tmp_path, qmd_bin, "update")
    agent = _agent(tmp_path, {"backend": "qmd", "qmd": {
        "command": str(command), "limits": {"timeoutMs": 15000},
        "update": {"waitForBootSync": True, "updateTimeoutMs": 500}}})
    children = _children()
    async with MemoryManager(agent, env=_env(tmp_path)) as m:
        resp = await m.search("zebra migration")  # the boot update times out first
        assert (resp.backend, resp.fallback, resp.results[0].path) == (
            "qmd", None, "memory/2026-03-01.md")
        st = await m.status()
    assert m.breaker.describe()["state"] == "closed" and m.breaker.state.failures == 0
    assert st.backend == "qmd" and st.fallback is None
    assert st.backends["qmd"]["startup"]["state"] == "ready"
    assert st.issues == ["qmd start-up: boot update failed: qmd update --index index timed out "
                         "after 500ms (memory.qmd.update.updateTimeoutMs)"]  # after its two retries
    assert _children() == children


async def test_a_qmd_that_cannot_start_opens_only_the_start_up_breaker(tmp_path: Path) -> None:
    agent = _agent(tmp_path, {"backend": "qmd", "qmd": {"command": str(tmp_path / "nowhere" / "qmd")}})
    async with MemoryManager(agent, env=_env(tmp_path), now_ms=lambda: NOW_MS) as m:
        first = await m.search("zebra")
        second = await m.search("zebra")
        st = await m.status()
    assert first.backend == "builtin" and first.fallback is not None
    assert first.fallback.reason.startswith("qmd not found")
    assert second.fallback is not None and second.fallback.reason.endswith("(start-up retry in 30s)")
    assert m.breaker.state.failures == 0  # the search breaker never saw it
    startup = st.backends["qmd"]["startup"]
    assert (startup["state"], startup["breaker"]["state"], startup["breaker"]["failures"]) == (
        "failed", "open", 1)


async def test_status_shows_the_last_background_error(tmp_path: Path) -> None:
    """A revoked API key: the boot sync fails, is reported once with its cause, and waits
    for its backoff instead of retrying every second."""
    body = {"error": {"message": "Incorrect API key provided: sk-revoked"}}
    with serve(lambda req: Reply(401, body)) as srv:
        agent = _agent(tmp_path, {}, search={
            "provider": "openai", "model": "text-embedding-3-small",
            "remote": {"baseUrl": srv.url, "apiKey": "sk-revoked"}, "sync": {"watch": False}})
        async with MemoryManager(agent, mode="full", env=_env(tmp_path), now_ms=lambda: NOW_MS) as m:
            await m.start()

            async def reported() -> bool:
                st = await m.status()
                return st.background is not None and st.background.last_error is not None
            await _eventually(reported, "the failed boot sync is in status")
            st = await m.status()
    assert st.background is not None and st.background.last_error is not None
    err = st.background.to_json_dict()["lastError"]
    assert err == {"task": "builtin: boot sync", "atMs": NOW_MS, "failures": 1, "retryInMs": 1000,
                   "message": "EmbeddingProviderError: openai embedding failed (HTTP 401): "
                              "Incorrect API key provided: ***"}
    assert st.background.failing == ["builtin: boot sync"]
    assert len(srv.requests) == 1


def test_blocking_manager_runs_background_work_in_its_portal(tmp_path: Path) -> None:
    agent = _agent(tmp_path, {})
    with BlockingMemoryManager(agent, mode="full", env=_env(tmp_path)) as m:
        m.start()
        st = m.status()
        assert st.background is not None
        assert {"builtin: file watcher", "builtin: rescan"} <= set(st.background.tasks)
        assert m.search("zebra migration").results[0].path == "memory/2026-03-01.md"
    assert m._manager.tasks.running == 0
