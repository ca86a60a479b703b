"""``qmdbridge doctor [--fix] [--json]``: print the doctor report; exit 1 when a check failed."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from qmdbridge.cli.common import EXIT_FAILURE, EXIT_OK, emit_json

__all__ = ["doctor"]


async def doctor(agent: Any, args: argparse.Namespace) -> int:
    """Run the checks and print them (``[ok]``/``[warn]``/``[error]`` lines with fix hints)."""
    from qmdbridge.doctor import run_doctor

    report = await run_doctor(agent, fix=args.fix)
    if args.json:
        emit_json(report.to_json())
    else:
        for c in report.checks:
            sys.stdout.write(f"[{c.level}] {c.name}: {c.detail}{' (fixed)' if c.fixed else ''}\n")
            if c.hint and c.level != "ok":
                sys.stdout.write(f"        fix: {c.hint}\n")
    return EXIT_OK if report.ok else EXIT_FAILURE
