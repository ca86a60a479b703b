"""Markdown -> chunks with 1-based inclusive line ranges (pure functions, no I/O).

"~400 tokens with 80 overlap" is a character budget of 4 chars per token, measured with the
CJK-aware :func:`text_weight` (code points; CJK/kana/Hangul weigh 4). There is no heading
awareness: headings are ordinary lines.

Source: OpenClaw ``chunkMarkdown`` (E2 era, ``extensions/memory-core``), with these changes:

- lengths are code points, so no chunk can split a code point (the reference measured UTF-16
  units and needed surrogate guards);
- ``\\r\\n`` and lone ``\\r`` both end a line and the ``\\r`` is dropped from chunk text, so line
  numbers match what an editor shows;
- the overlap window is capped at ``min(overlap_chars, max_chars - incoming)`` (the E3 cap) and
  holds whole lines only, so a chunk never exceeds ``max_chars`` (E2 let the carried overlap
  plus the incoming line overflow the budget);
- a final line break does not open an extra empty line, so chunk line ranges never point past
  the last line that ``memory_get`` pages (the reference's last chunk ended one line later);
- chunks whose text is only whitespace are dropped here rather than at index time.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from fallback.errors import UsageError
from fallback.text.scripts import sha256_hex, text_weight

__all__ = [
    "CHARS_PER_TOKEN",
    "Chunk",
    "chunk_markdown",
    "remap_lines",
    "split_by_utf8_bytes",
    "split_lines",
    "text_weight",
    "truncate_chars",
]

# The reference budget: one token ~ 4 characters of English text.
CHARS_PER_TOKEN = 4
# Smallest chunk budget in chars, whatever ``tokens`` says (keeps tiny configs usable).
MIN_CHUNK_CHARS = 32
# Smallest byte cap split_by_utf8_bytes accepts: one UTF-8 code point is at most 4 bytes.
MIN_SPLIT_BYTES = 4

_LINE_BREAK = re.compile(r"\r\n|\r|\n")


@dataclass(frozen=True)
class Chunk:
    """One chunk of a file.

    Attributes:
        text: the chunk's lines joined by ``\\n`` (never contains ``\\r``; never blank).
        start_line: first line of the chunk, 1-based.
        end_line: last line of the chunk, 1-based inclusive (``start_line <= end_line``).
        content_hash: sha256 hex of ``text`` (UTF-8).
    """

    text: str
    start_line: int
    end_line: int
    content_hash: str


def split_lines(text: str) -> list[str]:
    """Split ``text`` into lines on ``\\r\\n``, ``\\r`` or ``\\n``, without the line breaks.

    Returns:
        The lines; a text ending in a line break yields a final empty string, as
        ``str.split("\\n")`` does, so line ``i`` (1-based) is ``result[i - 1]``.
    """
    return _LINE_BREAK.split(text)


def truncate_chars(s: str, max_chars: int) -> str:
    """Cut ``s`` to at most ``max_chars`` code points (no ellipsis; ``max_chars <= 0`` -> "")."""
    if max_chars <= 0:
        return ""
    return s[:max_chars]


def _line_segments(line: str, *, max_chars: int, tokens: int) -> list[str]:
    """Cut one line into segments: slices of ``max_chars`` code points, CJK-heavy slices
    re-cut into pieces of ``tokens`` code points (each then weighs at most ``max_chars``)."""
    if not line:
        return [""]
    segments: list[str] = []
    for start in range(0, len(line), max_chars):
        piece = line[start:start + max_chars]
        if text_weight(piece) > max_chars:
            step = max(1, tokens)
            segments.extend(piece[i:i + step] for i in range(0, len(piece), step))
        else:
            segments.append(piece)
    return segments


def _make_chunk(buffer: list[tuple[str, int]]) -> Chunk:
    text = "\n".join(seg for seg, _ in buffer)
    return Chunk(text=text, start_line=buffer[0][1], end_line=buffer[-1][1],
                 content_hash=sha256_hex(text))


def _carry_overlap(buffer: list[tuple[str, int]], *, window: int) -> tuple[list[tuple[str, int]], int]:
    """Keep the trailing whole segments of ``buffer`` whose total size (weight + 1 each) fits
    in ``window``; return them and their total size."""
    if window <= 0:
        return [], 0
    kept: list[tuple[str, int]] = []
    total = 0
    for seg, line_no in reversed(buffer):
        size = text_weight(seg) + 1
        if total + size > window:
            break
        kept.append((seg, line_no))
        total += size
    kept.reverse()
    return kept, total


# A Markdown ATX heading line: up to 3 spaces, 1-6 "#", then a space or the end of the line.
_HEADING_RE = re.compile(r"^ {0,3}#{1,6}(?:[ \t]|$)")


def chunk_markdown(text: str, *, tokens: int = 400, overlap: int = 80,
                   sections: bool = False) -> list[Chunk]:
    """Split Markdown text into overlapping chunks with line ranges.

    Args:
        text: the whole file (any of ``\\n``, ``\\r\\n``, ``\\r`` line endings).
        tokens: chunk budget in tokens; the char budget is ``max(32, tokens * 4)``.
        overlap: overlap budget in tokens; ``overlap * 4`` chars of trailing whole lines of a
            chunk are repeated at the start of the next one (capped so the next chunk still
            fits its budget; 0 disables overlap).
        sections: also start a new chunk (without overlap) at every Markdown heading line
            (``#`` to ``######`` after at most 3 spaces) once the current chunk has text, so
            each section of a curated file such as ``MEMORY.md`` is its own chunk and a hit
            cites the section, not the whole file. Sections longer than the budget are still
            cut by size. The reference (E2) has no heading awareness; qmd's own chunker and
            the reference's newer per-entry mode break at headings too.

    Returns:
        Chunks in file order. Every chunk's ``text`` weighs at most ``max(32, tokens * 4)``
        (see :func:`text_weight`) and is not blank; consecutive chunks may share lines. A long
        line yields several chunks with ``start_line == end_line``. An empty or whitespace-only
        text yields ``[]``.

    Source: OpenClaw ``chunkMarkdown`` (E2) with the changes listed in the module docstring.
    """
    max_chars = max(MIN_CHUNK_CHARS, tokens * CHARS_PER_TOKEN)
    overlap_chars = max(0, overlap * CHARS_PER_TOKEN)
    chunks: list[Chunk] = []
    buffer: list[tuple[str, int]] = []
    current = 0

    def flush() -> None:
        if buffer:
            chunk = _make_chunk(buffer)
            if chunk.text.strip():
                chunks.append(chunk)

    lines = split_lines(text)
    if len(lines) > 1 and lines[-1] == "":
        lines.pop()  # a final line break does not start a line (as in memory_get paging)
    for line_no, line in enumerate(lines, start=1):
        if sections and _HEADING_RE.match(line) and any(seg.strip() for seg, _ in buffer):
            flush()
            buffer, current = [], 0
        for segment in _line_segments(line, max_chars=max_chars, tokens=tokens):
            size = text_weight(segment) + 1
            if buffer and current + size > max_chars:
                flush()
                window = min(overlap_chars, max_chars - size)
                buffer, current = _carry_overlap(buffer, window=window)
            buffer.append((segment, line_no))
            current += size
    flush()
    return chunks


def remap_lines(chunks: list[Chunk], line_map: list[int] | None) -> list[Chunk]:
    """Translate chunk line numbers through ``line_map`` (used for session transcripts).

    Args:
        chunks: chunks whose lines index the text that was chunked (1-based).
        line_map: ``line_map[i]`` is the source line (1-based) of chunked line ``i + 1``.
            ``None`` or empty -> chunks returned unchanged.

    Returns:
        New chunks with ``start_line``/``end_line`` mapped; a line beyond the map keeps its
        number. Text and hash are unchanged. If a map is not increasing the two ends are
        ordered so that ``start_line <= end_line`` still holds.
    """
    if not line_map:
        return list(chunks)

    def mapped(line: int) -> int:
        return line_map[line - 1] if 1 <= line <= len(line_map) else line

    out: list[Chunk] = []
    for chunk in chunks:
        start, end = mapped(chunk.start_line), mapped(chunk.end_line)
        out.append(replace(chunk, start_line=min(start, end), end_line=max(start, end)))
    return out


def split_by_utf8_bytes(chunk: Chunk, max_bytes: int) -> list[Chunk]:
    """Split a chunk whose UTF-8 encoding is longer than ``max_bytes`` into byte-bounded pieces.

    Args:
        chunk: the chunk to split.
        max_bytes: cap per piece in UTF-8 bytes, >= 4 (the longest code point).

    Returns:
        ``[chunk]`` when it already fits; otherwise consecutive pieces of at most
        ``max_bytes`` bytes each, cut only between code points, each with the parent's
        ``start_line``/``end_line`` and its own ``content_hash``. Concatenating the pieces
        gives the parent text back.

    Raises:
        UsageError: ``max_bytes < 4``.

    Source: OpenClaw ``enforceEmbeddingMaxInputTokens`` (split point found by walking back
    over UTF-8 continuation bytes instead of a binary search).
    """
    if max_bytes < MIN_SPLIT_BYTES:
        raise UsageError(f"max_bytes must be >= {MIN_SPLIT_BYTES}, got {max_bytes}")
    data = chunk.text.encode("utf-8", "surrogatepass")
    if len(data) <= max_bytes:
        return [chunk]
    pieces: list[Chunk] = []
    pos = 0
    while pos < len(data):
        end = min(len(data), pos + max_bytes)
        # Walk back while the byte at the cut is a continuation byte (10xxxxxx).
        while end < len(data) and (data[end] & 0xC0) == 0x80:
            end -= 1
        text = data[pos:end].decode("utf-8", "surrogatepass")
        pieces.append(Chunk(text=text, start_line=chunk.start_line, end_line=chunk.end_line,
                            content_hash=sha256_hex(text)))
        pos = end
    return pieces
