"""Tests for qmdbridge.qmd.runner with real processes: the real qmd and small stand-ins."""

from __future__ import annotations

import errno
import json
import os
import signal
import sys
from pathlib import Path

import anyio
import psutil
import pytest

from fallback.errors import BackendTimeoutError, BackendUnavailableError
from qmdbridge.qmd.errors import QmdCommandError
from qmdbridge.qmd.runner import (
    RunResult,
    is_busy,
    is_crash_after_output,
    is_flag_rejection,
    is_missing_collection,
    run_command,
    summarize,
)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from server_procs import process_gone  # noqa: E402

pytestmark = pytest.mark.anyio


def _env(path_env: str, **extra: str) -> dict[str, str]:
    return {"PATH": path_env, "HOME": os.environ.get("HOME", "/tmp"), "LANG": "C.UTF-8", **extra}



async def test_timeout_kills_group_and_escaped_grandchild(tmp_path: Path, standins_dir: Path,
                                                          base_path_env: str) -> None:
    pidfile = tmp_path / "pids"
    argv = [str(standins_dir / "hang.py"), "search", "--json", "--", "hello world"]
    with pytest.raises(BackendTimeoutError) as info:
        await run_command(argv, env=_env(base_path_env, STANDIN_PIDFILE=str(pidfile)),
                          cwd=tmp_path, timeout_ms=3000)
    err = info.value
    assert str(err) == "qmd unavailable: qmd search --json -- hello world timed out after 3000ms"
    assert err.timeout_ms == 3000
    assert err.summary == "qmd search --json -- hello world"
    assert isinstance(err, TimeoutError)
    grandchildren = [int(line) for line in pidfile.read_text().split()]
    assert len(grandchildren) == 2
    for pid in grandchildren:
        assert process_gone(pid), f"grandchild {pid} survived"
    assert psutil.Process().children(recursive=True) == []


async def test_outer_cancellation_kills_tree_and_propagates(tmp_path: Path, standins_dir: Path,
                                                            base_path_env: str) -> None:
    pidfile = tmp_path / "pids"
    env = _env(base_path_env, STANDIN_PIDFILE=str(pidfile))

    async def expire_once_started(scope: anyio.CancelScope) -> None:
        while not pidfile.exists():  # the stand-in started its grandchildren
            await anyio.sleep(0.01)
        scope.deadline = anyio.current_time()  # the caller's deadline passes now

    with pytest.raises(TimeoutError) as info:
        with anyio.fail_after(120) as scope:  # a hang guard, passed at once by the task above
            async with anyio.create_task_group() as tg:
                tg.start_soon(expire_once_started, scope)
                await run_command([str(standins_dir / "hang.py")], env=env, cwd=tmp_path,
                                  timeout_ms=60_000)
    assert not isinstance(info.value, BackendTimeoutError)
    for pid in (int(line) for line in pidfile.read_text().split()):
        assert process_gone(pid), f"grandchild {pid} survived"
    assert psutil.Process().children(recursive=True) == []


async def test_output_cap_keeps_the_tail(tmp_path: Path, base_path_env: str) -> None:
    code = ("import sys\n"
            "sys.stdout.write(''.join(f'{i:06d}\\n' for i in range(50_000)))\n"
            "sys.stderr.write('e' * 10 + 'END')\n")
    result = await run_command([sys.executable, "-c", code], env=_env(base_path_env),
                               cwd=tmp_path, timeout_ms=30_000, max_chars=1000)
    assert result.ok
    assert result.stdout_truncated is True
    assert result.stderr_truncated is False
    assert len(result.stdout) == 1000
    assert result.stdout.endswith("049999\n")
    assert result.stdout.startswith("49857\n049858\n")
    assert result.stderr == "eeeeeeeeeeEND"


async def test_discard_stdout(tmp_path: Path, base_path_env: str) -> None:
    code = "import sys; sys.stdout.write('x' * 5000); sys.stderr.write('progress')"
    result = await run_command([sys.executable, "-c", code], env=_env(base_path_env),
                               cwd=tmp_path, timeout_ms=30_000, discard_stdout=True, max_chars=100)
    assert (result.stdout, result.stdout_truncated, result.stderr) == ("", False, "progress")


