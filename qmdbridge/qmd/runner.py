"""Async subprocess runner for qmd: no shell, deadlines, process-group kill, capped output.

Each process starts in its own session; stdout and stderr are drained together, the tail of
each kept (``streams.QmdProcess``). On a timeout or an outside cancellation every descendant is
stopped and collected with psutil, then the group and the collected descendants get SIGKILL
and the child is reaped, shielded. Subprocess errors are translated here only; the classifiers
read stderr and the exit status, never the command summary (which holds the user's query).
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import signal as signal_mod
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
from anyio.abc import Process

from fallback.errors import BackendTimeoutError
from qmdbridge.command_line import batch_command, is_batch_script
from qmdbridge.qmd.errors import QmdCommandError
from qmdbridge.qmd.streams import DEFAULT_MAX_CHARS, QmdProcess

if TYPE_CHECKING:  # psutil is loaded only to kill a process tree (its import cost: docs/benchmarks.md)
    import psutil

__all__ = ["CommandRunner", "parent_death_argv", "RunResult", "is_busy", "is_crash_after_output",
           "is_flag_rejection", "is_missing_collection", "is_vector_module_missing", "kill_and_reap",
           "kill_process", "kill_tree", "process_command", "run_command", "summarize", "wait_gone",
           "wait_process"]

# How long to wait for killed descendants to disappear, in seconds.
_REAP_WAIT_S = 3.0
# How many descendant walks a kill makes at most before it stops looking for new processes.
_FREEZE_WALKS = 8

_FLAG_REJECTION_MARKERS = (
    "unknown flag",
    "unknown option",
    "unrecognized option",
    "flag provided but not defined",
    "unexpected argument",
)
_MISSING_COLLECTION_MARKERS = ("not found", "does not exist", "missing")
_BUSY_MARKERS = ("sqlite_busy", "database is locked")
_CRASH_MARKERS = ("ggml-metal", "node-llama-cpp", "llama.cpp", "abort trap", "assertion failed",
                  "segmentation fault", "sigsegv", "panic:", "bus error", "illegal instruction",
                  "core dumped")
# qmd's exit status for an ordinary error (a message on stderr): never read as a crash.
_ERROR_EXIT_CODE = 1


def summarize(argv: Sequence[str]) -> str:
    """The command summary of every message: ``qmd`` + the arguments after argv[0], a multi-line
    argument joined by `` | ``. For messages only, never for classification."""
    return " ".join(["qmd", *(" | ".join(a.splitlines()) if "\n" in a else a for a in argv[1:])])


@dataclass(frozen=True)
class RunResult:
    """What one finished process produced.

    Attributes:
        argv: the command line as run.
        returncode: exit code; ``None`` when a signal ended the process.
        signal: the signal that ended the process, else ``None``.
        stdout / stderr: decoded text (invalid UTF-8 replaced), at most ``max_chars`` code points,
            the tail kept; stdout ``""`` when discarded.
        duration_ms: wall time from spawn to reap, ms.
        stdout_truncated / stderr_truncated: the stream overflowed its cap (the head was dropped).
    """

    argv: tuple[str, ...]
    returncode: int | None
    signal: int | None
    stdout: str
    stderr: str
    duration_ms: int
    stdout_truncated: bool = False
    stderr_truncated: bool = False

    @property
    def ok(self) -> bool:
        """Whether the process exited with code 0."""
        return self.returncode == 0

    @property
    def message(self) -> str:
        """stderr, or stdout when stderr is empty."""
        return self.stderr.strip() or self.stdout.strip()

    @property
    def summary(self) -> str:
        """``qmd`` + the arguments (:func:`summarize`)."""
        return summarize(self.argv)

    def check(self) -> RunResult:
        """Return self when the exit code is 0.

        Raises:
            QmdCommandError: a non-zero exit or a signal; carries both streams.
        """
        if self.ok:
            return self
        from qmdbridge.qmd.query_text import loads_models  # only for a failure

        raise QmdCommandError(self.summary, returncode=self.returncode, signal=self.signal,
                              stdout_tail=self.stdout, stderr_tail=self.stderr,
                              loads_models=loads_models(self.argv))


def _freeze(pid: int) -> list[psutil.Process]:
    """SIGSTOP the group ``pid`` and every descendant, walking until no new one appears (a stopped
    process can't fork away); return the descendants."""
    import psutil

    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal_mod.SIGSTOP)
    found: dict[int, psutil.Process] = {}
    for _ in range(_FREEZE_WALKS):
        try:
            walk = psutil.Process(pid).children(recursive=True)
        except psutil.Error:
            walk = []
        fresh = [p for p in walk if p.pid not in found]
        if not fresh:
            break
        for proc in fresh:
            found[proc.pid] = proc
            with contextlib.suppress(psutil.Error):
                proc.suspend()
    return list(found.values())


