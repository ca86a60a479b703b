"""The printable, lossless form of a file path whose name is not valid UTF-8 (pure functions).

POSIX file names are bytes; disks written by other systems hold names such as ``caf\\xe9.md``
(Latin-1) that are not UTF-8. Python hands them over as ``str`` with each undecodable byte
mapped to a lone surrogate (the ``surrogateescape`` error handler, PEP 383), and such a string
cannot be stored in SQLite, encoded as JSON or printed. Every path the builtin engine stores,
returns in a hit or accepts in ``memory_get`` is therefore written in a printable form:

- each byte that is not part of valid UTF-8 is written ``\\xHH`` (two lower-case hex digits);
- each control character (Unicode category ``Cc``: C0, DEL, C1) is written as the ``\\xHH`` of
  each of its UTF-8 bytes;
- a backslash is written ``\\x5c``, so the form has no other backslash and reading it back is
  unambiguous;
- every other character is itself (``memory/2026-01-12.md`` and ``notes/東京.md`` are
  unchanged).

:func:`parse_printable_path` maps the form back to the same bytes, so ``memory_get`` opens the
file a hit cites. Source: the idea of PEP 383's ``surrogateescape`` and of Python's
``backslashreplace`` error handler, extended to backslashes and control characters so that the
form is reversible.
"""

from __future__ import annotations

import os
import re
import unicodedata

from fallback.errors import UsageError

__all__ = ["has_escapes", "parse_printable_path", "printable_path"]

# "\xHH" in the printable form: one raw byte.
_ESCAPE_RE = re.compile(r"\\x([0-9a-fA-F]{2})")
# Lone surrogates U+DC80..U+DCFF stand for the undecodable bytes 0x80..0xFF (surrogateescape).
_SURROGATE_LO, _SURROGATE_HI = 0xDC80, 0xDCFF
# Any character _needs_escape accepts: a backslash, category Cc (U+0000..U+001F and
# U+007F..U+009F) or Cs (U+D800..U+DFFF); one search instead of a lookup per character.
_NEEDS_ESCAPE_RE = re.compile(r"[\\\x00-\x1f\x7f-\x9f\ud800-\udfff]")


def _needs_escape(ch: str) -> bool:
    return ch == "\\" or unicodedata.category(ch) in ("Cc", "Cs")


def printable_path(path: str) -> str:
    """The printable form of a path as the OS layer gives it (``str`` with surrogate escapes).

    Args:
        path: a path or file name as ``os.listdir``/``os.scandir`` return it (undecodable
            bytes as lone surrogates ``U+DC80..U+DCFF``).

    Returns:
        The same text with undecodable bytes, control characters and backslashes written
        ``\\xHH`` (see the module docstring); a path with none of them is returned unchanged.
    """
    if _NEEDS_ESCAPE_RE.search(path) is None:
        return path
    out: list[str] = []
    for ch in path:
        code = ord(ch)
        if _SURROGATE_LO <= code <= _SURROGATE_HI:
            out.append(f"\\x{code - 0xDC00:02x}")
        elif _needs_escape(ch):
            data = ch.encode("utf-8", "surrogatepass")
            out.append("".join(f"\\x{b:02x}" for b in data))
        else:
            out.append(ch)
    return "".join(out)


def has_escapes(text: str) -> bool:
    """Whether ``text`` contains a backslash (only a printable form's ``\\xHH`` may)."""
    return "\\" in text


def parse_printable_path(text: str) -> str:
    """Map a printable form back to the OS path it names (``str`` with surrogate escapes).

    Args:
        text: a path in the printable form (any ``\\xHH``, upper- or lower-case hex).

    Returns:
        The path to hand to ``os`` functions: the bytes the form describes, decoded with
        ``os.fsdecode`` (so ``memory/caf\\xe9.md`` gives ``"memory/caf\\udce9.md"``, which
        opens the file whose name is the bytes ``caf\\xe9.md``). Text without a backslash is
        returned unchanged.

    Raises:
        UsageError: a backslash that does not start a ``\\xHH`` escape.
    """
    if "\\" not in text:
        return text
    raw = bytearray()
    pos = 0
    for match in _ESCAPE_RE.finditer(text):
        literal = text[pos:match.start()]
        if "\\" in literal:
            raise UsageError(f"backslash without a \\xHH escape in path {text!r}")
        raw += literal.encode("utf-8", "surrogateescape")
        raw.append(int(match.group(1), 16))
        pos = match.end()
    tail = text[pos:]
    if "\\" in tail:
        raise UsageError(f"backslash without a \\xHH escape in path {text!r}")
    raw += tail.encode("utf-8", "surrogateescape")
    return os.fsdecode(bytes(raw))