async def test_invalid_utf8_is_replaced(tmp_path: Path, standins_dir: Path,
                                        base_path_env: str) -> None:
    result = await run_command([str(standins_dir / "garbage.py"), "search"],
                               env=_env(base_path_env), cwd=tmp_path, timeout_ms=30_000)
    assert result.ok
    assert result.stdout == "\ufffd\ufffd not json \ufffd( {oops\n"


async def test_multibyte_split_across_reads_is_kept(tmp_path: Path, base_path_env: str) -> None:
    code = ("import sys, time\n"
            "b = '記憶'.encode()\n"
            "sys.stdout.buffer.write(b[:2]); sys.stdout.flush(); time.sleep(0.2)\n"
            "sys.stdout.buffer.write(b[2:])\n")
    result = await run_command([sys.executable, "-c", code], env=_env(base_path_env),
                               cwd=tmp_path, timeout_ms=30_000)
    assert result.stdout == "記憶"


async def test_real_qmd_missing_collection_carried_in_error(
        tmp_path: Path, qmd_bin: Path, qmd_env: dict[str, str]) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    argv = [str(qmd_bin), "search", "--json", "-n", "6", "-c", "nope", "--index", "index",
            "--", "alpha"]
    result = await run_command(argv, env=qmd_env, cwd=workspace, timeout_ms=30_000)
    assert result.returncode == 1
    assert result.signal is None
    assert result.ok is False
    assert result.stderr.startswith("Collection not found: nope\n")
    assert is_missing_collection(result.stderr) is True
    assert is_flag_rejection(result.stderr) is False
    with pytest.raises(QmdCommandError) as info:
        result.check()
    err = info.value
    assert err.returncode == 1
    assert err.signal is None
    assert err.summary == "qmd search --json -n 6 -c nope --index index -- alpha"
    assert str(err).startswith(
        "qmd search --json -n 6 -c nope --index index -- alpha failed (code 1): "
        "Collection not found: nope")
    assert err.stderr_tail == result.stderr
    assert isinstance(err, BackendUnavailableError)
    assert err.backend == "qmd"


async def test_real_qmd_version(tmp_path: Path, qmd_bin: Path, qmd_env: dict[str, str]) -> None:
    result = await run_command([str(qmd_bin), "--version"], env=qmd_env, cwd=tmp_path,
                               timeout_ms=30_000)
    assert result.check() is result
    assert result.stdout.startswith("qmd 2.8.3")
    assert result.summary == "qmd --version"


async def test_signal_exit_is_reported(tmp_path: Path, base_path_env: str) -> None:
    code = "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"
    result = await run_command([sys.executable, "-c", code], env=_env(base_path_env),
                               cwd=tmp_path, timeout_ms=30_000)
    assert (result.returncode, result.signal) == (None, signal.SIGTERM)
    with pytest.raises(QmdCommandError) as info:
        result.check()
    assert info.value.signal == signal.SIGTERM
    assert str(info.value) == f"qmd -c {code} failed (signal {int(signal.SIGTERM)})"


async def test_stdout_used_when_stderr_empty(tmp_path: Path, base_path_env: str) -> None:
    code = "print('only stdout'); raise SystemExit(3)"
    result = await run_command([sys.executable, "-c", code], env=_env(base_path_env),
                               cwd=tmp_path, timeout_ms=30_000)
    with pytest.raises(QmdCommandError) as info:
        result.check()
    assert str(info.value) == f"qmd -c {code} failed (code 3): only stdout"


async def test_spawn_enoent(tmp_path: Path, base_path_env: str) -> None:
    missing = tmp_path / "no-such-qmd"
    with pytest.raises(QmdCommandError) as info:
        await run_command([str(missing), "status"], env=_env(base_path_env), cwd=tmp_path,
                          timeout_ms=5000)
    err = info.value
    assert err.errno == errno.ENOENT
    assert err.returncode is None
    assert str(err) == (f"qmd status failed to start: [Errno 2] No such file or directory: "
                        f"'{missing}'")
    assert isinstance(err.__cause__, FileNotFoundError)


async def test_spawn_eacces(tmp_path: Path, base_path_env: str) -> None:
    script = tmp_path / "qmd"
    script.write_text("#!/bin/sh\necho hi\n")
    script.chmod(0o644)
    with pytest.raises(QmdCommandError) as info:
        await run_command([str(script)], env=_env(base_path_env), cwd=tmp_path, timeout_ms=5000)
    assert info.value.errno == errno.EACCES
    assert str(info.value) == f"qmd failed to start: [Errno 13] Permission denied: '{script}'"


