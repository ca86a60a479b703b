"""qmd calls started ahead of the search that will make them, handed over when it makes them.

:meth:`EarlyCalls.run_command` hands over a started call of exactly the same argv, environment
and cwd, once; any other command first discards the calls not handed over (docs/cli.md, "In
qmd mode"). Standard library only until a call is handed over or killed.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from qmdbridge.qmd.streams import DEFAULT_MAX_CHARS, QmdProcess

if TYPE_CHECKING:
    from qmdbridge.qmd.runner import RunResult

__all__ = ["SEARCH_COMMANDS", "EarlyCalls"]

# qmd's search commands: they change nothing, so running one leaves the calls started ahead valid.
SEARCH_COMMANDS = ("search", "vsearch", "query")

CallKey = tuple[tuple[str, ...], tuple[tuple[str, str], ...], str]


def call_key(argv: Sequence[str], env: Mapping[str, str], cwd: Path | str) -> CallKey:
    """What must be equal for a started call to be handed over: argv, environment, cwd."""
    return tuple(str(a) for a in argv), tuple(sorted(env.items())), str(cwd)


class EarlyCalls:
    """The calls a command started ahead, until its search takes them (thread-safe); ``started``
    and ``used`` count those started and handed over."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._calls: dict[CallKey, QmdProcess] = {}  # started, not handed over
        self._all: list[QmdProcess] = []
        self._taken: set[CallKey] = set()
        self._threads: list[threading.Thread] = []
        self.discarded = False
        self.started = 0
        self.used = 0

    def attach(self, thread: threading.Thread) -> None:
        """A thread that starts calls (joined by :meth:`close`)."""
        self._threads.append(thread)

    def start(self, argv: Sequence[str], env: Mapping[str, str], cwd: Path | str) -> QmdProcess | None:
        """Start a call unless the search took that command already, the calls were discarded, or it
        cannot start; the call, or ``None``."""
        key = call_key(argv, env, cwd)
        with self._cond:
            if self.discarded or key in self._taken or key in self._calls:
                return None
            try:
                call = QmdProcess(argv, env, cwd, on_done=self._changed)
            except OSError:
                return None
            self._calls[key] = call
            self._all.append(call)
            self.started += 1
            return call

    def _changed(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def wait(self, calls: Iterable[QmdProcess], *, running_below: int = 1) -> bool:
        """Block until fewer than ``running_below`` of ``calls`` run; ``False`` when discarded meanwhile."""
        pending = list(calls)
        with self._cond:
            while not self.discarded and sum(not c.done.is_set() for c in pending) >= running_below:
                self._cond.wait()
            return not self.discarded

    def take(self, argv: Sequence[str], env: Mapping[str, str], cwd: Path | str) -> QmdProcess | None:
        """The started call of exactly this command, handed over once; never started ahead after this."""
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
        from qmdbridge.qmd.runner import kill_process

        for call in left:
            kill_process(call)

    def close(self) -> None:
        """:meth:`discard`, join the starting threads, kill what is left running and close every
        call's pipes (blocking)."""
        self.discard()
        for thread in self._threads:
            with contextlib.suppress(RuntimeError):  # not started: it starts nothing once discarded
                thread.join()
        from qmdbridge.qmd.runner import kill_process

        for call in self._all:
            kill_process(call)
            call.close_fds()

    async def run_command(self, argv: Sequence[str], *, env: Mapping[str, str], cwd: Path | str,
                          timeout_ms: int, discard_stdout: bool = False,
                          max_chars: int = DEFAULT_MAX_CHARS, setting: str | None = None) -> RunResult:
        """:func:`~qmdbridge.qmd.runner.run_command`, handing over the call started ahead of exactly
        this command; a command other than a search discards the calls not handed over first.

        Raises:
            As :func:`~qmdbridge.qmd.runner.run_command`.
        """
        import anyio

        from qmdbridge.qmd.runner import run_command, wait_process

        call = None
        if not discard_stdout and max_chars == DEFAULT_MAX_CHARS and timeout_ms > 0:
            call = self.take(argv, env, cwd)
        if call is not None:
            try:
                return await wait_process(call, timeout_ms=timeout_ms, setting=setting)
            finally:
                call.close_fds()
        if len(argv) < 2 or str(argv[1]) not in SEARCH_COMMANDS:
            await anyio.to_thread.run_sync(self.discard)
        return await run_command(argv, env=env, cwd=cwd, timeout_ms=timeout_ms,
                                 discard_stdout=discard_stdout, max_chars=max_chars, setting=setting)
