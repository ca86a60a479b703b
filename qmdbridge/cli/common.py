"""What every CLI command shares: exit codes and the one JSON writer for stdout."""

from __future__ import annotations

import sys

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (a served `qmdbridge search` skips it)
if TYPE_CHECKING:
    from typing import Any

__all__ = ["EXIT_OK", "EXIT_FAILURE", "EXIT_USAGE", "EXIT_REFUSED", "EXIT_NOT_FOUND", "emit_json"]

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
