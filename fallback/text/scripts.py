"""Small text helpers shared by chunking, keyword extraction and file access.

Everything here is pure (no I/O) and counts lengths in code points.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata

__all__ = [
    "CJK_WEIGHT",
    "contains_cjk",
    "is_cjk_wide",
    "is_hangul",
    "is_hiragana",
    "is_ideograph",
    "is_katakana",
    "sha256_hex",
    "text_weight",
]

# A CJK/kana/Hangul character carries about as much meaning as a 4-char English word piece,
# i.e. roughly one token, so the chunk budget (4 chars per token) weighs it 4.
CJK_WEIGHT = 4

# Code-point ranges weighed as CJK by the reference estimator (spec §3): CJK radicals through
# unified ideographs (incl. kana and bopomofo), Yi, Hangul syllables, compatibility
# ideographs, and the supplementary ideograph planes (Extension B onwards).
_CJK_RANGES: tuple[tuple[int, int], ...] = (
    (0x2E80, 0x9FFF),
    (0xA000, 0xA4FF),
    (0xAC00, 0xD7AF),
    (0xF900, 0xFAFF),
    (0x20000, 0x2FA1F),
)

# The same ranges as one character class: counting with a regex is ~50x faster than a Python
# loop over code points, and chunking weighs every line of every file.
_CJK_RE = re.compile("[" + "".join(f"{chr(lo)}-{chr(hi)}" for lo, hi in _CJK_RANGES) + "]")


def is_cjk_wide(ch: str) -> bool:
    """Return True when the one-character string ``ch`` weighs :data:`CJK_WEIGHT` in chunk budgets.

    Covers U+2E80–U+9FFF, U+A000–U+A4FF, U+AC00–U+D7AF, U+F900–U+FAFF and U+20000–U+2FA1F
    (spec §3 ``weight``).
    """
    cp = ord(ch)
    return any(lo <= cp <= hi for lo, hi in _CJK_RANGES)


def text_weight(s: str) -> int:
    """Estimate the size of ``s`` in "chars" for chunk budgets.

    Args:
        s: any text.

    Returns:
        The number of code points, where each CJK ideograph, kana or Hangul syllable
        (see :func:`is_cjk_wide`) counts :data:`CJK_WEIGHT` (4) instead of 1. An empty string
        weighs 0.

    Source: OpenClaw ``estimateStringChars`` (E2), measured in code points instead of UTF-16
    units, so an Extension-B ideograph weighs 4 like any other ideograph.
    """
    if s.isascii():
        return len(s)
    return len(s) + (CJK_WEIGHT - 1) * len(_CJK_RE.findall(s))


def is_hiragana(ch: str) -> bool:
    """Return True for a hiragana character (U+3040–U+309F)."""
    return "\u3040" <= ch <= "\u309f"


def is_katakana(ch: str) -> bool:
    """Return True for katakana (U+30A0–U+30FF, incl. the long-vowel mark ``ー``) or
    halfwidth/phonetic-extension katakana (U+31F0–U+31FF, U+FF66–U+FF9F)."""
    return "\u30a0" <= ch <= "\u30ff" or "\u31f0" <= ch <= "\u31ff" or "\uff66" <= ch <= "\uff9f"


def is_ideograph(ch: str) -> bool:
    """Return True for a CJK ideograph: unified (incl. Extension A), compatibility, or the
    supplementary ideograph planes (U+20000–U+3134F)."""
    cp = ord(ch)
    return (
        0x4E00 <= cp <= 0x9FFF
        or 0x3400 <= cp <= 0x4DBF
        or 0xF900 <= cp <= 0xFAFF
        or 0x20000 <= cp <= 0x3134F
        or cp == 0x3005  # 々 iteration mark, part of Japanese kanji words
    )


def is_hangul(ch: str) -> bool:
    """Return True for a Hangul syllable (U+AC00–U+D7AF) or Hangul jamo (U+1100–U+11FF,
    U+3130–U+318F)."""
    cp = ord(ch)
    return 0xAC00 <= cp <= 0xD7AF or 0x1100 <= cp <= 0x11FF or 0x3130 <= cp <= 0x318F


def sha256_hex(data: str | bytes) -> str:
    """Return the lower-case hex SHA-256 of ``data`` (a str is encoded as UTF-8 first;
    lone surrogates are encoded with ``surrogatepass`` so hashing never raises)."""
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogatepass")
    return hashlib.sha256(data).hexdigest()


def word_runs(text: str) -> list[str]:
    """The NFC runs of ``[\\p{L}\\p{M}\\p{N}_]+`` in ``text`` (letters, marks, digits and ``_``),
    in order, duplicates kept: the tokens of FTS queries, keyword extraction and MMR."""
    out: list[str] = []
    current: list[str] = []
    for ch in unicodedata.normalize("NFC", text):
        if ch == "_" or unicodedata.category(ch)[0] in "LMN":
            current.append(ch)
        elif current:
            out.append("".join(current))
            current = []
    if current:
        out.append("".join(current))
    return out


# CJK, kana and Hangul code point ranges (inclusive), as the chunker's weight estimator uses.
_CJK_TEXT_RANGES = (
    (0x1100, 0x11FF),    # Hangul Jamo
    (0x2E80, 0x9FFF),    # CJK radicals .. kana .. CJK unified ideographs
    (0xA000, 0xA4FF),    # Yi
    (0xA960, 0xA97F),    # Hangul Jamo extended-A
    (0xAC00, 0xD7AF),    # Hangul syllables
    (0xF900, 0xFAFF),    # CJK compatibility ideographs
    (0xFF66, 0xFF9F),    # halfwidth katakana
    (0x20000, 0x2FA1F),  # CJK extensions B.. and compatibility supplement
)


def _is_cjk(ch: str) -> bool:
    cp = ord(ch)
    return any(lo <= cp <= hi for lo, hi in _CJK_TEXT_RANGES)


_CJK_CLASS_RE = re.compile("[" + "".join(f"{chr(lo)}-{chr(hi)}" for lo, hi in _CJK_TEXT_RANGES) + "]")


def contains_cjk(text: str) -> bool:
    """Whether ``text`` contains a CJK ideograph, kana or Hangul character."""
    return not text.isascii() and _CJK_CLASS_RE.search(text) is not None
