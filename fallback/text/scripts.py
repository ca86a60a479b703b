"""Small text helpers shared by chunking, keyword extraction, MMR and file access; the one script classifier.

Everything here is pure (no I/O) and counts lengths in code points. Which characters are CJK,
and which CJK script each belongs to, is decided only here, from Unicode's script properties
(through the ``regex`` package), never from code-point tables. The patterns are compiled on
first use: text below :data:`CJK_FLOOR` (all ASCII) is decided without them, so a one-shot
search of an ASCII query never loads ``regex``.
"""

from __future__ import annotations

import functools
import unicodedata
from collections.abc import Iterator
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    import regex

__all__ = [
    "CJK_FLOOR",
    "CJK_SCRIPTS",
    "CJK_WEIGHT",
    "Script",
    "contains_cjk",
    "narrow_fullwidth",
    "script_of",
    "sha256_hex",
    "text_weight",
    "word_runs",
    "word_stretches",
]

# A CJK/kana/Hangul character carries about as much meaning as a 4-char English word piece,
# i.e. roughly one token, so the chunk budget (4 chars per token) weighs it 4.
CJK_WEIGHT = 4

# The scripts written without spaces between words, whose characters weigh CJK_WEIGHT.
CJK_SCRIPTS = ("Han", "Hiragana", "Katakana", "Hangul", "Bopomofo", "Yi")

# A character is CJK when its Unicode Script_Extensions name one of CJK_SCRIPTS and not Latin:
# extensions rather than Script, so the punctuation and marks these scripts share (、。「」 ー)
# count too; not Latin, so a middle dot or a combining dot below in Latin text does not.
_CJK_PROPERTIES = "[[" + "".join(rf"\p{{scx={name}}}" for name in CJK_SCRIPTS) + r"]--\p{scx=Latin}]"
# The lowest code point with those properties (U+02EA, a Bopomofo tone mark). Testing this
# range first lets Latin text skip the property lookups (measured: docs/benchmarks.md).
CJK_FLOOR = "\u02ea"
_CJK_SET = rf"[[^\x00-{chr(ord(CJK_FLOOR) - 1)}]&&{_CJK_PROPERTIES}]"
# Kana as the keyword extractor splits it: katakana plus the marks only the two kana share
# (the prolonged sound mark ー, ｰ, the voicing marks), which live inside katakana words.
_KATAKANA_SET = r"[\p{sc=Katakana}[\p{scx=Katakana}&&\p{scx=Hiragana}--\p{scx=Han}]]"
_WORD_SET = r"[\p{L}\p{M}\p{N}_]"

# A CJK stretch or an other-word stretch of a word run; combining marks stay with the stretch
# they follow.
_CJK_WORD = f"[{_CJK_SET}&&{_WORD_SET}]"
_OTHER_WORD = f"[{_WORD_SET}--{_CJK_SET}]"
_PATTERNS = {
    # Counting whole runs is faster than matching character by character (chunking weighs
    # every line of every file; see scripts/bench_text.py); a search for one character stops
    # sooner.
    "cjk_run": _CJK_SET + "+",
    "cjk": _CJK_SET,
    # First match wins: the Script property decides a letter; the CJK set takes the rest.
    "script": (r"(?P<han>\p{sc=Han})|(?P<hiragana>\p{sc=Hiragana})|(?P<katakana>" + _KATAKANA_SET
               + r")|(?P<hangul>\p{sc=Hangul})|(?P<cjk>" + _CJK_SET + ")"),
    "stretch": (rf"(?P<cjk>{_CJK_WORD}(?:{_CJK_WORD}|\p{{M}})*)"
                rf"|(?P<other>{_OTHER_WORD}(?:{_OTHER_WORD}|\p{{M}})*)"),
}


@functools.cache
def _pattern(name: str) -> regex.Pattern[str]:
    """One of :data:`_PATTERNS`, compiled (``regex`` V1 syntax) on first use."""
    import regex

    return regex.compile(_PATTERNS[name], regex.V1)


