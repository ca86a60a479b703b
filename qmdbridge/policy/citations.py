"""Citations: a hit's ``path#La-Lb`` and the ``Source:`` footer (spec 9, 2.13), the one decoration of
every route's hits (the manager's and the one-shot CLI search's, which loads no config model).
"""

from __future__ import annotations

import re

__all__ = ["cite", "citation_lines", "citations_enabled", "format_citation", "session_key_rest"]

# A citation (``path#La-Lb``), or a hit's range as plain CLI output prints it (``path:a-b``).
_CITATION = re.compile(r"(?P<path>.+\.md)(?:#L(?P<start>[1-9][0-9]*)(?:-L(?P<end>[1-9][0-9]*))?"
                       r"|:(?P<start_plain>[1-9][0-9]*)(?:-(?P<end_plain>[1-9][0-9]*))?)")


def format_citation(path: str, start_line: int, end_line: int) -> str:
    """``path#La`` when one line, else ``path#La-Lb`` (spec 9); lines are 1-based inclusive."""
    if start_line == end_line:
        return f"{path}#L{start_line}"
    return f"{path}#L{start_line}-L{end_line}"


def citation_lines(text: str) -> tuple[str, int, int] | None:
    """``(path, start_line, end_line)`` of a :func:`format_citation` string of a Markdown file
    (``memory/x.md#L3-L9``) or of a hit's range in ``qmdbridge search``'s plain output
    (``memory/x.md:3-9``), else ``None``."""
    m = _CITATION.fullmatch(text.strip())
    if m is None:
        return None
    start = int(m["start"] or m["start_plain"])
    return m["path"], start, max(start, int(m["end"] or m["end_plain"] or start))


def cite(path: str, snippet_start_line: int, snippet_end_line: int, snippet: str, *,
         include: bool) -> tuple[str, str]:
    """A hit's citation (:func:`format_citation` of its snippet's lines) and the snippet an
    agent reads: with ``include``, stripped and followed by a blank line and ``Source:
    <citation>``; otherwise unchanged. The one decoration of every route's hits."""
    citation = format_citation(path, snippet_start_line, snippet_end_line)
    return citation, f"{snippet.strip()}\n\nSource: {citation}" if include else snippet


def session_key_rest(key: str) -> str:
    """The part after ``agent:<id>:`` (empty segments dropped, as the reference parses agent
    keys: at least three non-empty parts, the first ``agent``), else the key itself."""
    parts = [p for p in key.split(":") if p]
    if len(parts) >= 3 and parts[0].lower() == "agent":
        return ":".join(parts[2:])
    return key


def citations_enabled(mode: str, session_key: str | None) -> bool:
    """Whether hits carry the ``Source:`` footer (spec 2.13): ``on`` -> True, ``off`` ->
    False; ``auto`` (and any invalid mode) -> True for owner calls (no key) and direct chats,
    False when the ``:``-tokens of the key's rest (after ``agent:<id>:``; the whole key when
    it has no such prefix, unlike the reference) hold ``group`` or ``channel``. ``mode`` is
    ``memory.citations``, ``session_key`` the raw key."""
    if mode == "on":
        return True
    if mode == "off":
        return False
    if session_key is None or not session_key.strip():
        return True
    tokens = [t.lower() for t in session_key_rest(session_key.strip()).split(":")]
    return "channel" not in tokens and "group" not in tokens
