"""The qmd sidecar's errors, all :class:`~fallback.errors.BackendUnavailableError` subclasses::

    BackendUnavailableError (fallback/errors.py)
     +-- QmdCommandError   a qmd process could not start, exited non-zero or was killed
     |    +-- QmdBusyError qmd's index stayed busy (SQLITE_BUSY) through the retries
     |    +-- QmdQueryTooLongError  the system would not start qmd with a query that long
     +-- QmdOutputError    qmd's stdout is not a search-result array
     +-- QmdIndexLostError qmd's index lost its documents or is corrupt; it is being re-indexed
     +-- QmdMcpError       the warm ``qmd mcp`` child could not answer (never reaches the manager)
"""

from __future__ import annotations

import os
import re

from fallback.errors import BackendUnavailableError
from qmdbridge.problems import CRASH_HINT

__all__ = ["CRASH_SIGNALS", "QmdBusyError", "QmdCommandError", "QmdIndexLostError", "QmdMcpError",
           "QmdOutputError", "QmdQueryTooLongError", "one_line"]

# Most of a failing command's output kept in its error message (chars, the tail).
_MESSAGE_TAIL_CHARS = 2_000


# The line of a stack trace that names the error (``error: ...``, ``SQLiteError: ...``).
_ERROR_LINE_RE = re.compile(r"^(?:[A-Za-z]*Error|error)(?::|\s)")
# Longest one-line reason, chars.
ONE_LINE_CHARS = 300
# Signals of a crash (SIGILL, SIGABRT, SIGBUS, SIGFPE, SIGSEGV), not of a kill.
CRASH_SIGNALS = frozenset({4, 6, 7, 8, 11})


def one_line(reason: str) -> str:
    """One line of a failure, at most :data:`ONE_LINE_CHARS`: for a stack trace the first line's
    head and the line naming the error, else the first line."""
    lines = [ln.strip() for ln in reason.splitlines() if ln.strip()]
    if len(lines) > 1:
        head = lines[0].split(": ", 1)[0] if ": " in lines[0] else lines[0]
        picked = next((ln for ln in lines[1:] if _ERROR_LINE_RE.match(ln)), None)
        reason = f"{head}: {picked}" if picked else lines[0]
    return reason if len(reason) <= ONE_LINE_CHARS else reason[: ONE_LINE_CHARS - 3] + "..."


class QmdCommandError(BackendUnavailableError):
    """Raised when a qmd process could not start, or exited non-zero or by a signal.

    Message: ``<summary> failed (code N|signal X[; CRASH_HINT]): <stderr or stdout tail>``, or
    ``<summary> failed to start: <OS error>``; a crash of a command that loads no model
    (``loads_models`` false: BM25 search) says ``qmd crashed`` without the hint.

    Attributes:
        summary: ``qmd`` + arguments. returncode / signal: how it ended (``None`` when not).
        stdout_tail / stderr_tail: captured output (the runner's capped tails).
        os_error / errno: the spawn failure, else ``None``.
        crashed: ended by a crash signal (:data:`CRASH_SIGNALS`, or exit 128 + one).
    """

    def __init__(self, summary: str, *, returncode: int | None = None, signal: int | None = None,
                 stdout_tail: str = "", stderr_tail: str = "", os_error: str | None = None,
                 errno: int | None = None, loads_models: bool = True) -> None:
        self.summary = summary
        self.returncode = returncode
        self.signal = signal
        self.stdout_tail = stdout_tail
        self.stderr_tail = stderr_tail
        self.os_error = os_error
        self.errno = errno
        # a crash signal, or a shell's 128 + signal for one
        self.crashed = os_error is None and (signal in CRASH_SIGNALS or (
            returncode is not None and returncode - 128 in CRASH_SIGNALS))
        if os_error is not None:
            reason = f"{summary} failed to start: {os_error}"
        else:
            status = f"signal {signal}" if signal is not None else f"code {returncode}"
            if self.crashed:  # the hint is about reloading models: no use for a BM25 search
                status += f"; {CRASH_HINT}" if loads_models else "; qmd crashed"
            detail = (stderr_tail.strip() or stdout_tail.strip())[-_MESSAGE_TAIL_CHARS:]
            reason = f"{summary} failed ({status})" + (f": {detail}" if detail else "")
        super().__init__("qmd", reason)
        # The bare "<summary> failed ..." text, as the reference runner words it.
        self.args = (reason,)

    def __str__(self) -> str:
        return self.reason


class QmdBusyError(QmdCommandError):
    """Raised when qmd answered ``database is locked`` on every attempt; not a qmd failure (no
    circuit breaker).

    Attributes:
        attempts: how many times the command was run.
    """

    def __init__(self, summary: str, *, attempts: int, returncode: int | None = None,
                 stdout_tail: str = "", stderr_tail: str = "") -> None:
        super().__init__(summary, returncode=returncode, stdout_tail=stdout_tail,
                         stderr_tail=stderr_tail)
        self.attempts = attempts
        self.reason = (f"{summary}: qmd's index was busy (database is locked) on {attempts} "
                       "attempts; qmd's own update may be running")
        self.args = (self.reason,)


class QmdQueryTooLongError(QmdCommandError):
    """Raised when the system refuses to start qmd with a query that long (``E2BIG``); not a qmd
    failure (no circuit breaker).

    Attributes:
        query_bytes: the size of the query argument, bytes (UTF-8).
    """

    def __init__(self, summary: str, *, query_bytes: int, os_error: str, errno: int) -> None:
        super().__init__(summary, os_error=os_error, errno=errno)
        self.query_bytes = query_bytes
        self.reason = (f"query too long for qmd: {query_bytes} bytes in one argument "
                       f"({os.strerror(errno)})")
        self.args = (self.reason,)


class QmdOutputError(BackendUnavailableError):
    """Raised when qmd's stdout cannot be parsed as search results."""

    def __init__(self, reason: str) -> None:
        super().__init__("qmd", reason)


class QmdIndexLostError(BackendUnavailableError):
    """Raised by a search when qmd's index lost its documents or is corrupt (``index_health``); the
    builtin engine answers (no circuit breaker) while it is re-indexed."""

    def __init__(self, reason: str) -> None:
        super().__init__("qmd", reason)


class QmdMcpError(BackendUnavailableError):
    """Raised when the warm ``qmd mcp`` child cannot answer an MCP call (``qmd mcp <method>: ...``).

    Attributes:
        transport: the child or connection failed (it is restarted), rather than an answer the
            child gave on purpose (a JSON-RPC error, ``isError``, a wrong shape: it is kept).
    """

    def __init__(self, reason: str, *, transport: bool) -> None:
        super().__init__("qmd", reason)
        self.transport = transport

