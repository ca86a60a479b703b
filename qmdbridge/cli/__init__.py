"""The ``qmdbridge`` command line; the parser, the commands and the exit codes are described in
:mod:`qmdbridge.cli.main`."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``qmdbridge`` console script (see :func:`qmdbridge.cli.main.main`)."""
    from qmdbridge.cli.main import main as _main

    return _main(argv)
