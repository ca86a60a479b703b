"""Async subprocess runner for qmd: no shell, deadlines, process-group kill, capped output.

``run_command(argv, env=..., cwd=..., timeout_ms=...)`` starts one process in its own session
(``start_new_session=True``, so its pid is also its process-group id) with
:class:`~qmdbridge.qmd.streams.QmdProcess`, which drains stdout and stderr at the same time (so
a full pipe can never deadlock) and keeps only the *last* ``max_chars`` characters of each, and
waits for it (:func:`wait_process`, which also waits for the calls a one-shot search started
ahead). It returns a frozen :class:`RunResult`; a non-zero exit does not raise
(``RunResult.check()`` does).

On a timeout, or when an enclosing cancel scope cancels the call (``anyio.fail_after`` around
it), the runner first stops and collects every descendant with psutil (``bin/qmd`` style
launchers spawn a worker, and a worker may have left the group), then sends SIGKILL to the
process group and the collected descendants, and reaps the direct child, all shielded. A
timeout then raises :class:`~fallback.errors.BackendTimeoutError`; an outside cancellation
propagates unchanged.

This module is also the one place where subprocess errors are translated: a spawn failure
(``ENOENT``, ``EACCES``, a missing ``cwd``) becomes :class:`QmdCommandError` with the OS reason.
The classifier helpers (:func:`is_flag_rejection`, :func:`is_missing_collection`,
:func:`is_busy`, :func:`is_crash_after_output`, :func:`is_vector_module_missing`) look at
stderr (and the exit status) only, never at the command
summary, so a user's query can never trigger them. How qmd parses a command line, and so
how every qmd command line is built: ``query_text.qmd_argv``.
"""

from __future__ import annotations

import errno as errno_mod
import math
import os
import shutil
import signal as signal_mod
import sys
import time
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import anyio
from anyio.abc import Process

from fallback.errors import BackendTimeoutError, UsageError
from qmdbridge.command_line import batch_command, is_batch_script
from qmdbridge.qmd.errors import QmdCommandError
from qmdbridge.qmd.streams import DEFAULT_MAX_CHARS, QmdProcess, split_status

if TYPE_CHECKING:  # psutil is loaded only to kill a process tree (its import cost: docs/benchmarks.md)
    import psutil

__all__ = ["CommandRunner", "parent_death_argv", "RunResult", "is_busy", "is_crash_after_output",
           "is_flag_rejection", "is_missing_collection", "is_vector_module_missing", "kill_and_reap",
           "kill_process", "kill_tree", "process_command", "run_command",
           "spawn_error_is_missing_file", "summarize", "wait_gone", "wait_process"]

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
_VECTOR_MODULE_MISSING = "no such module: vec0"


def summarize(argv: Sequence[str]) -> str:
    """The command summary used in every message: ``qmd`` + the arguments after argv[0].

    ``summarize(["/x/bin/qmd", "search", "--json", "--", "foo"])`` -> ``"qmd search --json -- foo"``.
    The query text is part of it, so it is for messages only, never for classification. An
    argument of several lines (the ``lex:`` lines of a question's ``qmd query``) is shown on one
    line, its lines joined by `` | ``, so every message that starts with the summary stays one
    line and keeps what follows it (``failed (code 3)``, the error).
    """
    return " ".join(["qmd", *(" | ".join(a.splitlines()) if "\n" in a else a for a in argv[1:])])


