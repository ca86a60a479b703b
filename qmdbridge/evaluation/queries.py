"""The JSONL query set of ``qmdbridge eval --queries``: one question per line, each with one
evidence item (a workspace file, optionally a line and a text), checked line by line."""

from __future__ import annotations

import json
from pathlib import Path, PurePosixPath
from typing import Any

from fallback.errors import UsageError
from fallback.text.chunking import file_lines
from qmdbridge.evaluation.metrics import EvalQuestion, Evidence

__all__ = ["QUERY_KEYS", "load_queries"]

# The keys a line of a queries file may have.
QUERY_KEYS = ("query", "path", "line", "text", "category", "id")


def _line_count(path: Path) -> int:
    """How many lines ``path`` has, counted as the index counts them (``\\n``, ``\\r\\n`` or
    ``\\r`` ends a line; a final line break starts no extra line)."""
    try:
        text = path.read_bytes().decode("utf-8", errors="replace")
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from None
    return len(file_lines(text))


def _query_line(obj: Any, *, where: str, workspace: Path) -> EvalQuestion:
    if not isinstance(obj, dict):
        raise UsageError(f"{where}: each line must be a JSON object")
    unknown = sorted(set(obj) - set(QUERY_KEYS))
    if unknown:
        raise UsageError(f"{where}: unknown key {unknown[0]!r} (allowed: {', '.join(QUERY_KEYS)})")
    query, rel, line, text = obj.get("query"), obj.get("path"), obj.get("line"), obj.get("text")
    if not isinstance(query, str) or not query.strip():
        raise UsageError(f"{where}: 'query' must be a non-empty string")
    if not isinstance(rel, str) or not rel.strip():
        raise UsageError(f"{where}: 'path' must be a workspace-relative path")
    posix = PurePosixPath(rel.strip().replace("\\", "/"))
    if posix.is_absolute():
        raise UsageError(f"{where}: 'path' must be relative to the workspace, not {rel!r}")
    rel = posix.as_posix()
    if not (workspace / rel).is_file():
        raise UsageError(f"{where}: 'path' {rel!r} is not a file in the workspace {workspace}")
    if line is not None and (isinstance(line, bool) or not isinstance(line, int) or line < 1):
        raise UsageError(f"{where}: 'line' must be a 1-based line number")
    if line is not None and line > (count := _line_count(workspace / rel)):
        # an evidence line no hit can ever cover would only count as a miss
        raise UsageError(f"{where}: 'line' {line} is past the end of {rel} ({count} lines)")
    if text is not None and (not isinstance(text, str) or not text.strip()):
        raise UsageError(f"{where}: 'text' must be a non-empty string")
    category, ref = obj.get("category"), obj.get("id")
    if category is not None and (isinstance(category, bool) or not isinstance(category, (str, int))):
        raise UsageError(f"{where}: 'category' must be a string or a number")
    return EvalQuestion(query=query, evidence=(Evidence(path=rel, line=line, text=text),),
                        category=None if category is None else str(category),
                        ref=str(ref) if ref is not None else where)


def load_queries(path: str | Path, workspace: str | Path) -> list[EvalQuestion]:
    """Read a JSONL queries file: one question per line, each with one evidence item.

    A line is ``{"query": str, "path": str, "line"?: int >= 1, "text"?: str, "category"?: str |
    int, "id"?: any}``; ``path`` is workspace-relative and must name a file of ``workspace``, and
    ``line`` a line of that file. Lines end at ``\n`` (or ``\r\n``) only; blank lines are skipped.

    Raises:
        UsageError: the file cannot be read, a line is not JSON or breaks the rules above (the
            message names ``file:line``), or there is no question.
    """
    p, ws = Path(path).expanduser(), Path(workspace).expanduser().resolve()
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot read queries file {p}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise UsageError(f"{p}: not valid UTF-8 at byte {exc.start}") from None
    questions = []
    # JSON Lines end at "\n" (a "\r" before it is JSON whitespace); str.splitlines() would also
    # cut at U+2028, U+2029 or U+0085, which JSON allows unescaped inside a string.
    for n, raw in enumerate(text.split("\n"), start=1):
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
        except ValueError as exc:
            raise UsageError(f"{p}:{n}: not valid JSON (--queries reads JSON Lines: one "
                             f'{{"query", "path", ...}} object per line): {exc}') from None
        questions.append(_query_line(obj, where=f"{p}:{n}", workspace=ws))
    if not questions:
        raise UsageError(f"no queries in {p}")
    return questions
