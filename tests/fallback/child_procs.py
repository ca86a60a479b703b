"""Helpers for tests that drive real child processes over pipes (not collected as tests)."""

from __future__ import annotations

import subprocess

# Longest wait for a child to finish, in seconds (a bound, never a timing assertion).
DEADLINE_S = 120


def finish(proc: subprocess.Popen[str]) -> None:
    """Close the child's stdin, wait for it (kill past the deadline) and close its pipes."""
    if proc.poll() is None:
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            proc.wait(timeout=DEADLINE_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()