@dataclass(frozen=True)
class RunResult:
    """What one finished process produced.

    Attributes:
        argv: the command line as run (argv[0] is the executable).
        returncode: exit code; ``None`` when a signal ended the process.
        signal: signal number that ended the process, else ``None``.
        stdout: decoded stdout (UTF-8, invalid bytes replaced), at most ``max_chars`` code points,
            the tail kept; ``""`` when stdout was discarded.
        stderr: decoded stderr, same rules.
        duration_ms: wall time from spawn to reap, in ms.
        stdout_truncated: True when stdout produced more than ``max_chars`` chars (the head was
            dropped). A search caller reports it as
            ``<summary> produced too much output (limit 200000 chars)``.
        stderr_truncated: the same for stderr.
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
        """True when the process exited with code 0."""
        return self.returncode == 0

    @property
    def summary(self) -> str:
        """``qmd`` + the arguments (see :func:`summarize`)."""
        return summarize(self.argv)

    @property
    def truncated(self) -> bool:
        """True when either stream overflowed its cap."""
        return self.stdout_truncated or self.stderr_truncated

    def check(self) -> RunResult:
        """Return self when the exit code is 0.

        Raises:
            QmdCommandError: exit code non-zero or killed by a signal; carries both streams.
        """
        if self.ok:
            return self
        raise QmdCommandError(self.summary, returncode=self.returncode, signal=self.signal,
                              stdout_tail=self.stdout, stderr_tail=self.stderr)


def _freeze(pid: int) -> list[psutil.Process]:
    """SIGSTOP the process group ``pid`` and every descendant, walking again until a walk finds
    no process it had not stopped; return the descendants. A stopped process can't fork, so a
    child that would leave the group (``setsid``) between the walk and the kill is not missed
    (Linux restarts a fork that a signal interrupts, so no child is half made)."""
    import psutil

    try:
        os.killpg(pid, signal_mod.SIGSTOP)
    except (ProcessLookupError, PermissionError):
        pass
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
            try:
                proc.suspend()
            except psutil.Error:
                continue
    return list(found.values())


def _kill_tree(pid: int, descendants: list[psutil.Process]) -> list[psutil.Process]:
    """SIGKILL the process group ``pid`` and every collected descendant; return the survivors."""
    import psutil

    try:
        os.killpg(pid, signal_mod.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
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


def kill_tree(pid: int) -> list[psutil.Process]:
    """SIGKILL the process group ``pid`` (a child started with ``start_new_session=True``) and
    every descendant, all stopped and collected first (a worker may have left the group, and a
    running one could start another after the walk); returns the killed descendants, for
    :func:`wait_gone`. The caller reaps its direct child."""
    return _kill_tree(pid, _freeze(pid))


def wait_gone(procs: list[psutil.Process]) -> None:
    """Block until every process in ``procs`` is dead (or ``_REAP_WAIT_S``, 3 s, passed)."""
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
    """Kill a started process's tree (:func:`kill_tree`) unless it ended, and reap it (blocking:
    at most a few seconds for descendants that left the group)."""
    if not process.done.is_set():
        survivors = kill_tree(process.proc.pid)
        process.proc.wait()
        process.join()
        wait_gone(survivors)


async def kill_and_reap(process: Process) -> None:
    """Kill ``process``'s whole tree and reap it; runs shielded so a cancellation can't skip it.

    Every descendant is collected with psutil first, then the process group ``process.pid``
    (the child was started with ``start_new_session=True``) gets SIGKILL, the collected
    descendants that survived are killed, and the direct child is reaped."""
    with anyio.CancelScope(shield=True):
        survivors = kill_tree(process.pid)
        await process.wait()
        await anyio.to_thread.run_sync(wait_gone, survivors)


class CommandRunner(Protocol):
    """What starts a qmd process and waits for it: :func:`run_command`'s signature. The backend
    takes one (``QmdBackend(runner=...)``); the one-shot CLI passes the calls it started ahead
    (``qmdbridge.qmd.early.EarlyCalls.run_command``)."""

    def __call__(self, argv: Sequence[str], *, env: Mapping[str, str], cwd: Path | str,
                 timeout_ms: int, discard_stdout: bool = False, max_chars: int = DEFAULT_MAX_CHARS,
                 backend: str = "qmd", setting: str | None = None) -> Awaitable[RunResult]:
        """Run ``argv`` to completion or to ``timeout_ms`` (see :func:`run_command`)."""
        ...


def process_command(argv: Sequence[str]) -> str | list[str]:
    """What to hand to ``open_process`` for ``argv``: the list itself, except for a
    ``.cmd``/``.bat`` program on Windows, which starts only through cmd.exe: then the string form
    that runs ``%COMSPEC% /c "<line>"`` with every argument escaped for cmd
    (:func:`qmdbridge.command_line.batch_command`)."""
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


def parent_death_argv(argv: list[str], *, parent_pid: int | None = None) -> list[str]:
    """``argv`` behind an exec wrapper that sets ``PR_SET_PDEATHSIG`` = SIGKILL on Linux.

    The wrapper (``python -I -S -c ...``, once per start) sets the signal, exits if
    ``parent_pid`` (default: this process) is no longer its parent, and ``execvp``\\ s
    ``argv`` in place, so the child keeps its pid and dies when the thread that started it ends
    (the event loop's thread). Elsewhere ``argv`` is returned unchanged.
    """
    if not sys.platform.startswith("linux"):
        return list(argv)
    pid = os.getpid() if parent_pid is None else parent_pid
    return [sys.executable, "-I", "-S", "-c", _PDEATHSIG_EXEC, str(pid), *argv]


async def run_command(argv: Sequence[str], *, env: Mapping[str, str], cwd: Path | str,
                      timeout_ms: int, discard_stdout: bool = False,
                      max_chars: int = DEFAULT_MAX_CHARS, backend: str = "qmd",
                      setting: str | None = None) -> RunResult:
    """Run ``argv`` (no shell) to completion or to its deadline.

    Args:
        argv: executable and arguments; the executable is used as given (a bare name is looked
            up in ``env["PATH"]``). On Windows a ``.cmd``/``.bat`` executable runs through
            ``cmd.exe /c`` with each argument escaped for cmd.
        env: the complete child environment (nothing is inherited implicitly).
        cwd: working directory of the child (qmd's cwd is the agent workspace).
        timeout_ms: deadline in ms, > 0, from spawn to exit.
        discard_stdout: send stdout to /dev/null (``qmd update`` / ``qmd embed``); the result's
            ``stdout`` is then ``""`` and never truncated.
        max_chars: per-stream cap in code points; the last ``max_chars`` are kept.
        backend: backend name carried by the errors.
        setting: the config key of ``timeout_ms`` (``memory.qmd.update.updateTimeoutMs``),
            named in the timeout message.

    A qmd ``update``, ``embed`` or ``collection`` command (:data:`OUTLIVE_NO_PARENT`: they may
    run for minutes on a large corpus) starts on Linux behind :func:`parent_death_argv`, so it
    is killed when this process dies, even by ``kill -9``, which leaves no one to enforce the
    deadline; searches end within ``limits.timeoutMs`` and do not pay the wrapper's start.

    Returns:
        The :class:`RunResult`, whatever the exit code.

    Raises:
        UsageError: empty ``argv``, ``timeout_ms <= 0`` or ``max_chars <= 0``.
        QmdCommandError: the process could not be started (``os_error``/``errno`` set).
        BackendTimeoutError: the deadline passed; the whole process tree was killed and reaped
            first. Message: ``<summary> timed out after <timeout_ms>ms (<setting>)``.
    """
    if not argv:
        raise UsageError("run_command needs a non-empty argv")
    if timeout_ms <= 0:
        raise UsageError(f"timeout_ms must be > 0, got {timeout_ms}")
    if max_chars <= 0:
        raise UsageError(f"max_chars must be > 0, got {max_chars}")
    argv_t = tuple(str(a) for a in argv)
    command = process_command(argv_t)
    if len(argv_t) > 1 and argv_t[1] in OUTLIVE_NO_PARENT and isinstance(command, list) \
            and shutil.which(command[0], path=env.get("PATH")):  # a missing one fails to start
        command = parent_death_argv(command)
    try:
        process = QmdProcess(argv_t, env, cwd, command=command, max_chars=max_chars,
                             discard_stdout=discard_stdout)
    except OSError as exc:
        raise QmdCommandError(summarize(argv_t), os_error=str(exc), errno=exc.errno,
                              backend=backend) from exc
    try:
        return await wait_process(process, timeout_ms=timeout_ms, backend=backend, setting=setting)
    finally:
        process.close_fds()


async def wait_process(process: QmdProcess, *, timeout_ms: int, backend: str = "qmd",
                       setting: str | None = None) -> RunResult:
    """Wait for a started process until it ends or ``timeout_ms`` (from now) passes.

    Args:
        process: the started process (:class:`~qmdbridge.qmd.streams.QmdProcess`).
        timeout_ms: the deadline in ms from now, > 0.
        backend / setting: named by the timeout error.

    Returns:
        The :class:`RunResult` (whatever the exit code).

    Raises:
        BackendTimeoutError: the deadline passed (the process tree was killed and reaped
            first); an outside cancellation kills it too and propagates.
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
        raise BackendTimeoutError(backend, summarize(process.argv), timeout_ms, setting=setting)
    returncode, sig = split_status(process.proc.returncode)
    ended = process.ended if process.ended is not None else time.monotonic()
    return RunResult(argv=process.argv, returncode=returncode, signal=sig, stdout=process.out.text(),
                     stderr=process.err.text(),
                     duration_ms=max(0, math.floor((ended - process.started) * 1000)),
                     stdout_truncated=process.out.truncated, stderr_truncated=process.err.truncated)


def is_flag_rejection(stderr: str) -> bool:
    """True when stderr says a flag was not understood (a marker of spec 2.8.3's list,
    case-insensitive). Real qmd 2.8.3 ignores unknown flags, so this only fires for other qmd
    builds. Match stderr only, never the summary."""
    low = stderr.lower()
    return any(marker in low for marker in _FLAG_REJECTION_MARKERS)


def is_missing_collection(stderr: str) -> bool:
    """True when stderr says a collection is missing (``Collection not found: <name>``).

    Rule: contains ``collection`` and one of ``not found`` / ``does not exist`` / ``missing``
    (case-insensitive).
    """
    low = stderr.lower()
    return "collection" in low and any(marker in low for marker in _MISSING_COLLECTION_MARKERS)


def is_busy(stderr: str) -> bool:
    """True when stderr reports a locked index (``SQLITE_BUSY`` / ``database is locked``)."""
    low = stderr.lower()
    return any(marker in low for marker in _BUSY_MARKERS)


def is_crash_after_output(result: RunResult) -> bool:
    """True when qmd died after printing its answer (spec 2.8.3 case 31, widened by field
    reports: a Bun ``panic: Segmentation fault`` with exit 3).

    Conditions: killed by a signal, or any exit status but qmd's ordinary error exit 1 (134
    from abort, 3 from a Bun panic ...); stdout is not empty; stderr carries a crash marker
    (a llama.cpp, abort, segfault or panic line) and is not a flag rejection, missing collection
    or busy index. The caller still has to find a complete result array in stdout.
    """
    if result.ok or not result.stdout.strip():
        return False
    if result.signal is None and result.returncode == _ERROR_EXIT_CODE:
        return False
    low = result.stderr.lower()
    if not any(marker in low for marker in _CRASH_MARKERS):
        return False
    return not (is_flag_rejection(result.stderr) or is_missing_collection(result.stderr)
                or is_busy(result.stderr))


def is_vector_module_missing(stderr: str) -> bool:
    """True when qmd's SQLite could not open its vector table: ``no such module: vec0`` (qmd
    started by Bun while its sqlite-vec extension loads only under Node)."""
    return _VECTOR_MODULE_MISSING in stderr.lower()


def spawn_error_is_missing_file(exc: QmdCommandError) -> bool:
    """True when ``exc`` is a spawn failure with ENOENT (missing program or interpreter)."""
    return exc.errno == errno_mod.ENOENT
