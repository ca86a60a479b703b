"""What every CLI command shares: exit codes and the JSON writer for stdout."""

from __future__ import annotations

import sys

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (a served `qmdbridge search` skips it)
if TYPE_CHECKING:
    from typing import Any

__all__ = ["EXIT_OK", "EXIT_FAILURE", "EXIT_USAGE", "EXIT_REFUSED", "EXIT_NOT_FOUND", "emit_json",
           "emit_plain_json", "print_config_warnings", "print_error", "verbose_note"]

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_REFUSED = 3
EXIT_NOT_FOUND = 4


def emit_json(doc: Any) -> None:
    """Write one JSON document (orjson, indented) to stdout."""
    import orjson

    sys.stdout.buffer.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2) + b"\n")
    sys.stdout.flush()


def _floats_print_alike(doc: Any) -> bool:
    """Whether ``json`` writes every float of ``doc`` as orjson does (0, or ``1e-4 <= |x| < 1e16``)."""
    stack = [doc]
    while stack:
        x = stack.pop()
        if isinstance(x, float):
            if not (x == 0.0 or 1e-4 <= abs(x) < 1e16):  # False for NaN too
                return False
        elif isinstance(x, dict):
            stack.extend(x.values())
        elif isinstance(x, (list, tuple)):
            stack.extend(x)
    return True


def emit_plain_json(doc: dict[str, Any]) -> None:
    """Write a document of plain JSON values exactly as :func:`emit_json` would, without
    loading orjson when the standard library writes the same bytes (the fast paths use it)."""
    if not _floats_print_alike(doc):
        emit_json(doc)
        return
    import json

    sys.stdout.buffer.write(json.dumps(doc, indent=2, ensure_ascii=False).encode() + b"\n")
    sys.stdout.flush()


def print_error(json_out: bool, message: str, error_type: str, code: int) -> int:
    """Tell a failed command as every route tells it: ``{error, errorType, exitCode}`` on stdout
    with ``--json`` (``json_out``), else ``qmdbridge: <message>`` on stderr; returns ``code``."""
    if json_out:
        emit_plain_json({"error": message, "errorType": error_type, "exitCode": code})
    else:
        sys.stderr.write(f"qmdbridge: {message}\n")
    return code


def verbose_note(args: Any, message: str) -> None:
    """With ``-v``, write ``message`` to stderr as a ``-v`` log line of the CLI would read."""
    if getattr(args, "verbose", False):
        sys.stderr.write(f"INFO qmdbridge.cli: {message}\n")


def print_config_warnings(lines: Any) -> None:
    """Write each config warning line (``ResolvedAgent.config_warning_lines``) to stderr as
    ``qmdbridge: config <file>: <warning>``: every route of every command tells them so, once."""
    for line in lines:
        sys.stderr.write(f"qmdbridge: {line}\n")
