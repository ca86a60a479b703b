"""Running the real ``qmdbridge`` command in a child process, for the end-to-end tests."""

from __future__ import annotations

import shutil
import subprocess
import sys


def cli_argv(args: list[str]) -> list[str]:
    """The argv of ``qmdbridge <args>``: the installed console script, else this Python running
    the CLI's ``main``."""
    exe = shutil.which("qmdbridge")
    return [exe, *args] if exe else [
        sys.executable, "-c", "import sys; from qmdbridge.cli.main import main; sys.exit(main())", *args]


def run_cli(args: list[str], env: dict[str, str], stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    """Run ``qmdbridge <args>`` to its end (at most 120 s), output captured as bytes."""
    return subprocess.run(cli_argv(args), env=env, capture_output=True, timeout=120, input=stdin)
