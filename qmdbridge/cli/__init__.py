"""The ``qmdbridge`` command: search, get, status, index, qmd operations, warmup, serve, doctor, eval.

A thin layer: parse arguments, load config, call the manager, print. With ``--json`` exactly
one JSON document goes to stdout (errors too, as ``{"error": ..., "exitCode": ...}``); logs and
progress go to stderr.

Exit codes:
    0  success
    1  a backend or the index failed (message on stderr)
    2  usage or config error (bad flag, blank query, malformed config file)
    3  refused path (``get`` of something that is not a memory file)
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``qmdbridge`` console script (see :func:`qmdbridge.cli.main.main`)."""
    from qmdbridge.cli.main import main as _main

    return _main(argv)