Script = Literal["han", "hiragana", "katakana", "hangul", "cjk", "other"]


def script_of(ch: str) -> Script:
    """Classify one character for the CJK-aware helpers.

    Returns:
        ``han`` (Script=Han: ideographs, ``々``, ``〇``, radicals), ``hiragana``, ``katakana``
        (Script=Katakana, halfwidth forms, and the marks only the two kana share such as the
        prolonged sound mark ``ー``), ``hangul`` (syllables and jamo), ``cjk`` (any other CJK
        character: Bopomofo, Yi, and the punctuation these scripts share such as ``、。「」``),
        or ``other``.

    Source: Unicode Script and Script_Extensions properties (UAX #24), via ``regex``.
    """
    if ch < CJK_FLOOR:  # no character of these scripts lies below it
        return "other"
    m = _pattern("script").match(ch)
    return m.lastgroup if m is not None else "other"  # type: ignore[return-value]


def text_weight(s: str) -> int:
    """Estimate the size of ``s`` in "chars" for chunk budgets.

    Args:
        s: any text.

    Returns:
        The number of code points, where each CJK character counts :data:`CJK_WEIGHT` (4)
        instead of 1. A character is CJK when its Unicode Script_Extensions include Han,
        Hiragana, Katakana, Hangul, Bopomofo or Yi and not Latin (:func:`script_of` is not
        ``other``). An empty string weighs 0.

    Source: OpenClaw ``estimateStringChars`` (E2), measured in code points instead of UTF-16
    units, with the CJK set taken from Unicode's script properties instead of its code-point
    ranges: the same for ideographs, kana, Hangul syllables and CJK punctuation; Hangul jamo,
    halfwidth kana and Hangul, and Extensions G+ weigh 4 too, while Lisu, CJK strokes,
    hexagrams and squared Latin abbreviations (``㎡``) weigh 1.
    """
    if s.isascii():
        return len(s)
    return len(s) + (CJK_WEIGHT - 1) * sum(map(len, _pattern("cjk_run").findall(s)))


def contains_cjk(text: str) -> bool:
    """Whether ``text`` contains a CJK character (as :func:`text_weight` counts them)."""
    return not text.isascii() and _pattern("cjk").search(text) is not None


def word_stretches(text: str) -> Iterator[tuple[str, bool]]:
    """The word runs of ``text`` (letters, marks, digits, ``_``) cut where CJK starts or stops.

    Yields ``(stretch, is_cjk)`` in order; a combining mark stays with the stretch it follows.
    ``"2026年度 plan"`` -> ``("2026", False), ("年度", True), ("plan", False)``. No
    normalisation: callers NFC-normalise (and lower-case) first.
    """
    for m in _pattern("stretch").finditer(text):
        yield m.group(), m.lastgroup == "cjk"


def sha256_hex(data: str | bytes) -> str:
    """Return the lower-case hex SHA-256 of ``data`` (a str is encoded as UTF-8 first;
    lone surrogates are encoded with ``surrogatepass`` so hashing never raises)."""
    import hashlib  # here: the one-shot search path hashes nothing and skips loading OpenSSL

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


# Full-width ASCII forms (U+FF01-U+FF5E) sit this far above the characters they stand for.
_FULLWIDTH_SHIFT = 0xFEE0


def narrow_fullwidth(text: str) -> str:
    """``text`` with its full-width ASCII forms (U+FF01-U+FF5E: ``ｒｏｕｔｅｒ``, ``ＡＰＩ``,
    ``２０２６``, typed with an input method left in full-width mode) as the ASCII characters
    they stand for; every other character as it is (not NFKC: ligatures, superscripts and
    half-width kana stay)."""
    if text.isascii():
        return text
    return "".join(chr(ord(ch) - _FULLWIDTH_SHIFT) if "\uff01" <= ch <= "\uff5e" else ch
                   for ch in text)
