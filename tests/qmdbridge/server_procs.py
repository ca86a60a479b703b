"""Helpers for tests that run ``qmdbridge serve`` / ``qmdbridge mcp`` as real processes (not collected)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psutil

# Longest wait for a child to start or stop, in seconds (a bound, never a timing assertion).
DEADLINE_S = 120

CLI = [sys.executable, "-m", "qmdbridge.cli.main"]

MEMORY_MD = "# MEMORY\n\n## Preferences\n- Coffee: flat white, no sugar.\n- Standup moved to 09:30.\n"
DAILY_MD = ("# 2026-01-05\n\n- Rotated the Grafana API key for the billing dashboard.\n"
            "- Lunch with Priya about the Kestrel migration.\n")


def make_workspace(root: Path) -> Path:
    """A small workspace: ``MEMORY.md`` (5 lines) and ``memory/2026-01-05.md`` (4 lines)."""
    ws = root / "ws"
    (ws / "memory").mkdir(parents=True)
    (ws / "MEMORY.md").write_text(MEMORY_MD)
    (ws / "memory" / "2026-01-05.md").write_text(DAILY_MD)
    return ws


def cli_env(state: Path, home: Path) -> dict[str, str]:
    """This process's environment with its own state dir and HOME, no CI or provider keys."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("CI", "OPENAI_API_KEY", "GEMINI_API_KEY", "GOOGLE_API_KEY", "VOYAGE_API_KEY",
                        "MISTRAL_API_KEY", "QMDBRIDGE_DAEMON", "QMDBRIDGE_MCP_TOKEN")}
    env["OPENCLAW_STATE_DIR"] = str(state)
    env["HOME"] = str(home)
    return env


def start(args: list[str], env: dict[str, str], *, ready: str,
          stdin: int | None = subprocess.DEVNULL) -> tuple[subprocess.Popen[bytes], list[str]]:
    """Start ``qmdbridge ARGS`` and read its stderr until a line containing ``ready``.

    Returns:
        The process and the stderr lines read so far.

    Raises:
        AssertionError: the process ended before printing ``ready``.
    """
    proc = subprocess.Popen([*CLI, *args], env=env, stdin=stdin, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    assert proc.stderr is not None
    seen: list[str] = []
    while True:
        line = proc.stderr.readline().decode()
        if not line:
            proc.wait(timeout=DEADLINE_S)
            raise AssertionError(f"exited {proc.returncode} before {ready!r}: {''.join(seen)}")
        seen.append(line)
        if ready in line:
            return proc, seen


def stop(proc: subprocess.Popen[bytes], sig: int | None = None) -> int:
    """Send ``sig`` (if given), wait for the exit (kill past the deadline), close the pipes."""
    if sig is not None and proc.poll() is None:
        proc.send_signal(sig)
    try:
        code = proc.wait(timeout=DEADLINE_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise
    finally:
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
    return code


def live_children() -> list[psutil.Process]:
    """This test process's child processes that are still running (zombies excluded)."""
    alive = []
    for child in psutil.Process().children(recursive=True):
        try:
            if child.status() != psutil.STATUS_ZOMBIE:
                alive.append(child)
        except psutil.NoSuchProcess:
            continue
    return alive


def process_gone(pid: int) -> bool:
    """True when ``pid`` no longer runs (it may linger as a zombie of some other parent)."""
    try:
        proc = psutil.Process(pid)
        return proc.status() == psutil.STATUS_ZOMBIE and proc.ppid() != os.getpid()
    except psutil.NoSuchProcess:
        return True
