"""The printable, lossless form of a file path whose name is not valid UTF-8 (pure functions).

A name that is not UTF-8 reaches Python as ``str`` with lone surrogates (PEP 383), which
SQLite, JSON and a terminal cannot take. Every path the builtin engine stores, cites or accepts
is written in a printable form: each undecodable byte, and each UTF-8 byte of a control
character, as ``\\xHH``; a backslash as ``\\x5c``; every other character as itself.
:func:`parse_printable_path` maps the form back to the same bytes. Source: PEP 383 and
Python's ``backslashreplace``, extended so the form is reversible.
"""

from __future__ import annotations

import os
import re

from fallback.errors import UsageError

__all__ = ["has_escapes", "parse_printable_path", "printable_path"]

# "\xHH" in the printable form: one raw byte.
_ESCAPE_RE = re.compile(r"\\x([0-9a-fA-F]{2})")
# Lone surrogates U+DC80..U+DCFF stand for the undecodable bytes 0x80..0xFF (surrogateescape).
_SURROGATE_LO, _SURROGATE_HI = 0xDC80, 0xDCFF
# The characters written as escapes: a backslash, a control (Cc) or a surrogate (Cs).
_NEEDS_ESCAPE_RE = re.compile(r"[\\\x00-\x1f\x7f-\x9f\ud800-\udfff]")


def _escape(match: re.Match[str]) -> str:
    """``\\xHH`` per byte a character stands for (a surrogate escape: its one raw byte)."""
    code = ord(match.group())
    if _SURROGATE_LO <= code <= _SURROGATE_HI:
        return f"\\x{code - 0xDC00:02x}"
    return "".join(f"\\x{b:02x}" for b in match.group().encode("utf-8", "surrogatepass"))


def printable_path(path: str) -> str:
    """The printable form of a path as the OS layer gives it (``str`` with surrogate escapes);
    unchanged when it needs no escape."""
    return _NEEDS_ESCAPE_RE.sub(_escape, path)


def has_escapes(text: str) -> bool:
    """Whether ``text`` contains a backslash (only a printable form's ``\\xHH`` may)."""
    return "\\" in text


def parse_printable_path(text: str) -> str:
    """Map a printable form back to the OS path it names: ``memory/caf\\xe9.md`` ->
    ``"memory/caf\\udce9.md"`` (``os.fsdecode`` of the bytes).

    Raises:
        UsageError: a backslash that does not start a ``\\xHH`` escape.
    """
    if "\\" not in text:
        return text
    parts = _ESCAPE_RE.split(text)  # literal, hex digits, literal, ..., literal
    if any("\\" in literal for literal in parts[::2]):
        raise UsageError(f"backslash without a \\xHH escape in path {text!r}")
    raw = bytearray()
    for i, part in enumerate(parts):
        raw += bytes([int(part, 16)]) if i % 2 else part.encode("utf-8", "surrogateescape")
    return os.fsdecode(bytes(raw))
