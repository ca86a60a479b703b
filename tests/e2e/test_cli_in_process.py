"""``qmdbridge.cli.main.main`` called twice in one process: a command leaves no SIGTERM handler,
log handler or ``--json`` error mode behind for the next caller."""

from __future__ import annotations

import logging
import signal
from pathlib import Path

import orjson

from tests.e2e.cli_proc import run_cli_in_process


def test_a_command_leaves_the_callers_sigterm_handling_and_logging_as_they_were(
        ws: Path, env: dict[str, str]) -> None:
    before = signal.getsignal(signal.SIGTERM)
    handlers = list(logging.getLogger().handlers)
    level = logging.getLogger().level
    for argv in (["index", "-v"], ["search", "router", "-v"], ["status", "--json"]):
        p = run_cli_in_process([*argv, "--workspace", str(ws)], env)
        assert p.returncode == 0, p.stderr
        assert signal.getsignal(signal.SIGTERM) is before, argv
        assert (logging.getLogger().handlers, logging.getLogger().level) == (handlers, level), argv


def test_usage_errors_follow_each_command_lines_json_flag(env: dict[str, str]) -> None:
    as_json = run_cli_in_process(["get", "MEMORY.md", "--from", "abc", "--json"], env)
    assert (as_json.returncode, as_json.stderr) == (2, b"")
    assert orjson.loads(as_json.stdout) == {
        "error": "qmdbridge get: argument --from: invalid int value: 'abc'", "errorType": "UsageError",
        "exitCode": 2}
    plain = run_cli_in_process(["get", "MEMORY.md", "--from", "abc"], env)
    assert (plain.returncode, plain.stdout) == (2, b"")
    assert plain.stderr.endswith(b"qmdbridge get: error: argument --from: invalid int value: 'abc'\n")
