"""qmd calls started ahead of the search that will make them, handed over when it makes them.

A one-shot ``qmdbridge search`` in qmd mode spends its start importing modules and loading
the config before it starts a qmd process, and each qmd call then takes its own time
(docs/benchmarks.md, "One-shot search in qmd mode").
The CLI starts the calls the search is going to make while it loads
(``qmdbridge/cli/qmd_prefetch.py`` works them out from recorded settings), and the backend
runs its qmd commands through :meth:`EarlyCalls.run_command` (its ``runner``), which hands over
a started call instead of spawning the same one again. Nothing else changes:

- a call is handed over only when the backend asks for exactly its argv, environment and
  working directory, once; the backend then waits for it as the runner waits for a process it
  started (the same deadline counted from that moment, the same decoding and 200,000-char caps,
  the same process-group kill and ``BackendTimeoutError`` past the deadline);
- any other command the backend runs (a collection reconcile, an update: anything but a
  search) first discards every call not handed over (killed, reaped), since its answer could
  predate that command, and nothing is started ahead after it;
- :meth:`EarlyCalls.close` discards what is left when the command ends.

Standard library only until a call is handed over or killed (``anyio``, ``psutil`` and the
runner are imported then: the search has loaded them by that time).
"""

from __future__ import annotations

import math
import os
import selectors
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from qmdbridge.qmd.streams import DEFAULT_MAX_CHARS, TailBuffer, split_status

if TYPE_CHECKING:
    from qmdbridge.qmd.runner import RunResult

__all__ = ["SEARCH_COMMANDS", "EarlyCall", "EarlyCalls"]

# qmd's search commands: they read the index and change nothing, so running one does not make
# a call started ahead stale (any other command does).
SEARCH_COMMANDS = ("search", "vsearch", "query")
# Read size for the pipes, in bytes (as the runner's).
_READ_BYTES = 65_536
# How long close() waits for a killed call's pipes to close, in seconds.
_JOIN_WAIT_S = 3.0

CallKey = tuple[tuple[str, ...], tuple[tuple[str, str], ...], str]


def call_key(argv: Sequence[str], env: Mapping[str, str], cwd: Path | str) -> CallKey:
    """What must be equal for a started call to be handed over: argv, environment, cwd."""
    return tuple(str(a) for a in argv), tuple(sorted(env.items())), str(cwd)