def kill_tree(pid: int) -> list[psutil.Process]:
    """SIGKILL the process group ``pid`` and every descendant, stopped and collected first; returns
    the killed descendants for :func:`wait_gone`. The caller reaps its direct child."""
    import psutil

    descendants = _freeze(pid)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal_mod.SIGKILL)
    alive: list[psutil.Process] = []
    for proc in descendants:
        try:
            proc.kill()  # psutil checks the pid still belongs to the same process (create time)
            alive.append(proc)
        except psutil.NoSuchProcess:
            continue
        except psutil.Error:
            alive.append(proc)
    return alive


def _is_dead(proc: psutil.Process) -> bool:
    # A killed descendant was re-parented away from us; until its new parent reaps it, it is a
    # zombie: dead, holding no resources, and not ours to reap.
    import psutil

    try:
        return proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
    except psutil.Error:
        return False


def wait_gone(procs: list[psutil.Process]) -> None:
    """Block until every process in ``procs`` is dead, or ``_REAP_WAIT_S`` passed."""
    deadline = time.monotonic() + _REAP_WAIT_S
    delay_s = 0.005
    pending = list(procs)
    while pending:
        pending = [p for p in pending if not _is_dead(p)]
        if not pending or time.monotonic() >= deadline:
            return
        time.sleep(delay_s)
        delay_s = min(delay_s * 2, 0.1)


def kill_process(process: QmdProcess) -> None:
    """Kill a started process's tree unless it ended, and reap it (blocking)."""
    if not process.done.is_set():
        survivors = kill_tree(process.proc.pid)
        process.proc.wait()
        process.join()
        wait_gone(survivors)


async def kill_and_reap(process: Process) -> None:
    """Kill ``process``'s whole tree (:func:`kill_tree`) and reap it, shielded from cancellation."""
    with anyio.CancelScope(shield=True):
        survivors = kill_tree(process.pid)
        await process.wait()
        await anyio.to_thread.run_sync(wait_gone, survivors)


# What starts a qmd process and waits for it, with :func:`run_command`'s arguments.
CommandRunner = Callable[..., Awaitable[RunResult]]


def process_command(argv: Sequence[str]) -> str | list[str]:
    """What ``open_process`` gets for ``argv``: the list, or for a ``.cmd``/``.bat`` program on
    Windows the escaped ``cmd.exe /c`` line (``command_line.batch_command``)."""
    argv_t = [str(a) for a in argv]
    if os.name == "nt" and is_batch_script(argv_t[0]):
        return batch_command(argv_t[0], argv_t[1:])
    return argv_t


# qmd commands that may run for minutes: they die with this process (run_command).
OUTLIVE_NO_PARENT = frozenset({"update", "embed", "collection"})
# Execs the rest of argv with PR_SET_PDEATHSIG = SIGKILL (prctl option 1), unless the parent
# (argv[1]) is already gone; the setting survives exec (Linux clears it only for set-uid).
_PDEATHSIG_EXEC = ("import ctypes,os,signal,sys\n"
                   "ctypes.CDLL(None,use_errno=True).prctl(1,signal.SIGKILL)\n"
                   "os.getppid()==int(sys.argv[1]) or os._exit(1)\n"
                   "os.execvp(sys.argv[2],sys.argv[2:])\n")


def parent_death_argv(argv: list[str]) -> list[str]:
    """``argv`` behind an exec wrapper that sets ``PR_SET_PDEATHSIG`` = SIGKILL on Linux, so the
    child (same pid) dies with the thread that started it; elsewhere ``argv`` unchanged."""
    if not sys.platform.startswith("linux"):
        return list(argv)
    return [sys.executable, "-I", "-S", "-c", _PDEATHSIG_EXEC, str(os.getpid()), *argv]


