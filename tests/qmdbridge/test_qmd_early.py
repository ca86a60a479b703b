"""qmd calls started ahead and handed over (``qmdbridge/qmd/early.py``), with real processes: a
call is taken only for exactly its command, once, and waited for as the runner waits for its
own; any other command, the deadline and close() kill and reap what runs."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import anyio
import psutil
import pytest

from fallback.errors import BackendTimeoutError
from qmdbridge.qmd.early import EarlyCalls
from qmdbridge.qmd.runner import run_command

sys.path.insert(0, str(Path(__file__).resolve().parent))
from server_procs import process_gone  # noqa: E402

pytestmark = pytest.mark.anyio

LOGGED = """import os, sys
with open(os.environ["CALL_LOG"], "a") as f:
    f.write(" ".join(sys.argv[1:]) + "\\n")
sys.stdout.write('[{"file": "qmd://memory-root-main/MEMORY.md", "score": 0.5}]\\n')
sys.stderr.write("caf\\xe9 " * 3)
"""


def _logged(tmp_path: Path) -> tuple[list[str], dict[str, str], Path]:
    """A stand-in that logs each start and prints a result array: its search argv, env, log."""
    script = tmp_path / "qmd-logged"
    script.write_text(f"#!{sys.executable}\n{LOGGED}")
    script.chmod(0o755)
    log = tmp_path / "calls.log"
    env = {"PATH": os.environ.get("PATH", ""), "CALL_LOG": str(log), "LANG": "C.UTF-8"}
    argv = [str(script), "search", "--json", "-n", "6", "-c", "memory-root-main", "--index", "index",
            "--", "router WAN"]
    return argv, env, log


def _starts(log: Path) -> int:
    return len(log.read_text().splitlines()) if log.exists() else 0


def _hang(tmp_path: Path, standins_dir: Path) -> tuple[list[str], dict[str, str], Path]:
    """The hanging stand-in (two sleeping grandchildren, one out of its group) as a search."""
    pidfile = tmp_path / "pids"
    env = {"PATH": os.environ.get("PATH", ""), "STANDIN_PIDFILE": str(pidfile)}
    return [str(standins_dir / "hang.py"), "search", "--json", "--", "hello world"], env, pidfile



async def _pids(pidfile: Path) -> list[int]:
    """The hang stand-in's grandchildren, once it wrote them (waited for against a deadline)."""
    with anyio.fail_after(20):
        while not pidfile.exists():
            await anyio.sleep(0.01)
    return [int(line) for line in pidfile.read_text().split()]


async def test_a_call_started_ahead_is_handed_over_once_as_the_runner_would_have_run_it(
        tmp_path: Path) -> None:
    argv, env, log = _logged(tmp_path)
    calls = EarlyCalls()
    try:
        call = calls.start(argv, env, tmp_path)
        assert call is not None and calls.wait([call])
        taken = await calls.run_command(argv, env=env, cwd=tmp_path, timeout_ms=20_000,
                                        setting="memory.qmd.limits.timeoutMs")
        assert _starts(log) == 1  # handed over: not started again
        ref = await run_command(argv, env=env, cwd=tmp_path, timeout_ms=20_000)
        assert (taken.argv, taken.returncode, taken.signal, taken.stdout, taken.stderr,
                taken.stdout_truncated, taken.stderr_truncated) == (
            ref.argv, ref.returncode, ref.signal, ref.stdout, ref.stderr, ref.stdout_truncated,
            ref.stderr_truncated)
        assert taken.stderr == "café café café " and taken.ok
        await calls.run_command(argv, env=env, cwd=tmp_path, timeout_ms=20_000)
        assert _starts(log) == 3  # once only: the same command again is started by the runner
        assert calls.start(argv, env, tmp_path) is None  # nor ahead, once the search ran it
        assert (calls.started, calls.used) == (1, 1)
    finally:
        calls.close()
    assert psutil.Process().children(recursive=True) == []


