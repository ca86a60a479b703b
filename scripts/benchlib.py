"""Shared helpers of the benchmark scripts: child runs with peak RSS, percentiles, result tables.

A benchmark measures in child processes (``run_child``), so each measurement has its own peak
RSS (``os.wait4`` rusage of exactly that child, in MB) and the parent's imports never count.
Results are :class:`Row` values; ``emit`` prints them as rich tables (measured value, target,
pass/fail) or, with ``--json``, as one JSON document on stdout.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

__all__ = ["ChildRun", "Row", "check", "cli_argv", "emit", "median", "percentile", "run_child"]


@dataclass(frozen=True)
class ChildRun:
    """One finished child process.

    Attributes:
        returncode: exit status (negative = killed by that signal).
        stdout / stderr: decoded output (UTF-8, replacement on errors).
        wall_ms: wall time from spawn to exit, in ms.
        peak_rss_mb: the child's peak resident set size in MB (``ru_maxrss``, KiB on Linux).
        cpu_ms: user + system CPU time of the child and of the descendants it waited for, ms.
    """

    returncode: int
    stdout: str
    stderr: str
    wall_ms: float
    peak_rss_mb: float
    cpu_ms: float = 0.0

    def json(self) -> object:
        """Parse stdout as JSON.

        Raises:
            RuntimeError: the child failed or stdout is not JSON (stderr tail in the message).
        """
        if self.returncode != 0:
            raise RuntimeError(f"child exited {self.returncode}: {self.stderr[-2000:]}")
        try:
            return json.loads(self.stdout)
        except ValueError as exc:
            raise RuntimeError(f"child printed no JSON ({exc}): {self.stdout[-500:]!r} "
                               f"stderr: {self.stderr[-1500:]}") from exc


def run_child(argv: Sequence[str], *, env: Mapping[str, str] | None = None,
              cwd: str | Path | None = None, timeout_s: float = 1800.0) -> ChildRun:
    """Run ``argv`` (no shell) to completion and measure its wall time and peak RSS.

    Output goes through temporary files so the child is reaped with ``os.wait4`` (whose rusage
    belongs to this child only). The child is killed after ``timeout_s`` seconds.

    Raises:
        subprocess.TimeoutExpired: the child ran longer than ``timeout_s``.
    """
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        proc = subprocess.Popen(list(argv), stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                env=dict(env) if env is not None else None, cwd=cwd)
        # A blocking wait (no polling loop beside the child competing for the cores it is
        # timed on); a timer kills it at the deadline.
        killer = threading.Timer(timeout_s, proc.kill)
        killer.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            killer.cancel()
        if os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL and (
                time.perf_counter() - start >= timeout_s):
            proc.returncode = -9
            raise subprocess.TimeoutExpired(list(argv), timeout_s)
        wall_ms = (time.perf_counter() - start) * 1000
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return ChildRun(returncode=proc.returncode,
                        stdout=out.read().decode("utf-8", "replace"),
                        stderr=err.read().decode("utf-8", "replace"),
                        wall_ms=wall_ms, peak_rss_mb=usage.ru_maxrss / 1024,
                        cpu_ms=(usage.ru_utime + usage.ru_stime) * 1000)


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in [0, 100]) of ``values``; NaN when empty."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def median(values: Sequence[float]) -> float:
    """The 50th nearest-rank percentile (a measured value, never an average of two)."""
    return percentile(values, 50)


def cli_argv() -> list[str]:
    """How to start the ``qmdbridge`` console script of this interpreter.

    The script next to ``sys.executable`` when it exists (what a user runs, without a pyenv
    shim in front), else ``python -c`` calling ``qmdbridge.cli.main``.
    """
    script = Path(sys.executable).parent / "qmdbridge"
    if script.is_file() and os.access(script, os.X_OK):
        return [str(script)]
    return [sys.executable, "-c", "import sys; from qmdbridge.cli.main import main; sys.exit(main())"]


@dataclass(frozen=True)
class Row:
    """One measured quantity.

    Attributes:
        section: table it belongs to.
        name: what was measured (with its configuration).
        value: the measurement (NaN when not measured); ``None`` for a skipped row.
        unit: ``ms``, ``s``, ``MB``, ``chunks/s``, ``x`` (ratio) ...
        target: the target as text (``<= 12 s``), or empty.
        ok: pass (True), fail (False) or no target (None).
        note: free text (skip reason, sample size).
    """

    section: str
    name: str
    value: float | None
    unit: str
    target: str = ""
    ok: bool | None = None
    note: str = ""


def check(value: float, limit: float | None) -> bool | None:
    """``value <= limit`` (None when there is no limit or no value)."""
    if limit is None or value is None or math.isnan(value):
        return None
    return value <= limit


def _fmt(value: float | None) -> str:
    if value is None or math.isnan(value):
        return "-"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}" if abs(value) >= 0.1 else f"{value:.3f}"


def emit(title: str, rows: Sequence[Row], *, as_json: bool, meta: Mapping[str, object]) -> None:
    """Print ``rows`` grouped by section as rich tables, or one JSON document with ``--json``.

    The JSON document is ``{"title", "meta", "rows": [Row...], "failed": int}``.
    """
    if as_json:
        doc = {"title": title, "meta": dict(meta), "rows": [
            {k: (None if isinstance(v, float) and math.isnan(v) else v)
             for k, v in asdict(r).items()} for r in rows],
            "failed": sum(1 for r in rows if r.ok is False)}
        sys.stdout.write(json.dumps(doc, ensure_ascii=False, indent=2) + "\n")
        return
    from rich.console import Console
    from rich.table import Table

    console = Console(width=140)
    console.print(f"[bold]{title}[/bold]  " + ", ".join(f"{k}={v}" for k, v in meta.items()))
    for section in dict.fromkeys(r.section for r in rows):
        table = Table(title=section, title_justify="left")
        for col, justify in (("measure", "left"), ("value", "right"), ("unit", "left"),
                             ("target", "left"), ("result", "left"), ("note", "left")):
            table.add_column(col, justify=justify)  # type: ignore[arg-type]
        for r in rows:
            if r.section != section:
                continue
            result = {True: "[green]pass[/green]", False: "[red]FAIL[/red]",
                      None: "skipped" if r.value is None else ""}[r.ok]
            table.add_row(r.name, _fmt(r.value), r.unit, r.target, result, r.note)
        console.print(table)
