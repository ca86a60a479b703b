"""Paging a memory file's text for ``memory_get``: the lines asked for, under a budget of code
points, with the continuation notice the reference appends (``fallback/sources/read_page.py``
reads the files; its names re-export these)."""

from __future__ import annotations

from fallback.text.chunking import file_lines

__all__ = ["DEFAULT_READ_LINES", "DEFAULT_READ_MAX_CHARS", "page_text"]

# Reference defaults for one memory_get page: 120 lines, 12,000 chars (code points here).
DEFAULT_READ_LINES = 120
DEFAULT_READ_MAX_CHARS = 12_000


def _continuation_notice(next_from: int | None, *, suggest_read_fallback: bool) -> str:
    if next_from is not None:
        return f"\n\n[More content available. Use from={next_from} to continue.]"
    hint = " If you need the full raw line, use read on the source file." if suggest_read_fallback else ""
    return f"\n\n[More content available. Requested excerpt exceeded the default maxChars budget.{hint}]"


def page_text(text: str, *, from_line: int | None, lines: int | None,
              default_lines: int = DEFAULT_READ_LINES, max_chars: int = DEFAULT_READ_MAX_CHARS,
              suggest_read_fallback: bool = True,
              line_offset: int = 0) -> tuple[str, int, int, bool, int | None]:
    """Select one page of lines from a file's text (E2 ``memory_get`` paging).

    Lines are those of :func:`fallback.text.chunking.file_lines` (``\\n``, ``\\r\\n`` or a lone
    ``\\r``), so line numbers agree with chunk line ranges; a trailing line break does not
    start an extra empty line and an empty text has zero lines. The page is the file's text
    as it is, from the first line's start to the last line's end, less that line's final
    ``\\n`` (``"one\\r\\ntwo\\r\\n"`` pages as ``"one\\r\\ntwo\\r"``, ``"one\\rtwo\\r"`` as
    itself). The work is bounded by the lines asked for and the char budget, not by the
    file: lines past the budget are never joined.

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
        line_offset: lines of the file before ``text`` (a stream reader that skipped them;
            at most ``from_line - 1``); line numbers in and out stay the file's.

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
    start = max(1, int(from_line or 1))
    count = max(1, int(lines or default_lines))
    # A page of more than max_chars + 1 lines cannot fit (each line but the last is at least
    # its "\n"), so no more are split off, whatever ``lines`` says; the rest of the text stays
    # one element, which only tells that more lines follow.
    take = min(count, max_chars + 1)
    before = max(0, start - 1 - line_offset)  # lines of ``text`` before the page
    all_lines = file_lines(text, keep_ends=True, max_lines=before + take)
    selected = all_lines[before:before + take]
    more_remain = before + len(selected) < len(all_lines)

    included, size = 0, 0
    for line in selected:  # the longest run of whole lines within the budget (at least one)
        grown = size + len(line)
        if included and grown - line.endswith("\n") > max_chars:
            break
        included, size = included + 1, grown
    page = "".join(selected[:included])
    if page.endswith("\n"):
        page = page[:-1]
    hard_truncated = len(page) > max_chars
    if hard_truncated:
        page = page[:max_chars]
    dropped = included < len(selected)
    truncated = hard_truncated or dropped or more_remain
    next_from = start + included if truncated and not hard_truncated else None
    if truncated:
        page += _continuation_notice(next_from, suggest_read_fallback=suggest_read_fallback)
    return page, start, included, truncated, next_from
