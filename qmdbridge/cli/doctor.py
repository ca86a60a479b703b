"""``qmdbridge doctor [--fix] [--json]``: print the doctor report; exit 1 when a check failed.

Every problem ``qmdbridge status`` lists is a failed check too, so the two never disagree.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from qmdbridge.cli.common import EXIT_FAILURE, EXIT_OK, emit_json
from qmdbridge.doctor import Check, run_doctor
from qmdbridge.manager import MemoryManager
from qmdbridge.problems import QMD_UNHEALTHY, status_problems

__all__ = ["doctor", "problem_checks"]

# Problems the doctor's own checks already report, with a live probe.
_OWN_CHECKS = ("embedding provider",)


def problem_checks(problems: list[dict[str, Any]], told: list[Check]) -> list[Any]:
    """The status problems as doctor ``error`` checks, without those the doctor checks itself
    (the provider, a failing qmd test search) or ``told`` already (the root file, in status's words)."""
    return [Check(p["check"], "error", p["message"], p["hint"]) for p in problems
            if p["check"] not in _OWN_CHECKS and p["message"] not in {c.detail for c in told}
            and not p["message"].startswith(QMD_UNHEALTHY)]  # doctor's qmd check ran that search


async def doctor(agent: Any, args: argparse.Namespace) -> int:
    """Run the checks and print them with fix hints; without a workspace, or with an index
    the ``index`` check found unusable (corrupt, a postgres server down ...: opening it would
    repair it, which only ``--fix`` does), no status (and no store) is opened."""
    report = await run_doctor(agent, fix=args.fix)
    unusable = any(c.name == "index" and c.level == "error" for c in report.checks)
    if agent.workspace_dir.is_dir() and not unusable:
        async with MemoryManager(agent, backend=args.backend) as m:
            report.checks.extend(problem_checks(status_problems((await m.status()).to_json_dict()), report.checks))
    if args.json:
        emit_json(report.to_json())
    else:
        for c in report.checks:
            sys.stdout.write(f"[{c.level}] {c.name}: {c.detail}{' (fixed)' if c.fixed else ''}\n")
            if c.hint and c.level != "ok":
                sys.stdout.write(f"        fix: {c.hint}\n")
    return EXIT_OK if report.ok else EXIT_FAILURE
