"""Starting one qmd process and draining its output: the runner's one process starter.

Standard library only, so the one-shot CLI starts a search's calls ahead with it
(``early.py``); ``runner.wait_process`` waits for it under a deadline.
"""

from __future__ import annotations

import codecs
import contextlib
import os
import selectors
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

__all__ = ["DEFAULT_MAX_CHARS", "QmdProcess", "TailBuffer"]

# Per-stream cap in characters, as in the reference runner; the buffers keep the tail.
DEFAULT_MAX_CHARS = 200_000
# Read size for the pipes, in bytes.
_READ_BYTES = 65_536
# How long a kill waits for the drain thread to see both pipes closed, in seconds.
_JOIN_WAIT_S = 3.0


class TailBuffer:
    """Incremental UTF-8 decoder (invalid bytes replaced) keeping the last ``max_chars`` code points (> 0)."""

    def __init__(self, max_chars: int) -> None:
        self.max_chars = max_chars
        self.parts: list[str] = []
        self.size = 0
        self.truncated = False  # more than max_chars were fed (the head was dropped)
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, data: bytes, *, final: bool = False) -> None:
        """Decode ``data`` (``final``: the stream ended, flush a partial character)."""
        text = self.decoder.decode(data, final)
        if not text:
            return
        self.parts.append(text)
        self.size += len(text)
        if self.size > 2 * self.max_chars:
            self._compact()

    def _compact(self) -> None:
        joined = "".join(self.parts)
        if len(joined) > self.max_chars:
            self.truncated = True
            joined = joined[-self.max_chars:]
        self.parts = [joined]
        self.size = len(joined)

    def text(self) -> str:
        """The decoded tail, at most ``max_chars`` code points."""
        self._compact()
        return self.parts[0] if self.parts else ""


class QmdProcess:
    """One process in its own session, stdin ``/dev/null``, stdout and stderr drained by a thread.

    Args:
        argv: the command line as reported (``RunResult.argv``); ``env`` is complete.
        command: what is started when it differs from ``argv`` (an exec wrapper, a batch line).
        max_chars: per-stream cap in code points (the tail is kept).
        on_done: called on the drain thread once the process is reaped and both pipes closed.

    Raises:
        OSError: the process could not be started.
    """

    def __init__(self, argv: Sequence[str], env: Mapping[str, str], cwd: Path | str, *,
                 command: Sequence[str] | str | None = None, max_chars: int = DEFAULT_MAX_CHARS,
                 discard_stdout: bool = False, on_done: Callable[[], None] | None = None) -> None:
        self.argv = tuple(str(a) for a in argv)
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            list(self.argv) if command is None else command, stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL if discard_stdout else subprocess.PIPE,
            stderr=subprocess.PIPE, cwd=str(cwd), env=dict(env), start_new_session=True)
        self.out = TailBuffer(max_chars)
        self.err = TailBuffer(max_chars)
        self.ended: float | None = None
        self.done = threading.Event()
        self._on_done = on_done
        self.wake_fd, self._wake_w = os.pipe()  # readable once done: the async side waits on it
        self._thread = threading.Thread(target=self._drain, name="qmd-process", daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        sel = selectors.DefaultSelector()
        try:
            for stream, buffer in ((self.proc.stdout, self.out), (self.proc.stderr, self.err)):
                if stream is not None:
                    sel.register(stream, selectors.EVENT_READ, buffer)
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
            self.ended = time.monotonic()
            self.done.set()
            with contextlib.suppress(OSError):  # the waiting side closed its end already
                os.write(self._wake_w, b"\0")
            os.close(self._wake_w)
            if self._on_done is not None:
                self._on_done()

    def join(self) -> None:
        """Wait (at most a few seconds) for the drain thread to see both pipes closed."""
        self._thread.join(_JOIN_WAIT_S)

    def close_fds(self) -> None:
        """Close the waiting side of the wake-up pipe; idempotent."""
        if self.wake_fd >= 0:
            os.close(self.wake_fd)
            self.wake_fd = -1