async def test_spawn_bare_name_not_on_path(tmp_path: Path) -> None:
    with pytest.raises(QmdCommandError) as info:
        await run_command(["qmd", "--version"], env={"PATH": str(tmp_path)}, cwd=tmp_path,
                          timeout_ms=5000)
    assert info.value.errno == errno.ENOENT
    assert info.value.os_error == "[Errno 2] No such file or directory: 'qmd'"


async def test_flag_rejection_standin(tmp_path: Path, standins_dir: Path,
                                      base_path_env: str) -> None:
    argv = [str(standins_dir / "flag_reject.py"), "search", "--json", "--", "unknown flag"]
    result = await run_command(argv, env=_env(base_path_env), cwd=tmp_path, timeout_ms=30_000)
    assert result.returncode == 2
    assert result.stderr == "error: unknown flag: --json\n"
    assert is_flag_rejection(result.stderr) is True


async def test_crash_after_output_standin(tmp_path: Path, standins_dir: Path,
                                          base_path_env: str) -> None:
    result = await run_command([str(standins_dir / "crash_after_output.py"), "query"],
                               env=_env(base_path_env), cwd=tmp_path, timeout_ms=30_000)
    assert result.returncode == 134
    assert is_crash_after_output(result) is True
    hits = json.loads(result.stdout.splitlines()[1])
    assert hits[0]["file"] == "qmd://memory-dir-main/2026-01-01.md"


async def test_noisy_standin_output_is_kept_verbatim(tmp_path: Path, standins_dir: Path,
                                                     base_path_env: str) -> None:
    result = await run_command([str(standins_dir / "noisy_json.py"), "search"],
                               env=_env(base_path_env), cwd=tmp_path, timeout_ms=30_000)
    assert result.ok
    lines = result.stdout.splitlines()
    assert lines[0] == "\x1b[1mqmd\x1b[0m 2.8.3 \x1b[32mready\x1b[0m"
    assert lines[-1] == "\x1b[33mWarning:\x1b[0m 1 documents need embeddings"


def _result(*, returncode: int | None = 0, sig: int | None = None, stdout: str = "",
            stderr: str = "") -> RunResult:
    return RunResult(argv=("qmd", "query", "x"), returncode=returncode, signal=sig,
                     stdout=stdout, stderr=stderr, duration_ms=1)


def test_classifiers_match_stderr_text() -> None:
    assert is_flag_rejection("Error: Unrecognized option '--mask'") is True
    assert is_flag_rejection("flag provided but not defined: -c") is True
    assert is_flag_rejection("Unexpected argument: --glob") is True
    assert is_flag_rejection("Collection not found: x") is False
    assert is_missing_collection("Error: collection memory-root-main does not exist") is True
    assert is_missing_collection("Collection is missing") is True
    assert is_missing_collection("file not found") is False
    assert is_busy("SqliteError: SQLITE_BUSY: database is locked") is True
    assert is_busy("Database is locked") is True
    assert is_busy("disk full") is False


def test_crash_after_output_rules() -> None:
    crash = "ggml-metal-device.m:612: assertion failed"
    assert is_crash_after_output(_result(returncode=134, stdout="[]", stderr=crash)) is True
    assert is_crash_after_output(_result(returncode=None, sig=signal.SIGABRT, stdout="[]",
                                         stderr="node-llama-cpp abort")) is True
    assert is_crash_after_output(_result(returncode=1, stdout="[]", stderr=crash)) is False
    assert is_crash_after_output(_result(returncode=134, stdout="  ", stderr=crash)) is False
    assert is_crash_after_output(_result(returncode=134, stdout="[]", stderr="boom")) is False
    assert is_crash_after_output(_result(returncode=134, stdout="[]",
                                         stderr=crash + "\nSQLITE_BUSY")) is False
    # a Bun panic after the answer: any exit status but qmd's ordinary error exit 1
    panic = "panic: Segmentation fault at address 0x0\noh no: Bun has crashed."
    assert is_crash_after_output(_result(returncode=3, stdout="[]", stderr=panic)) is True
    assert is_crash_after_output(_result(returncode=1, stdout="[]", stderr=panic)) is False


