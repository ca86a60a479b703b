"""Markdown -> chunks with 1-based inclusive line ranges (pure functions, no I/O).

The token budget is 4 chars per token, measured with the CJK-aware :func:`text_weight`.

Source: OpenClaw ``chunkMarkdown`` (E2), changed so that lengths are code points and a long
line is cut after its last word that fits, on grapheme-cluster boundaries (UAX #29); ``\\r\\n``
and a lone ``\\r`` end a line too; the overlap holds whole lines and is capped so a chunk never
exceeds its budget (the E3 cap); a final line break opens no extra line; blank chunks are dropped.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import operator
import re
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from fallback.errors import UsageError
from fallback.text.scripts import sha256_hex, text_weight

if TYPE_CHECKING:
    import regex

__all__ = ["CHUNKING_VERSION", "Chunk", "chunk_markdown", "file_lines", "grapheme_ends", "remap_lines",
           "split_by_utf8_bytes", "split_lines", "text_weight", "truncate_chars", "word_start"]

# The reference budget: one token ~ 4 characters of English text.
CHARS_PER_TOKEN = 4
# Version of the rules below: an index chunked by other rules is rebuilt (fallback/index/identity.py).
CHUNKING_VERSION = 2
# Smallest chunk budget in chars, whatever ``tokens`` says (keeps tiny configs usable).
MIN_CHUNK_CHARS = 32
# Smallest byte cap split_by_utf8_bytes accepts: one UTF-8 code point is at most 4 bytes.
MIN_SPLIT_BYTES = 4

_LINE_BREAK = re.compile(r"\r\n|\r|\n")
_LINE_BREAK_KEPT = re.compile(r"(\r\n|\r|\n)")


@functools.cache
def _grapheme_re() -> regex.Pattern[str]:
    """One extended grapheme cluster (UAX #29), compiled on first use."""
    import regex

    return regex.compile(r"\X")


@dataclass(frozen=True)
class Chunk:
    """One chunk of a file.

    Attributes:
        text: the chunk's lines joined by ``\\n`` (no ``\\r``; never blank).
        start_line / end_line: 1-based inclusive line range.
        content_hash: sha256 hex of ``text`` (UTF-8).
    """

    text: str
    start_line: int
    end_line: int
    content_hash: str


def split_lines(text: str, *, keep_ends: bool = False, max_lines: int | None = None) -> list[str]:
    """Split ``text`` into lines: the one rule of what a line is (a line ends at ``\\r\\n``,
    ``\\n`` or a lone ``\\r``).

    Args:
        text: any text.
        keep_ends: keep each line's break at its end, so ``"".join(result) == text``.
        max_lines: split off at most this many lines; the rest stays whole as one more
            element. ``None``: all.

    Returns:
        The lines; a final line break yields a final empty string, as ``str.split`` does.
    """
    splits = 0 if max_lines is None else max(0, max_lines) or -1
    if splits < 0:
        return [text]
    if not keep_ends:
        return _LINE_BREAK.split(text, maxsplit=splits)
    parts = _LINE_BREAK_KEPT.split(text, maxsplit=splits)  # line, break, ..., line, break, rest
    return [*map(operator.add, parts[0:-1:2], parts[1::2]), parts[-1]]


def file_lines(text: str, *, keep_ends: bool = False, max_lines: int | None = None) -> list[str]:
    """A file's numbered lines: :func:`split_lines` without the empty string after a final
    line break, so line ``i`` (1-based) is ``result[i - 1]``."""
    lines = split_lines(text, keep_ends=keep_ends, max_lines=max_lines) if text else []
    if lines and lines[-1] == "":
        lines.pop()
    return lines


def grapheme_ends(text: str) -> list[int]:
    """Code-point offsets where the extended grapheme clusters of ``text`` end, ascending
    (an emoji family, a flag, a letter with its combining marks is one cluster).

    Source: Unicode UAX #29, as the ``regex`` package's ``\\X`` matches it.
    """
    return [m.end() for m in _grapheme_re().finditer(text)]


# Characters a long line (or a text of lines) is preferably cut after (whitespace: no token
# spans them).
_WORD_BREAKS = (" ", "\t", "\u3000", "\n")
# Text up to its last character that is no part of a word.
_TO_LAST_NON_WORD = re.compile(r".*\W", re.DOTALL)


def _word_cut(text: str, start: int, end: int) -> int | None:
    """The offset in ``(start, end]`` where ``text[start:]`` best ends without cutting a word
    (after whitespace, else after punctuation); ``None`` when ``text[start:end]`` is one word."""
    if end >= len(text) or text[end] in _WORD_BREAKS:
        return end
    cut = max(text.rfind(sep, start, end) for sep in _WORD_BREAKS)
    if cut > start:
        return cut + 1
    last = _TO_LAST_NON_WORD.match(text, start, end)
    return last.end() if last is not None else None


def _pieces(text: str, size: int, *, at_words: bool = False) -> list[str]:
    """``text`` cut into pieces of at most ``size`` code points on grapheme boundaries (with
    ``at_words``, after a word when one fits)."""
    total = len(text)
    if total <= size:
        return [text]
    # Every ASCII code point is its own grapheme here (a line holds no "\r\n").
    ends = None if text.isascii() else grapheme_ends(text)
    out: list[str] = []
    start = 0
    while start < total:
        limit = start + size
        if limit >= total:
            out.append(text[start:])
            break
        end = limit
        if ends is not None:
            i = bisect.bisect_right(ends, limit) - 1
            end = ends[i] if i >= 0 and ends[i] > start else limit
        if at_words:
            word = _word_cut(text, start, end)
            if word is not None and (ends is None or _is_boundary(ends, word)):
                end = word
        out.append(text[start:end])
        start = end
    return out


def _is_boundary(ends: list[int], offset: int) -> bool:
    i = bisect.bisect_left(ends, offset)
    return i < len(ends) and ends[i] == offset


def truncate_chars(s: str, max_chars: int, *, at_words: bool = False) -> str:
    """Cut ``s`` to at most ``max_chars`` code points on a grapheme-cluster boundary (no
    ellipsis; ``max_chars <= 0`` -> ""); with ``at_words``, after its last word that fits
    (as a long line is chunked), the whitespace (or line break) before the cut dropped."""
    if max_chars <= 0:
        return ""
    if len(s) <= max_chars:
        return s
    cut = _pieces(s, max_chars, at_words=at_words)[0]
    return (cut.rstrip() or cut) if at_words else cut


_WORD_CHAR = re.compile(r"\w")
_NON_WORD_CHAR = re.compile(r"\W")


def word_start(text: str, start: int, end: int) -> int:
    """Where ``text[start:]`` best begins without cutting a word, the mirror of how a long
    line's chunks end: ``start`` unless a word spans it, else just after the first whitespace
    in ``text[start:end]``, else after its first punctuation; ``start`` when that span is one
    word or the offset found is inside a grapheme cluster.

    Args:
        text: one line.
        start / end: code point offsets, ``start <= end``.

    Returns:
        An offset in ``[start, end]``.
    """
    if start <= 0 or start >= len(text) or not (
            _WORD_CHAR.match(text, start - 1) and _WORD_CHAR.match(text, start)):
        return max(0, start)
    cut = min((i for i in (text.find(sep, start, end) for sep in _WORD_BREAKS) if i >= 0), default=-1)
    if cut < 0 and (punct := _NON_WORD_CHAR.search(text, start, end)) is not None:
        cut = punct.start()
    if cut < 0 or not (text.isascii() or _is_boundary(grapheme_ends(text), cut + 1)):
        return start
    return cut + 1


def _line_segments(line: str, *, max_chars: int, tokens: int) -> list[str]:
    """Cut one line into segments weighing at most ``max_chars`` (CJK-heavy ones re-cut into
    ``tokens`` code points), after a word when one fits."""
    if len(line) <= max_chars and text_weight(line) <= max_chars:
        return [line]
    segments: list[str] = []
    for piece in _pieces(line, max_chars, at_words=True):
        if text_weight(piece) > max_chars:
            segments.extend(_pieces(piece, max(1, tokens), at_words=True))
        else:
            segments.append(piece)
    return segments


def _carry_overlap(buffer: list[tuple[str, int]], *, window: int) -> tuple[list[tuple[str, int]], int]:
    """The trailing whole segments of ``buffer`` that fit in ``window``, and their size."""
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
        overlap: overlap budget in tokens: trailing whole lines of a chunk repeated at the
            start of the next (0 disables overlap).
        sections: also start a new chunk (without overlap) at every Markdown ATX heading
            once the current chunk has text, so a hit cites its section.

    Returns:
        Chunks in file order, each weighing at most the char budget and not blank; a long
        line yields several chunks with ``start_line == end_line``.

    Source: OpenClaw ``chunkMarkdown`` (E2) with the changes listed in the module docstring.
    """
    max_chars = max(MIN_CHUNK_CHARS, tokens * CHARS_PER_TOKEN)
    overlap_chars = max(0, overlap * CHARS_PER_TOKEN)
    chunks: list[Chunk] = []
    buffer: list[tuple[str, int]] = []
    current = 0

    def flush() -> None:
        text = "\n".join(seg for seg, _ in buffer)
        if text.strip():  # an empty buffer joins to ""
            chunks.append(Chunk(text=text, start_line=buffer[0][1], end_line=buffer[-1][1],
                                content_hash=sha256_hex(text)))

    for line_no, line in enumerate(file_lines(text), start=1):
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
    """Translate chunk line numbers through ``line_map`` (``line_map[i]``: the source line of
    chunked line ``i + 1``; empty: unchanged); a line beyond the map keeps its number and the
    ends stay ordered."""
    if not line_map:
        return list(chunks)

    def mapped(line: int) -> int:
        return line_map[line - 1] if 1 <= line <= len(line_map) else line

    return [replace(c, start_line=min(ends), end_line=max(ends))
            for c in chunks for ends in [(mapped(c.start_line), mapped(c.end_line))]]


def split_by_utf8_bytes(chunk: Chunk, max_bytes: int) -> list[Chunk]:
    """Split a chunk whose UTF-8 encoding is longer than ``max_bytes`` into byte-bounded pieces.

    Args:
        chunk: the chunk to split.
        max_bytes: cap per piece in UTF-8 bytes, >= 4 (the longest code point).

    Returns:
        ``[chunk]`` when it fits; else consecutive pieces cut between grapheme clusters (or
        code points inside one too long), with the parent's lines and their own hashes.

    Raises:
        UsageError: ``max_bytes < 4``.

    Source: OpenClaw ``enforceEmbeddingMaxInputTokens``.
    """
    if max_bytes < MIN_SPLIT_BYTES:
        raise UsageError(f"max_bytes must be >= {MIN_SPLIT_BYTES}, got {max_bytes}")
    data = chunk.text.encode("utf-8", "surrogatepass")
    if len(data) <= max_bytes:
        return [chunk]
    # Byte offsets of the grapheme boundaries: cuts snap back to the last one that fits.
    bounds = list(itertools.accumulate(len(chunk.text[a:b].encode("utf-8", "surrogatepass"))
                                       for a, b in itertools.pairwise([0, *grapheme_ends(chunk.text)])))
    pieces: list[Chunk] = []
    pos = 0
    while pos < len(data):
        end = min(len(data), pos + max_bytes)
        i = bisect.bisect_right(bounds, end) - 1
        if end < len(data) and i >= 0 and bounds[i] > pos:
            end = bounds[i]
        else:
            # One grapheme longer than the cap: walk back to a code point boundary
            # (while the byte at the cut is a continuation byte, 10xxxxxx).
            while end < len(data) and (data[end] & 0xC0) == 0x80:
                end -= 1
        text = data[pos:end].decode("utf-8", "surrogatepass")
        pieces.append(Chunk(text=text, start_line=chunk.start_line, end_line=chunk.end_line,
                            content_hash=sha256_hex(text)))
        pos = end
    return pieces