class EarlyCall:
    """One qmd process started ahead, as the runner starts one: no shell, its own session
    (``start_new_session=True``, so its pid is its process group), stdin ``/dev/null``, stdout
    and stderr drained by a thread into :class:`~qmdbridge.qmd.streams.TailBuffer` s.

    Args:
        argv: the command line (argv[0] the executable).
        env: the complete child environment.
        cwd: the working directory.
        on_done: called (on the drain thread) once the process is reaped and both pipes closed.

    Raises:
        OSError: the process could not be started (the backend, running the same command, meets
            the same error from the runner).
    """

    def __init__(self, argv: Sequence[str], env: Mapping[str, str], cwd: Path | str, *,
                 on_done: Callable[[], None]) -> None:
        self.argv = tuple(str(a) for a in argv)
        self.started = time.monotonic()
        self.proc = subprocess.Popen(list(self.argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, cwd=str(cwd), env=dict(env),
                                     start_new_session=True)
        self._out = TailBuffer(DEFAULT_MAX_CHARS)
        self._err = TailBuffer(DEFAULT_MAX_CHARS)
        self.stdout = ""  # both decoded once the call is done
        self.stderr = ""
        self.ended: float | None = None
        self.done = threading.Event()
        self._on_done = on_done
        self._wake_r, self._wake_w = os.pipe()  # readable once done: the async side waits on it
        self._thread = threading.Thread(target=self._drain, name="qmd-early-call", daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        sel = selectors.DefaultSelector()
        try:
            for stream, buffer in ((self.proc.stdout, self._out), (self.proc.stderr, self._err)):
                sel.register(stream, selectors.EVENT_READ, buffer)  # type: ignore[arg-type]
            while sel.get_map():
                for key, _ in sel.select():
                    data = os.read(key.fd, _READ_BYTES)
                    key.data.feed(data, final=not data)
                    if not data:
                        sel.unregister(key.fileobj)
            self.proc.wait()
        finally:
            sel.close()
            for stream in (self.proc.stdout, self.proc.stderr):
                if stream is not None:
                    stream.close()
            self.stdout, self.stderr = self._out.text(), self._err.text()
            self.ended = time.monotonic()
            os.write(self._wake_w, b"\0")  # (its fds are closed only once this thread ended)
            self.done.set()
            self._on_done()

    @property
    def ok(self) -> bool:
        """Done with exit code 0."""
        return self.done.is_set() and self.proc.returncode == 0

    def kill(self) -> None:
        """Kill the call's process group and every descendant that is still running, and reap
        it (blocking: at most a few seconds for descendants that left the group)."""
        if not self.done.is_set():
            from qmdbridge.qmd.runner import kill_tree, wait_gone

            survivors = kill_tree(self.proc.pid)
            self.proc.wait()
            self._thread.join(_JOIN_WAIT_S)
            wait_gone(survivors)

    def close_fds(self) -> None:
        """Close the wake-up pipe once the drain thread ended (else leave it: that thread may
        still write to it); idempotent."""
        self._thread.join(_JOIN_WAIT_S)
        if self._thread.is_alive():
            return
        for fd in (self._wake_r, self._wake_w):
            if fd >= 0:
                os.close(fd)
        self._wake_r = self._wake_w = -1

    async def result(self, *, timeout_ms: int, backend: str = "qmd",
                     setting: str | None = None) -> RunResult:
        """Wait for the call as :func:`qmdbridge.qmd.runner.run_command` waits for its process.

        Args:
            timeout_ms: the deadline in ms from now, > 0.
            backend / setting: named by the timeout error, as the runner names them.

        Returns:
            The :class:`~qmdbridge.qmd.runner.RunResult` (whatever the exit code).

        Raises:
            BackendTimeoutError: the deadline passed (the process tree was killed and reaped
                first); an outside cancellation kills it too and propagates.
        """
        import anyio

        from fallback.errors import BackendTimeoutError
        from qmdbridge.qmd.runner import RunResult, summarize

        finished = False
        try:
            with anyio.move_on_after(timeout_ms / 1000):
                while not self.done.is_set():
                    await anyio.wait_readable(self._wake_r)
                finished = True
        finally:
            if not finished:  # past the deadline, or cancelled from outside
                with anyio.CancelScope(shield=True):
                    await anyio.to_thread.run_sync(self.kill)
        if not finished:
            raise BackendTimeoutError(backend, summarize(self.argv), timeout_ms, setting=setting)
        returncode, sig = split_status(self.proc.returncode)
        ended = self.ended if self.ended is not None else time.monotonic()  # set before done
        return RunResult(argv=self.argv, returncode=returncode, signal=sig, stdout=self.stdout,
                         stderr=self.stderr, duration_ms=max(0, math.floor((ended - self.started) * 1000)),
                         stdout_truncated=self._out.truncated, stderr_truncated=self._err.truncated)


class EarlyCalls:
    """The calls a command started ahead, until its search takes them (thread-safe).

    ``started`` and ``used`` count the calls started ahead and those handed over.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._calls: dict[CallKey, EarlyCall] = {}  # started, not handed over
        self._all: list[EarlyCall] = []
        self._taken: set[CallKey] = set()
        self._threads: list[threading.Thread] = []
        self.discarded = False
        self.started = 0
        self.used = 0

    def attach(self, thread: threading.Thread) -> None:
        """A thread that starts calls (joined by :meth:`close`)."""
        self._threads.append(thread)

    def start(self, argv: Sequence[str], env: Mapping[str, str], cwd: Path | str) -> EarlyCall | None:
        """Start a call, unless the search already ran (or is running) that command, the calls
        were discarded, or the process cannot be started (the search meets that error itself).

        Returns:
            The started call, or ``None``.
        """
        key = call_key(argv, env, cwd)
        with self._cond:
            if self.discarded or key in self._taken or key in self._calls:
                return None
            try:
                call = EarlyCall(argv, env, cwd, on_done=self._changed)
            except OSError:
                return None
            self._calls[key] = call
            self._all.append(call)
            self.started += 1
            return call

    def _changed(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def wait(self, calls: Iterable[EarlyCall], *, running_below: int = 1) -> bool:
        """Block until fewer than ``running_below`` of ``calls`` are still running (``1``: all
        done); False when the calls were discarded meanwhile."""
        pending = list(calls)
        with self._cond:
            while not self.discarded and sum(not c.done.is_set() for c in pending) >= running_below:
                self._cond.wait()
            return not self.discarded

    def take(self, argv: Sequence[str], env: Mapping[str, str], cwd: Path | str) -> EarlyCall | None:
        """The started call of exactly this command, handed over once; the command is never
        started ahead after this (the caller runs it)."""
        key = call_key(argv, env, cwd)
        with self._cond:
            self._taken.add(key)
            call = self._calls.pop(key, None)
            self.used += call is not None
            return call

    def discard(self) -> None:
        """Kill and reap every call not handed over, and start none from now on (blocking)."""
        with self._cond:
            self.discarded = True
            left = list(self._calls.values())
            self._calls.clear()
            self._cond.notify_all()
        for call in left:
            call.kill()

    def close(self) -> None:
        """:meth:`discard`, wait for the threads that start calls, kill a call handed over but
        left running (its search was interrupted) and close every call's pipes (blocking)."""
        self.discard()
        for thread in self._threads:
            try:
                thread.join()
            except RuntimeError:  # interrupted before it ran: it starts nothing once discarded
                pass
        for call in self._all:
            call.kill()
            call.close_fds()

    async def run_command(self, argv: Sequence[str], *, env: Mapping[str, str], cwd: Path | str,
                          timeout_ms: int, discard_stdout: bool = False,
                          max_chars: int = DEFAULT_MAX_CHARS, backend: str = "qmd",
                          setting: str | None = None) -> RunResult:
        """:func:`qmdbridge.qmd.runner.run_command`, handing over the call started ahead of
        exactly this command when there is one (see the module docstring); a command other
        than a search discards the calls not handed over first.

        Raises:
            As :func:`~qmdbridge.qmd.runner.run_command`.
        """
        import anyio

        from qmdbridge.qmd.runner import run_command

        call = None
        if not discard_stdout and max_chars == DEFAULT_MAX_CHARS and timeout_ms > 0:
            call = self.take(argv, env, cwd)
        if call is not None:
            return await call.result(timeout_ms=timeout_ms, backend=backend, setting=setting)
        if len(argv) < 2 or str(argv[1]) not in SEARCH_COMMANDS:
            await anyio.to_thread.run_sync(self.discard)
        return await run_command(argv, env=env, cwd=cwd, timeout_ms=timeout_ms,
                                 discard_stdout=discard_stdout, max_chars=max_chars,
                                 backend=backend, setting=setting)
