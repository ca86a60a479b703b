"""Paging a memory file's text for ``memory_get``: the lines asked for, under a budget of code
points, with the continuation notice the reference appends (``fallback/sources/read_page.py``
reads the files; its names re-export these)."""

from __future__ import annotations

import re

__all__ = ["DEFAULT_READ_LINES", "DEFAULT_READ_MAX_CHARS", "page_text"]

# Reference defaults for one memory_get page: 120 lines, 12,000 chars (code points here).
DEFAULT_READ_LINES = 120
DEFAULT_READ_MAX_CHARS = 12_000
# A line ends at "\n" (removed) or after a lone "\r" (kept, as the "\r" of "\r\n" is kept), so
# memory_get line numbers agree with fallback.text.chunking for every line-ending style.
_PAGE_LINE_BREAK = re.compile(r"\n|(?<=\r)(?!\n)")


def _continuation_notice(next_from: int | None, *, suggest_read_fallback: bool) -> str:
    if next_from is not None:
        return f"\n\n[More content available. Use from={next_from} to continue.]"
    hint = " If you need the full raw line, use read on the source file." if suggest_read_fallback else ""
    return f"\n\n[More content available. Requested excerpt exceeded the default maxChars budget.{hint}]"


def page_text(text: str, *, from_line: int | None, lines: int | None,
              default_lines: int = DEFAULT_READ_LINES, max_chars: int = DEFAULT_READ_MAX_CHARS,
              suggest_read_fallback: bool = True) -> tuple[str, int, int, bool, int | None]:
    """Select one page of lines from a file's text (E2 ``memory_get`` paging).

    Lines end at ``\\n``; a trailing ``\\n`` does not start an extra empty line and an empty
    text has zero lines. ``\\r`` characters are kept (``"one\\r\\ntwo\\r\\n"`` pages as
    ``"one\\r\\ntwo\\r"``); a lone ``\\r`` also ends a line, so line numbers agree with chunk
    line ranges.

    Args:
        text: the whole file.
        from_line: first line wanted, 1-based (``None``/``0`` -> 1; values below 1 -> 1).
        lines: number of lines wanted (``None``/``0`` -> ``default_lines``; minimum 1).
        default_lines: page length when ``lines`` is not given (minimum 1).
        max_chars: budget for the selected text in code points (minimum 1). Trailing lines
            are dropped until the text fits; a single line still too long is cut at
            ``max_chars`` code points.
        suggest_read_fallback: when a single line had to be cut, add the hint to read the
            source file directly (true for workspace files).

    Returns:
        ``(page text, start line, included line count, truncated, next_from)``. When
        truncated (lines remain after the page, lines were dropped, or a line was cut) the
        text ends with ``\\n\\n[More content available. Use from=<next_from> to continue.]``,
        or, after a cut line (``next_from`` is then ``None``), with the "Requested excerpt
        exceeded the default maxChars budget." notice.

    Source: OpenClaw ``buildMemoryReadResult`` / ``fitLinesToCharBudget`` (E2,
    ``packages/memory-host-sdk/src/host/read-file-shared.ts``), in code points.
    """
    default_lines = max(1, int(default_lines))
    max_chars = max(1, int(max_chars))
    all_lines = _PAGE_LINE_BREAK.split(text) if text else []
    if all_lines and all_lines[-1] == "":
        all_lines.pop()
    start = max(1, int(from_line or 1))
    count = max(1, int(lines or default_lines))
    selected = all_lines[start - 1:start - 1 + count]
    more_remain = start - 1 + len(selected) < len(all_lines)

    included = len(selected)
    page = "\n".join(selected)
    while included > 1 and len(page) > max_chars:
        included -= 1
        page = "\n".join(selected[:included])
    hard_truncated = len(page) > max_chars
    if hard_truncated:
        page = page[:max_chars]
    dropped = included < len(selected)
    truncated = hard_truncated or dropped or more_remain
    next_from = start + included if truncated and not hard_truncated else None
    if truncated:
        page += _continuation_notice(next_from, suggest_read_fallback=suggest_read_fallback)
    return page, start, included, truncated, next_from