async def test_another_environment_or_folder_is_not_handed_over(tmp_path: Path) -> None:
    argv, env, log = _logged(tmp_path)
    other = tmp_path / "other"
    other.mkdir()
    calls = EarlyCalls()
    try:
        call = calls.start(argv, env, tmp_path)
        assert call is not None and calls.wait([call])
        await calls.run_command(argv, env={**env, "NO_COLOR": "1"}, cwd=tmp_path, timeout_ms=20_000)
        await calls.run_command(argv, env=env, cwd=other, timeout_ms=20_000)
        await calls.run_command([*argv[:-1], "router"], env=env, cwd=tmp_path, timeout_ms=20_000)
        assert _starts(log) == 4 and calls.used == 0
        assert not calls.discarded  # searches change nothing: the call is still there to take
        await calls.run_command(argv, env=env, cwd=tmp_path, timeout_ms=20_000)
        assert _starts(log) == 4 and calls.used == 1
    finally:
        calls.close()
    assert psutil.Process().children(recursive=True) == []


async def test_a_command_other_than_a_search_discards_the_calls_not_taken(
        tmp_path: Path, standins_dir: Path) -> None:
    """A reconcile or an update may change what a search finds: a call started before it is
    killed, with its descendants, and nothing is started ahead after it."""
    argv, env, pidfile = _hang(tmp_path, standins_dir)
    logged, logged_env, log = _logged(tmp_path)
    calls = EarlyCalls()
    try:
        call = calls.start(argv, env, tmp_path)
        assert call is not None
        grandchildren = await _pids(pidfile)
        res = await calls.run_command([logged[0], "collection", "list"], env=logged_env,
                                      cwd=tmp_path, timeout_ms=20_000)
        assert res.ok and _starts(log) == 1
        assert call.done.is_set() and call.proc.returncode == -9
        assert all(process_gone(pid) for pid in grandchildren)
        assert calls.discarded and calls.start(logged, logged_env, tmp_path) is None
        await calls.run_command(logged, env=logged_env, cwd=tmp_path, timeout_ms=20_000)
        assert _starts(log) == 2 and calls.used == 0  # the search ran it itself
    finally:
        calls.close()
    assert psutil.Process().children(recursive=True) == []


async def test_a_call_taken_past_its_deadline_is_killed_with_the_runners_error(
        tmp_path: Path, standins_dir: Path) -> None:
    argv, env, pidfile = _hang(tmp_path, standins_dir)
    calls = EarlyCalls()
    try:
        assert calls.start(argv, env, tmp_path) is not None
        grandchildren = await _pids(pidfile)
        with pytest.raises(BackendTimeoutError) as info:
            await calls.run_command(argv, env=env, cwd=tmp_path, timeout_ms=300,
                                    setting="memory.qmd.limits.timeoutMs")
        assert str(info.value) == ("qmd unavailable: qmd search --json -- hello world timed out "
                                   "after 300ms (memory.qmd.limits.timeoutMs)")
        assert all(process_gone(pid) for pid in grandchildren)
        assert psutil.Process().children(recursive=True) == []
    finally:
        calls.close()


async def test_an_outer_cancellation_kills_the_call_taken_and_propagates(
        tmp_path: Path, standins_dir: Path) -> None:
    argv, env, pidfile = _hang(tmp_path, standins_dir)
    calls = EarlyCalls()
    try:
        assert calls.start(argv, env, tmp_path) is not None
        grandchildren = await _pids(pidfile)
        with pytest.raises(TimeoutError) as info:
            with anyio.fail_after(0.3):
                await calls.run_command(argv, env=env, cwd=tmp_path, timeout_ms=60_000)
        assert not isinstance(info.value, BackendTimeoutError)
        assert all(process_gone(pid) for pid in grandchildren)
        assert psutil.Process().children(recursive=True) == []
    finally:
        calls.close()


async def test_close_kills_and_reaps_what_the_search_did_not_take(tmp_path: Path,
                                                                   standins_dir: Path) -> None:
    argv, env, pidfile = _hang(tmp_path, standins_dir)
    calls = EarlyCalls()
    assert calls.start(argv, env, tmp_path) is not None
    assert calls.start(argv, env, tmp_path) is None  # one call per command
    grandchildren = await _pids(pidfile)
    calls.close()
    assert all(process_gone(pid) for pid in grandchildren)
    assert psutil.Process().children(recursive=True) == []
    assert calls.start(argv, env, tmp_path) is None