def test_summarize_shows_a_multi_line_argument_on_one_line() -> None:
    argv = ["/x/bin/qmd", "query", "--json", "--", "lex: a b\nlex: a\nlex: b"]
    assert summarize(argv) == "qmd query --json -- lex: a b | lex: a | lex: b"


def test_summarize_and_result_properties() -> None:
    assert summarize(["/x/.tools/bin/qmd", "search", "--json", "--", "-leading q"]) == \
        "qmd search --json -- -leading q"
    result = _result(returncode=0, stdout="ok")
    assert result.ok is True
    assert result.summary == "qmd query x"
    assert (result.stdout_truncated, result.stderr_truncated) == (False, False)


async def test_real_qmd_double_dash_keeps_leading_dash_query(tmp_path: Path, qmd_bin: Path,
                                                             qmd_env: dict[str, str]) -> None:
    """After ``--`` a leading ``-`` reaches qmd's query grammar (negation), not its flag parser."""
    workspace = tmp_path / "ws"
    notes = workspace / "memory"
    notes.mkdir(parents=True)
    (notes / "a.md").write_text("# A\nalpha gamma\n")
    (notes / "b.md").write_text("# B\nalpha only\n")
    qmd = str(qmd_bin)

    async def run(*args: str) -> str:
        result = await run_command([qmd, *args], env=qmd_env, cwd=workspace, timeout_ms=60_000)
        return result.check().stdout

    await run("collection", "add", str(notes), "--name", "memory-dir-main", "--mask", "**/*.md",
              "--index", "index")
    flags = ["search", "--json", "-n", "6", "-c", "memory-dir-main", "--index", "index"]
    with_dash = json.loads(await run(*flags, "--", "-gamma alpha"))
    assert [h["file"] for h in with_dash] == ["qmd://memory-dir-main/b.md"]
    # Without `--`, `-gamma` is eaten as short flags and the query is just "alpha".
    without = json.loads(await run(*flags, "-gamma", "alpha"))
    assert sorted(h["file"] for h in without) == ["qmd://memory-dir-main/a.md",
                                                  "qmd://memory-dir-main/b.md"]
    # Flags after `--` are query text: as an option, `-c nope` would fail with
    # "Collection not found: nope"; as text it is just a query that matches nothing.
    as_text = await run_command([qmd, *flags, "--", "alpha", "-c", "nope"], env=qmd_env,
                                cwd=workspace, timeout_ms=60_000)
    assert (as_text.returncode, json.loads(as_text.stdout)) == (0, [])
    as_flag = await run_command([qmd, *flags, "-c", "nope", "--", "alpha"], env=qmd_env,
                                cwd=workspace, timeout_ms=60_000)
    assert (as_flag.returncode, as_flag.stderr.splitlines()[0]) == (1, "Collection not found: nope")


# Starts a sleeper that leaves the process group (setsid), again and again, as fast as it can.
_SPAWNER = """
import subprocess, sys
while True:
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", sys.argv[1]],
                     start_new_session=True)
"""


def test_kill_tree_leaves_nothing_of_a_process_that_keeps_forking(tmp_path: Path) -> None:
    """A child that starts a process leaving its group between the descendant walk and the kill
    must not leave it running: the tree is stopped before it is walked (five rounds; a walk
    then kill without stopping first left a sleeper behind in most runs)."""
    import subprocess
    import uuid

    from qmdbridge.qmd.runner import kill_tree, wait_gone

    for _ in range(5):
        marker = f"spawner-{uuid.uuid4().hex}"
        proc = subprocess.Popen([sys.executable, "-c", _SPAWNER, marker], start_new_session=True)
        try:
            while True:  # wait until it has started sleepers (they name the marker)
                started = [p for p in psutil.process_iter(["cmdline"])
                           if p.pid != proc.pid and marker in (p.info["cmdline"] or [])]
                if len(started) >= 3:
                    break
                assert proc.poll() is None
        finally:
            survivors = kill_tree(proc.pid)
            proc.wait(timeout=30)
            wait_gone(survivors)
        alive = [p for p in psutil.process_iter(["cmdline", "status"])
                 if marker in " ".join(p.info["cmdline"] or []) and p.info["status"] != psutil.STATUS_ZOMBIE]
        for p in alive:
            p.kill()
        assert alive == []
