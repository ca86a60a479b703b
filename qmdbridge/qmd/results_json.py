"""qmd's search stdout -> :class:`QmdEntry` list: the result array among log noise, or no hits (spec 2.8.5).

Every balanced JSON value on a line starting with ``[`` is read; only arrays of result objects
(:func:`is_result_object`) count, the last non-empty one winning, a fitting ``[]`` meaning no
hits. Otherwise stdout is "no hits" only when every non-empty line is a no-results marker;
anything else is :class:`~qmdbridge.qmd.errors.QmdOutputError`.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from qmdbridge.qmd.errors import QmdOutputError

__all__ = ["EXCERPT_CHARS", "QmdEntry", "entry_from_json", "is_result_object", "parse_qmd_json"]

log = logging.getLogger("qmdbridge.qmd.backend")

# Characters of stdout (or stderr) quoted in an error message; the rest goes to the debug log.
EXCERPT_CHARS = 120
# ANSI colour and cursor escape sequences (removed before parsing).
_ANSI_RE = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07]*\x07")
_NO_RESULTS_RE = re.compile(
    r"^(?:\[[^\]]*\]\s*)?(?:(?:warn|warning|info|error|qmd):\s*)*"
    r"no results found(?: above minimum score threshold| for .*)?\.?$")
# A line that may open a result array (``[`` then ``{`` or ``]``): no log line like ``[1/3]``.
_ARRAY_START_RE = re.compile(r"(?m)^[ \t]*(\[)\s*[{\]]")
# Largest integer JSON numbers keep exactly (JavaScript's Number.MAX_SAFE_INTEGER).
_MAX_SAFE_INT = 2**53 - 1
_DECODER = json.JSONDecoder()


@dataclass(frozen=True)
class QmdEntry:
    """One normalised element of qmd's JSON array (every field optional).

    Attributes:
        docid: ``#abc123`` style id. collection: the collection name, when sent.
        file: ``qmd://<collection>/<rel>`` (or a ``path`` field's value).
        snippet / body: text (``snippet`` starts with an ``@@ -a,b @@`` header in qmd 2.8.3).
        score: a finite number, or ``None``.
        start_line / end_line: explicit 1-based lines (some builds only).
    """

    docid: str | None = None
    collection: str | None = None
    file: str | None = None
    snippet: str | None = None
    body: str | None = None
    score: float | None = None
    start_line: int | None = None
    end_line: int | None = None


def _only_markers(text: str) -> bool:
    lines = [line for line in text.splitlines() if line.strip()]
    return bool(lines) and all(_NO_RESULTS_RE.match(" ".join(line.split()).lower()) for line in lines)


def _excerpt(text: str) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= EXCERPT_CHARS else flat[:EXCERPT_CHARS - 3] + "..."


def _str(v: Any) -> str | None:
    return v if isinstance(v, str) else None


def _pos_int(v: Any) -> int | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    return v if isinstance(v, int) and 0 < v <= _MAX_SAFE_INT else None


def entry_from_json(obj: Mapping[str, Any]) -> QmdEntry:
    """One result object as a :class:`QmdEntry`: strings only as strings, a finite score, positive
    integer lines (``start_line`` or ``startLine``); other fields ignored."""
    score = obj.get("score")
    ok_score = isinstance(score, (int, float)) and not isinstance(score, bool) and \
        score == score and abs(score) != float("inf")
    return QmdEntry(
        docid=_str(obj.get("docid")), collection=_str(obj.get("collection")),
        file=_str(obj.get("file")) or _str(obj.get("path")), snippet=_str(obj.get("snippet")),
        body=_str(obj.get("body")),
        score=float(score) if ok_score and score is not None else None,
        start_line=_pos_int(obj.get("start_line", obj.get("startLine"))),
        end_line=_pos_int(obj.get("end_line", obj.get("endLine"))))


def is_result_object(value: Any) -> bool:
    """Whether ``value`` is an object whose ``file`` (or ``path``) is a non-empty string."""
    return isinstance(value, dict) and bool(_str(value.get("file")) or _str(value.get("path")))


def _json_values(text: str) -> Iterator[Any]:
    pos = 0
    while (m := _ARRAY_START_RE.search(text, pos)) is not None:
        start = m.start(1)
        try:
            value, end = _DECODER.raw_decode(text, start)
        except json.JSONDecodeError:
            pos = start + 1
            continue
        yield value
        pos = end


def parse_qmd_json(stdout: str, stderr: str = "", *, command: str) -> list[QmdEntry]:
    """Parse a qmd search's stdout (ANSI codes allowed) into entries in qmd's order; ``[]`` for an
    empty array or marker-only output (``stderr`` read only when stdout is blank).

    Raises:
        QmdOutputError: ``qmd <command> returned invalid JSON: ...`` with an excerpt.
    """
    out = _ANSI_RE.sub("", stdout)
    if not out.strip():
        err = _ANSI_RE.sub("", stderr)
        if _only_markers(err):
            return []
        raise QmdOutputError(f"qmd {command} returned invalid JSON: stdout empty (stderr: {_excerpt(err)})")
    fitting = [v for v in _json_values(out) if isinstance(v, list) and all(map(is_result_object, v))]
    if fitting:
        hits = [v for v in fitting if v]
        return [entry_from_json(obj) for obj in (hits[-1] if hits else [])]
    if _only_markers(out):
        return []
    log.debug("qmd stdout is not a result array (%d chars): %r", len(out), out)
    raise QmdOutputError(f"qmd {command} returned invalid JSON: qmd {command} JSON response was"
                         f" not an array (stdout: {_excerpt(out)})")