async def run_command(argv: Sequence[str], *, env: Mapping[str, str], cwd: Path | str,
                      timeout_ms: int, discard_stdout: bool = False,
                      max_chars: int = DEFAULT_MAX_CHARS, setting: str | None = None) -> RunResult:
    """Run ``argv`` (no shell) to completion or to its deadline; ``update``, ``embed`` and
    ``collection`` commands start behind :func:`parent_death_argv` on Linux.

    Args:
        argv: executable and arguments, not empty (a bare name is looked up in ``env["PATH"]``).
        env: the complete child environment. cwd: its working directory.
        timeout_ms: deadline in ms from spawn, > 0.
        discard_stdout: send stdout to /dev/null.
        max_chars: per-stream cap in code points, > 0 (the tail is kept).
        setting: the config key of ``timeout_ms``, named in the timeout message.

    Returns:
        The :class:`RunResult`, whatever the exit code.

    Raises:
        QmdCommandError: the process could not be started.
        BackendTimeoutError: the deadline passed (the process tree was killed and reaped first).
    """
    argv_t = tuple(str(a) for a in argv)
    command = process_command(argv_t)
    if len(argv_t) > 1 and argv_t[1] in OUTLIVE_NO_PARENT and isinstance(command, list) \
            and shutil.which(command[0], path=env.get("PATH")):  # a missing one fails to start
        command = parent_death_argv(command)
    try:
        process = QmdProcess(argv_t, env, cwd, command=command, max_chars=max_chars,
                             discard_stdout=discard_stdout)
    except OSError as exc:
        raise QmdCommandError(summarize(argv_t), os_error=str(exc), errno=exc.errno) from exc
    try:
        return await wait_process(process, timeout_ms=timeout_ms, setting=setting)
    finally:
        process.close_fds()


async def wait_process(process: QmdProcess, *, timeout_ms: int, setting: str | None = None) -> RunResult:
    """Wait for a started process until it ends or ``timeout_ms`` (ms from now) passes.

    Returns:
        The :class:`RunResult` (whatever the exit code).

    Raises:
        BackendTimeoutError: the deadline passed (the process tree was killed and reaped first);
            an outside cancellation kills it too and propagates.
    """
    finished = False
    try:
        with anyio.move_on_after(timeout_ms / 1000):
            while not process.done.is_set():
                await anyio.wait_readable(process.wake_fd)
            finished = True
    finally:
        if not finished:  # past the deadline, or cancelled from outside
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(kill_process, process)
    if not finished:
        raise BackendTimeoutError("qmd", summarize(process.argv), timeout_ms, setting=setting)
    code = process.proc.returncode  # -N: ended by signal N
    returncode, sig = (None, -code) if code is not None and code < 0 else (code, None)
    ended = process.ended if process.ended is not None else time.monotonic()
    return RunResult(argv=process.argv, returncode=returncode, signal=sig, stdout=process.out.text(),
                     stderr=process.err.text(),
                     duration_ms=max(0, math.floor((ended - process.started) * 1000)),
                     stdout_truncated=process.out.truncated, stderr_truncated=process.err.truncated)


def _says(stderr: str, markers: tuple[str, ...]) -> bool:
    low = stderr.lower()
    return any(marker in low for marker in markers)


def is_flag_rejection(stderr: str) -> bool:
    """Whether stderr says a flag was not understood (spec 2.8.3's markers)."""
    return _says(stderr, _FLAG_REJECTION_MARKERS)


def is_missing_collection(stderr: str) -> bool:
    """Whether stderr says a collection is missing (``collection`` and ``not found``/``does not exist``/``missing``)."""
    return _says(stderr, ("collection",)) and _says(stderr, _MISSING_COLLECTION_MARKERS)


def is_busy(stderr: str) -> bool:
    """Whether stderr reports a locked index (``SQLITE_BUSY`` / ``database is locked``)."""
    return _says(stderr, _BUSY_MARKERS)


def is_crash_after_output(result: RunResult) -> bool:
    """Whether qmd died after printing its answer (spec 2.8.3 case 31): a signal or an exit status
    other than 1, stdout not empty, a crash marker on stderr and no other classified error. The
    caller still has to find a complete result array."""
    if result.ok or not result.stdout.strip() or not _says(result.stderr, _CRASH_MARKERS):
        return False
    if result.signal is None and result.returncode == _ERROR_EXIT_CODE:
        return False
    return not (is_flag_rejection(result.stderr) or is_missing_collection(result.stderr)
                or is_busy(result.stderr))


def is_vector_module_missing(stderr: str) -> bool:
    """Whether qmd's SQLite could not open its vector table (``no such module: vec0``)."""
    return _says(stderr, ("no such module: vec0",))
