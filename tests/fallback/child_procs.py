"""Helpers for tests that drive real child processes over pipes (not collected as tests)."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

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


def unprivileged_prefix() -> list[str]:
    """argv prefix that runs a command without root's permission override (CAP_DAC_OVERRIDE and
    friends dropped from the bounding set, same uid), so file modes apply; none for a user.
    Skips the test when running as root without ``setpriv``."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as root without setpriv: file modes cannot be made to apply")
    return [setpriv, "--bounding-set=-dac_override,-dac_read_search,-fowner", "--inh-caps=-all", "--"]
